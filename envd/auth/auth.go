// Package auth owns envd's access token: who may call envd once /init has set
// one, and the v1 signatures that let a pre-signed /files URL stand in for it.
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"strconv"
	"sync"
	"time"
)

// Header carries the access token on envd requests.
const Header = "X-Access-Token"

// Operations named in a signature.
const (
	OpRead  = "read"
	OpWrite = "write"
)

// Errors a caller branches on. Their texts are E2B's envd's, word for word:
// /files answers them as the message of its 401, and the SDKs' tests compare it.
var (
	ErrMissingSignature = errors.New("missing signature query parameter")
	ErrBadSignature     = errors.New("invalid signature")
	ErrExpiredSignature = errors.New("signature is already expired")
)

// Token is the sandbox's access token; the zero value is unset (no auth).
type Token struct {
	mu    sync.RWMutex
	value string
}

// Set replaces the token; an empty string clears it.
func (t *Token) Set(v string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.value = v
}

// IsSet reports whether requests must authenticate.
func (t *Token) IsSet() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.value != ""
}

// Equal compares v with the token in constant time. It is false when no
// token is set.
func (t *Token) Equal(v string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.value == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(t.value), []byte(v)) == 1
}

func (t *Token) get() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.value
}

// Sign returns the signature E2B's SDKs compute for a pre-signed /files URL:
// "v1_" + unpadded base64 of SHA-256 over "path:op:user:token[:expiration]".
// expiration is unix seconds, or 0 for none.
func Sign(path, op, user, token string, expiration int64) string {
	s := path + ":" + op + ":" + user + ":" + token
	if expiration != 0 {
		s += ":" + strconv.FormatInt(expiration, 10)
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// VerifySignature checks a /files signature against the current token.
// expiration is the raw `signature_expiration` query value ("" for none).
func (t *Token) VerifySignature(signature, path, op, user, expiration string, now time.Time) error {
	if signature == "" {
		return ErrMissingSignature
	}
	token := t.get()
	if token == "" {
		return ErrBadSignature
	}
	var exp int64
	if expiration != "" {
		var err error
		exp, err = strconv.ParseInt(expiration, 10, 64)
		if err != nil || exp <= 0 {
			return ErrBadSignature
		}
	}
	want := Sign(path, op, user, token, exp)
	if subtle.ConstantTimeCompare([]byte(want), []byte(signature)) != 1 {
		return ErrBadSignature
	}
	if exp != 0 && now.Unix() > exp {
		return ErrExpiredSignature
	}
	return nil
}
