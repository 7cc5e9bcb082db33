package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/tenant"
)

// keyLookup maps an API key to its tenant; the store implements it.
type keyLookup interface {
	LookupKey(ctx context.Context, plaintext string) (tenant.ID, error)
}

// apiKey extracts the credential E2B's SDKs send: X-API-KEY, or a bearer
// token users add through apiHeaders.
func apiKey(r *http.Request) string {
	if k := r.Header.Get("X-API-KEY"); k != "" {
		return k
	}
	if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "bearer") {
		return strings.TrimSpace(tok)
	}
	return ""
}

// authenticate puts the caller's tenant into the request context or answers
// 401 with E2B's body. The store finds keys by their SHA-256 and compares in
// constant time, so timing says nothing about a key.
func authenticate(keys keyLookup, log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := apiKey(r)
			if key == "" {
				httpx.WriteErrorStatus(w, http.StatusUnauthorized, "missing API key: set X-API-KEY (E2B_API_KEY)")
				return
			}
			t, err := keys.LookupKey(r.Context(), key)
			if err != nil {
				if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalidArgument) {
					httpx.WriteError(w, r, log, err)
					return
				}
				httpx.WriteErrorStatus(w, http.StatusUnauthorized, "invalid API key")
				return
			}
			reportTenant(r.Context(), t)
			next.ServeHTTP(w, r.WithContext(tenant.WithContext(r.Context(), t)))
		})
	}
}
