package store

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// sdkKeyRE is the check E2B's SDKs apply to an API key before sending it;
// keyRE is the exact format CreateKey promises.
var (
	sdkKeyRE = regexp.MustCompile(`^e2b_[0-9a-f]+$`)
	keyRE    = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)
)

func TestCreateKeyFormat(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		tn := mustTenant(t, s, "acme")
		seen := map[string]bool{}
		for range 20 {
			key, info, err := s.CreateKey(t.Context(), tn)
			if err != nil {
				t.Fatal(err)
			}
			if !keyRE.MatchString(key) || !sdkKeyRE.MatchString(key) {
				t.Errorf("CreateKey() = %q; want a match for %s", key, keyRE)
			}
			if seen[key] || seen[info.ID] {
				t.Errorf("CreateKey() repeated key %q or id %q", key, info.ID)
			}
			seen[key], seen[info.ID] = true, true
			if !strings.HasPrefix(key, info.Prefix) || len(info.Prefix) != len("e2b_")+6 {
				t.Errorf("KeyInfo.Prefix = %q; want the first 10 characters of %q", info.Prefix, key)
			}
			if info.Tenant != tn || info.Revoked() || info.CreatedAt.IsZero() {
				t.Errorf("CreateKey() info = %+v", info)
			}
		}
	})
}

func TestKeyNotStoredInPlaintext(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		tn := mustTenant(t, s, "acme")
		key, _, err := s.CreateKey(t.Context(), tn)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		err = s.r.QueryRow(`SELECT COUNT(*) FROM api_keys WHERE CAST(hash AS TEXT) LIKE ? OR prefix = ?`,
			"%"+key[4:]+"%", key).Scan(&n)
		if err != nil || n != 0 {
			t.Errorf("rows holding the plaintext key = %d, %v; want 0", n, err)
		}
	})
}

func TestLookupKey(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		a, b := mustTenant(t, s, "a"), mustTenant(t, s, "b")
		keyA, _, err := s.CreateKey(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		keyB, infoB, err := s.CreateKey(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		keyB2, _, err := s.CreateKey(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.RevokeKey(ctx, infoB.ID); err != nil {
			t.Fatal(err)
		}

		tests := []struct {
			name    string
			key     string
			want    string
			wantErr error
		}{
			{"tenant a", keyA, "a", nil},
			{"tenant b second key", keyB2, "b", nil},
			{"revoked", keyB, "", ErrNotFound},
			{"unknown", "e2b_" + strings.Repeat("0", 40), "", ErrNotFound},
			{"empty", "", "", ErrNotFound},
			{"no prefix", keyA[4:], "", ErrNotFound},
			{"upper case", strings.ToUpper(keyA), "", ErrNotFound},
			{"upper case hex", "e2b_" + strings.ToUpper(keyA[4:]), "", ErrNotFound},
			{"truncated", keyA[:len(keyA)-1], "", ErrNotFound},
			{"extended", keyA + "0", "", ErrNotFound},
			{"trailing space", keyA + " ", "", ErrNotFound},
			{"bearer prefix", "Bearer " + keyA, "", ErrNotFound},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got, err := s.LookupKey(ctx, tt.key)
				if string(got) != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
					t.Errorf("LookupKey(%q) = %q, %v; want %q, %v", tt.key, got, err, tt.want, tt.wantErr)
				}
				if err != nil && tt.key != "" && strings.Contains(err.Error(), tt.key) {
					t.Errorf("LookupKey error %q contains the key", err)
				}
			})
		}
	})
}

func TestRevokeKey(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")
		key, info, err := s.CreateKey(ctx, tn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.LookupKey(ctx, key); err != nil {
			t.Fatalf("LookupKey() before revoke = %v", err)
		}
		revoked, err := s.RevokeKey(ctx, info.ID)
		if err != nil || !revoked.Revoked() {
			t.Fatalf("RevokeKey() = %+v, %v; want a revoked key", revoked, err)
		}
		if _, err := s.LookupKey(ctx, key); !errors.Is(err, ErrNotFound) {
			t.Errorf("LookupKey() after revoke = %v; want ErrNotFound", err)
		}
		again, err := s.RevokeKey(ctx, info.ID)
		if err != nil || !again.RevokedAt.Equal(revoked.RevokedAt) {
			t.Errorf("RevokeKey() twice = %+v, %v; want the first revocation kept", again, err)
		}
		if _, err := s.RevokeKey(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("RevokeKey(nope) = %v; want ErrNotFound", err)
		}
		keys, err := s.ListKeys(ctx, tn)
		if err != nil || len(keys) != 1 || keys[0].ID != info.ID || !keys[0].Revoked() {
			t.Errorf("ListKeys() = %+v, %v; want the one revoked key", keys, err)
		}
	})
}

func TestListKeys(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		a, b := mustTenant(t, s, "a"), mustTenant(t, s, "b")
		var want []string
		for range 3 {
			_, info, err := s.CreateKey(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, info.ID)
		}
		if _, _, err := s.CreateKey(ctx, b); err != nil {
			t.Fatal(err)
		}
		keys, err := s.ListKeys(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, k := range keys {
			got = append(got, k.ID)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("ListKeys(a) = %v; want %v", got, want)
		}
		if _, err := s.ListKeys(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
			t.Errorf("ListKeys(nobody) = %v; want ErrNotFound", err)
		}
	})
}

func TestCreateKeyUnknownTenant(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		if _, _, err := s.CreateKey(t.Context(), "nobody"); !errors.Is(err, ErrNotFound) {
			t.Errorf("CreateKey(nobody) = %v; want ErrNotFound", err)
		}
	})
}

func FuzzWellFormedKey(f *testing.F) {
	f.Add("e2b_" + strings.Repeat("a", 40))
	f.Add("e2b_" + strings.Repeat("A", 40))
	f.Add("")
	f.Fuzz(func(t *testing.T, key string) {
		if got, want := wellFormedKey(key), keyRE.MatchString(key); got != want {
			t.Errorf("wellFormedKey(%q) = %v; want %v", key, got, want)
		}
	})
}
