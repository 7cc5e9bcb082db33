package mcp

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/server/native"
	"github.com/sandboxd/sandboxd/tenant"
)

// withTokenInfo hands the tenant and scopes that the server's auth put in
// the request's context to the SDK as an auth.TokenInfo: its streamable
// handler passes that to each request's handlers (RequestExtra.TokenInfo,
// read by identify) and binds a session to the UserID that opened it, so
// another tenant's credential cannot ride a session whose id it learned
// (403). The SDK takes a TokenInfo only from auth.RequireBearerToken, which
// wants an Authorization: Bearer header: a request that authenticated with
// X-API-KEY alone gets that key as its bearer here; the verifier never reads
// the token, the server's auth has checked it.
func withTokenInfo(next http.Handler) http.Handler {
	verify := func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
		t, ok := tenant.FromContext(ctx)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		var scopes []string
		for _, s := range []string{jwtauth.ScopeRead, jwtauth.ScopeWrite} {
			if native.HasScope(ctx, s) {
				scopes = append(scopes, s)
			}
		}
		// The SDK wants an expiry and checks it at once; the credential's
		// own was checked by the server's auth.
		return &auth.TokenInfo{UserID: string(t), Scopes: scopes, Expiration: time.Now().Add(time.Minute)}, nil
	}
	h := auth.RequireBearerToken(verify, nil)(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " "); !strings.EqualFold(scheme, "bearer") {
			if key := r.Header.Get("X-API-KEY"); key != "" {
				r = r.Clone(r.Context())
				r.Header.Set("Authorization", "Bearer "+key)
			}
		}
		h.ServeHTTP(w, r)
	})
}
