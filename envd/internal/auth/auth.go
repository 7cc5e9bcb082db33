// Package auth holds envd's access token: who may call envd once /init has
// set one, and whether a pre-signed /files URL stands in for it (the
// signature itself is wire contract, in envdapi).
package auth

import (
	"crypto/subtle"
	"sync"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
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

// VerifySignature checks a /files signature against the current token
// (envdapi.VerifySignature).
func (t *Token) VerifySignature(signature, path, op, user, expiration string, now time.Time) error {
	return envdapi.VerifySignature(signature, path, op, user, t.get(), expiration, now)
}
