// Package audit is what the egress refusals' audit lines share: the name
// filter's (a name or destination its rules refuse) and the kernel's
// address rules' (read from the packet log), so that both read alike and
// neither can flood the log.
package audit

import (
	"log/slog"
	"time"

	"golang.org/x/time/rate"
)

// Audit lines are rate-limited so that a sandbox trying a million
// destinations can fill neither the log nor memory: the same key is
// logged once per Dedupe, and all lines of a Limiter share a token bucket.
const (
	Dedupe  = 10 * time.Second
	MaxKeys = 4096
	Rate    = 10
	Burst   = 20
)

// Limiter decides which refusals get a line. Its zero value is ready; it
// is not safe for concurrent use (its owner's lock guards it).
type Limiter struct {
	bucket *rate.Limiter
	seen   map[string]time.Time
}

// Allow reports whether to log a denial of key now.
func (a *Limiter) Allow(now time.Time, key string) bool {
	if a.bucket == nil {
		a.bucket = rate.NewLimiter(Rate, Burst)
		a.seen = map[string]time.Time{}
	}
	if t, ok := a.seen[key]; ok && now.Sub(t) < Dedupe {
		return false
	}
	if len(a.seen) >= MaxKeys {
		for k, t := range a.seen {
			if now.Sub(t) >= Dedupe {
				delete(a.seen, k)
			}
		}
		if len(a.seen) >= MaxKeys {
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

// Keys is how many keys a keeps (for tests of its memory bound).
func (a *Limiter) Keys() int { return len(a.seen) }

// Denied writes the audit line of a refusal: dst is the destination
// (address:port, or a name for DNS), host the name asked for ("" where
// none was), proto what was refused (tcp, udp, http, tls, dns, ...).
func Denied(log *slog.Logger, sandboxID, dst, host, proto, reason string) {
	log.Info("egress denied", "audit", true, "sandbox_id", sandboxID,
		"dst", dst, "host", host, "proto", proto, "decision", "denied", "reason", reason)
}
