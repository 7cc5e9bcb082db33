package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/server/native"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// nativeStore is what native auth needs of the store.
type nativeStore interface {
	keyLookup
	EnsureTenant(ctx context.Context, name string) (store.Tenant, error)
}

// nativeAuthenticate accepts a JWT (Authorization: Bearer) or an API key
// (X-API-KEY, or a bearer that is not a JWT), puts the tenant into the
// context and the granted scopes beside it. API keys grant every scope.
// Anything else is 401. A JWT's tenant is created on first sight: with an
// identity provider, the tokens are where tenants come from.
func nativeAuthenticate(st nativeStore, jwt *jwtauth.Verifier, log *slog.Logger) func(http.Handler) http.Handler {
	var known sync.Map // tenant.ID -> struct{}: exists in the store
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cred := apiKey(r)
			if cred == "" {
				native.WriteError(w, r, log, errdefs.New(errdefs.ErrUnauthenticated,
					"missing credentials: send Authorization: Bearer <token or API key>"))
				return
			}
			var (
				t      tenant.ID
				scopes []string
			)
			if looksLikeJWT(cred) && r.Header.Get("X-API-KEY") == "" {
				c, err := jwt.Verify(cred)
				if err != nil {
					native.WriteError(w, r, log, errdefs.New(errdefs.ErrUnauthenticated, err.Error()))
					return
				}
				t, scopes = tenant.ID(c.Tenant), c.Scopes
				if _, ok := known.Load(t); !ok {
					if _, err := st.EnsureTenant(r.Context(), c.Tenant); err != nil {
						if errors.Is(err, errdefs.ErrInvalidArgument) {
							err = errdefs.New(errdefs.ErrUnauthenticated, "token sub is not a valid tenant name")
						}
						native.WriteError(w, r, log, err)
						return
					}
					known.Store(t, struct{}{})
				}
			} else {
				var err error
				t, err = st.LookupKey(r.Context(), cred)
				if err != nil {
					if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalidArgument) {
						native.WriteError(w, r, log, err)
						return
					}
					native.WriteError(w, r, log, errdefs.New(errdefs.ErrUnauthenticated, "invalid API key"))
					return
				}
				scopes = []string{jwtauth.ScopeRead, jwtauth.ScopeWrite}
			}
			reportTenant(r.Context(), t)
			ctx := tenant.WithContext(r.Context(), t)
			ctx = native.WithScopes(ctx, scopes)
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// looksLikeJWT tells a compact JWS (three base64url parts, a JSON header)
// from an API key.
func looksLikeJWT(s string) bool {
	return strings.HasPrefix(s, "eyJ") && strings.Count(s, ".") == 2
}

// requireScope answers 403 unless the caller was granted scope.
func requireScope(scope string, log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if native.HasScope(r.Context(), scope) {
				next.ServeHTTP(w, r)
				return
			}
			native.WriteError(w, r, log, errdefs.New(errdefs.ErrPermissionDenied, "missing scope "+scope))
		})
	}
}
