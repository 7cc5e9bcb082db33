package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

const (
	// KeyPrefix starts every API key; E2B's SDKs check keys against
	// ^e2b_[0-9a-f]+$ before sending them.
	KeyPrefix = "e2b_"
	// keyHexLen is the number of lowercase hex digits after KeyPrefix:
	// 20 random bytes, 160 bits.
	keyHexLen = 40
	// displayHexLen is how many of those digits KeyInfo.Prefix shows. The
	// 136 bits left hidden keep the shown part useless to an attacker.
	displayHexLen = 6
)

// KeyInfo describes an API key without its secret.
type KeyInfo struct {
	ID        string
	Tenant    tenant.ID
	Prefix    string // e.g. "e2b_1a2b3c", for telling keys apart in listings
	CreatedAt time.Time
	RevokedAt time.Time // zero while the key is live
}

// Revoked reports whether the key has been revoked.
func (k KeyInfo) Revoked() bool { return !k.RevokedAt.IsZero() }

// wellFormedKey reports whether key has the exact shape CreateKey mints.
func wellFormedKey(key string) bool {
	if len(key) != len(KeyPrefix)+keyHexLen || key[:len(KeyPrefix)] != KeyPrefix {
		return false
	}
	for _, c := range []byte(key[len(KeyPrefix):]) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// hashKey returns the SHA-256 of key. A slow password hash (bcrypt, argon2)
// is for low-entropy secrets people choose; these keys are 160 random bits,
// beyond brute force, so a fast hash is as safe and keeps the lookup, done
// on every authenticated request, cheap.
func hashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// randomHex returns n random bytes from crypto/rand, hex encoded.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never returns an error; crashes the program if the OS has no randomness
	return hex.EncodeToString(b)
}

const keyCols = `id, tenant_id, prefix, created_at, revoked_at`

func scanKey(row rowScanner) (KeyInfo, error) {
	var (
		k       KeyInfo
		created int64
		revoked sql.NullInt64
	)
	if err := row.Scan(&k.ID, &k.Tenant, &k.Prefix, &created, &revoked); err != nil {
		return KeyInfo{}, err
	}
	k.CreatedAt, k.RevokedAt = fromUnixNano(created), nullTime(revoked)
	return k, nil
}

// CreateKey mints an API key for tenant t: KeyPrefix and 40 lowercase hex
// digits. It returns the plaintext, which is not stored and cannot be
// recovered later, and the key's description. An unknown tenant is
// ErrNotFound.
func (s *Store) CreateKey(ctx context.Context, t tenant.ID) (string, KeyInfo, error) {
	key := KeyPrefix + randomHex(keyHexLen/2)
	k := KeyInfo{
		ID:        randomHex(8),
		Tenant:    t,
		Prefix:    key[:len(KeyPrefix)+displayHexLen],
		CreatedAt: time.Now().UTC(),
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		if ok, err := s.tenantExists(ctx, tx, t); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("tenant %s: %w", t, ErrNotFound)
		}
		_, err := tx.ExecContext(ctx,
			`INSERT INTO api_keys (id, tenant_id, hash, prefix, created_at) VALUES (?, ?, ?, ?, ?)`,
			k.ID, t, hashKey(key), k.Prefix, unixNano(k.CreatedAt))
		return err
	})
	if err != nil {
		return "", KeyInfo{}, fmt.Errorf("create key: %w", err)
	}
	return key, k, nil
}

// LookupKey returns the tenant owning the live key plaintext. A malformed,
// unknown or revoked key is ErrNotFound; the error never contains the key.
//
// The row is found by the key's hash, so how long the search takes depends
// on the hash, not on how much of the secret an attacker guessed right; the
// found hash is still compared in constant time.
func (s *Store) LookupKey(ctx context.Context, plaintext string) (tenant.ID, error) {
	if !wellFormedKey(plaintext) {
		return "", fmt.Errorf("lookup key: %w", ErrNotFound)
	}
	want := hashKey(plaintext)
	var (
		t   tenant.ID
		got []byte
	)
	err := s.stmts.lookupKey.QueryRowContext(ctx, want).Scan(&t, &got)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("lookup key: %w", ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("lookup key: %w", err)
	}
	if subtle.ConstantTimeCompare(got, want) != 1 {
		return "", fmt.Errorf("lookup key: %w", ErrNotFound)
	}
	return t, nil
}

// ListKeys returns tenant t's keys, revoked ones included, oldest first. An
// unknown tenant is ErrNotFound.
func (s *Store) ListKeys(ctx context.Context, t tenant.ID) ([]KeyInfo, error) {
	if _, err := s.GetTenant(ctx, t); err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	rows, err := s.r.QueryContext(ctx,
		`SELECT `+keyCols+` FROM api_keys WHERE tenant_id = ? ORDER BY created_at, id`, t)
	if err != nil {
		return nil, fmt.Errorf("list keys of %s: %w", t, err)
	}
	defer rows.Close()
	var ks []KeyInfo
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list keys of %s: %w", t, err)
		}
		ks = append(ks, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list keys of %s: %w", t, err)
	}
	return ks, nil
}

// RevokeKey revokes the key with the given ID; from then on LookupKey fails
// for it. Revoking a revoked key does nothing; an unknown ID is ErrNotFound.
func (s *Store) RevokeKey(ctx context.Context, id string) (KeyInfo, error) {
	var k KeyInfo
	err := s.write(ctx, func(tx *sql.Tx) error {
		var err error
		k, err = scanKey(tx.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil || k.Revoked() {
			return err
		}
		k.RevokedAt = time.Now().UTC()
		_, err = tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ?`, unixNano(k.RevokedAt), id)
		return err
	})
	if err != nil {
		return KeyInfo{}, fmt.Errorf("revoke key %s: %w", id, err)
	}
	return k, nil
}
