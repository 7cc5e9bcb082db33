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
	"github.com/sandboxd/sandboxd/volume"
)

// volumeContentID returns the volume of a /volumecontent/{id}/... request,
// under E2BPrefix or at the root.
func volumeContentID(r *http.Request) (string, bool) {
	rest, ok := strings.CutPrefix(strings.TrimPrefix(r.URL.Path, E2BPrefix), "/volumecontent/")
	if !ok {
		return "", false
	}
	id, _, _ := strings.Cut(rest, "/")
	return id, id != ""
}

// unlessRawBody applies mw (the JSON body check) to every request but the
// volume content routes' raw bodies: a file upload is octet-stream, of any
// size the volume holds. Their PATCH is JSON and checked.
func unlessRawBody(mw func(http.Handler) http.Handler) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		checked := mw(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := volumeContentID(r); ok && r.Method != http.MethodPatch {
				next.ServeHTTP(w, r)
				return
			}
			checked.ServeHTTP(w, r)
		})
	}
}

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
	return bearer(r)
}

// bearer is an Authorization: Bearer credential (a volume's token).
func bearer(r *http.Request) string {
	if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "bearer") {
		return strings.TrimSpace(tok)
	}
	return ""
}

// authenticate puts the caller's tenant into the request context or answers
// 401 with E2B's body. The store finds keys by their SHA-256 and compares in
// constant time, so timing says nothing about a key.
//
// The volume content routes take a volume's token instead (vols checks it):
// the request then carries the volume's tenant and, for the handler, which
// volume the token opened.
func authenticate(keys keyLookup, vols *volume.Service, log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id, ok := volumeContentID(r); ok {
				v, err := vols.Authenticate(r.Context(), id, bearer(r))
				if err != nil {
					httpx.WriteError(w, r, log, err)
					return
				}
				reportTenant(r.Context(), v.Tenant)
				ctx := volume.WithAuthorized(tenant.WithContext(r.Context(), v.Tenant), v.ID)
				next.ServeHTTP(w, r.WithContext(ctx))
				return
			}
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
