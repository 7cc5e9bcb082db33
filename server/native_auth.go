package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/tenant"
)

type scopesKey struct{}

// nativeAuthenticate accepts a JWT (Authorization: Bearer) or an API key
// (X-API-KEY, or a bearer that is not a JWT), puts the tenant into the
// context and the granted scopes beside it. API keys grant every scope.
// Anything else is 401.
func nativeAuthenticate(keys keyLookup, jwt *jwtauth.Verifier, log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cred := apiKey(r)
			if cred == "" {
				writeNativeError(w, r, log, errdefs.New(errdefs.ErrUnauthenticated,
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
					writeNativeError(w, r, log, errdefs.New(errdefs.ErrUnauthenticated, err.Error()))
					return
				}
				t, scopes = tenant.ID(c.Tenant), c.Scopes
			} else {
				var err error
				t, err = keys.LookupKey(r.Context(), cred)
				if err != nil {
					if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalidArgument) {
						writeNativeError(w, r, log, err)
						return
					}
					writeNativeError(w, r, log, errdefs.New(errdefs.ErrUnauthenticated, "invalid API key"))
					return
				}
				scopes = []string{jwtauth.ScopeRead, jwtauth.ScopeWrite}
			}
			reportTenant(r.Context(), t)
			ctx := tenant.WithContext(r.Context(), t)
			ctx = context.WithValue(ctx, scopesKey{}, scopes)
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
			granted, _ := r.Context().Value(scopesKey{}).([]string)
			for _, s := range granted {
				if s == scope {
					next.ServeHTTP(w, r)
					return
				}
			}
			writeNativeError(w, r, log, errdefs.New(errdefs.ErrPermissionDenied, "missing scope "+scope))
		})
	}
}
