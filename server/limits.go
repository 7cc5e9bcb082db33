package server

import (
	"net"
	"net/http"
	"strings"

	"github.com/sandboxd/sandboxd/ratelimit"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/tenant"
)

// routeClass sorts an E2B API request into its rate-limit class: creating
// or waking a sandbox (create, resume, connect, fork) is "create", any other
// non-GET is "lifecycle", GET and HEAD are "read".
func routeClass(r *http.Request) tenant.Class {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return tenant.Read
	case http.MethodPost:
		p := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, E2BPrefix), "/")
		if p == "/sandboxes" || p == "/v2/sandboxes" || p == NativePrefix ||
			strings.HasSuffix(p, "/connect") || strings.HasSuffix(p, "/resume") || strings.HasSuffix(p, "/fork") {
			return tenant.Create
		}
	}
	return tenant.Lifecycle
}

// limitTenants is the per-tenant limiter: it runs after authenticate (it
// keys on the tenant in ctx). Over the limit it answers 429 with E2B's body,
// Retry-After and X-RateLimit-*; within it, it sets X-RateLimit-* and
// passes on.
// refuser writes a 429 in the error shape of its surface.
type refuser func(w http.ResponseWriter, r *http.Request, msg string)

// refuseE2B answers with E2B's body.
func refuseE2B(w http.ResponseWriter, _ *http.Request, msg string) {
	httpx.WriteErrorStatus(w, http.StatusTooManyRequests, msg)
}

func limitTenants(l *ratelimit.Tenants, lm *limitMetrics, refuse refuser) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if l == nil {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t, _ := tenant.FromContext(r.Context())
			c := routeClass(r)
			d := l.Allow(t, c)
			if d.Limit.Unlimited() {
				next.ServeHTTP(w, r)
				return
			}
			retry := httpx.LimitHeaders(w, d)
			if !d.Allowed {
				lm.rejected(string(t), string(c))
				refuse(w, r, httpx.LimitMessage(d, string(c), retry))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// limitIPs is the cheap per-client-address limiter in front of auth, so a
// flood of bad keys cannot keep the key lookups busy.
func limitIPs(l *ratelimit.Limiter, lim ratelimit.Limit, lm *limitMetrics) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if l == nil || lim.Unlimited() {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			host, _, err := net.SplitHostPort(r.RemoteAddr)
			if err != nil {
				host = r.RemoteAddr
			}
			d := l.Allow("ip/"+host, lim)
			if !d.Allowed {
				answerLimit(w, d, "ip")
				lm.rejected("", "ip")
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// answerLimit sets the X-RateLimit-* headers of d and, when d refuses,
// answers 429 and reports false.
//
//	X-RateLimit-Limit      the bucket size (requests allowed at once)
//	X-RateLimit-Remaining  requests the bucket takes right now
//	X-RateLimit-Reset      Unix time (seconds) at which the bucket is full
//	Retry-After            seconds until one request would pass (>= 1)
func answerLimit(w http.ResponseWriter, d ratelimit.Decision, class string) bool {
	if d.Limit.Unlimited() {
		return true
	}
	retry := httpx.LimitHeaders(w, d)
	if d.Allowed {
		return true
	}
	httpx.WriteErrorStatus(w, http.StatusTooManyRequests, httpx.LimitMessage(d, class, retry))
	return false
}
