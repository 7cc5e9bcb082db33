package domainfilter

import (
	"time"

	"golang.org/x/time/rate"
)

// Audit lines are rate-limited per sandbox so that a sandbox trying a
// million destinations can fill neither the log nor memory: the same
// (destination, host) is logged once per auditDedupe, and all lines share
// a token bucket.
const (
	auditDedupe  = 10 * time.Second
	auditMaxKeys = 4096
	auditRate    = 10
	auditBurst   = 20
)

type auditLimiter struct {
	bucket *rate.Limiter
	seen   map[string]time.Time
}

// allow reports whether to log a denial of key now; the caller holds the
// filter's lock.
func (a *auditLimiter) allow(now time.Time, key string) bool {
	if a.bucket == nil {
		a.bucket = rate.NewLimiter(auditRate, auditBurst)
		a.seen = map[string]time.Time{}
	}
	if t, ok := a.seen[key]; ok && now.Sub(t) < auditDedupe {
		return false
	}
	if len(a.seen) >= auditMaxKeys {
		for k, t := range a.seen {
			if now.Sub(t) >= auditDedupe {
				delete(a.seen, k)
			}
		}
		if len(a.seen) >= auditMaxKeys {
			// Full of recent keys: the bucket is the bound now, and
			// lines may repeat for a key that could not be kept.
			return a.bucket.AllowN(now, 1)
		}
	}
	if !a.bucket.AllowN(now, 1) {
		return false
	}
	a.seen[key] = now
	return true
}
