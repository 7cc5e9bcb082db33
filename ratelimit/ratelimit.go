// Package ratelimit holds sandboxd's token buckets: one per key (a tenant
// and route class, or a client address), built on golang.org/x/time/rate.
// The limit of a key is looked up on every call, so a changed tenant setting
// applies to the next request without a restart; buckets idle long enough to
// have refilled are evicted, so memory follows active keys only.
//
// A rate limit is not a quota: it bounds how fast a tenant may ask, while
// package sandbox bounds how much it may hold (live sandboxes, memory).
package ratelimit

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limit is a token bucket's shape: Rate tokens per second, up to Burst. A
// Rate of zero or less means no limit. A positive Rate with a Burst below 1
// is treated as Burst 1 (a bucket of 0 would refuse everything forever).
type Limit struct {
	Rate  float64
	Burst int
}

// Unlimited reports whether l lets everything through.
func (l Limit) Unlimited() bool { return l.Rate <= 0 || math.IsInf(l.Rate, 1) }

func (l Limit) burst() int { return max(l.Burst, 1) }

// Decision is the outcome of one Allow, with what the X-RateLimit-* and
// Retry-After headers report.
type Decision struct {
	Allowed bool
	// Limit is the limit that applied; Unlimited() when none did.
	Limit Limit
	// Remaining is how many more requests the bucket would take right now.
	Remaining int
	// RetryAfter is how long until one request would be let through
	// (zero when Allowed).
	RetryAfter time.Duration
	// Reset is how long until the bucket is full again.
	Reset time.Duration
}

// Limiter is a set of token buckets by key. It is safe for concurrent use.
type Limiter struct {
	idle time.Duration
	now  func() time.Time

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	lim      *rate.Limiter
	shape    Limit
	lastSeen time.Time
}

// New returns a Limiter that evicts a bucket once it has been idle for idle
// and has refilled (so evicting it forgets nothing). now is the clock; nil
// means time.Now.
func New(idle time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	if idle <= 0 {
		idle = 10 * time.Minute
	}
	return &Limiter{idle: idle, now: now, buckets: map[string]*bucket{}}
}

// Allow takes one token from key's bucket, shaped by lim. It never waits: a
// request that would have to wait is refused, and its reservation is given
// back so refusals do not push later requests further out.
func (l *Limiter) Allow(key string, lim Limit) Decision {
	if lim.Unlimited() {
		return Decision{Allowed: true, Limit: lim}
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b := l.buckets[key]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(rate.Limit(lim.Rate), lim.burst()), shape: lim}
		// rate.NewLimiter starts full as of its first use.
		l.buckets[key] = b
	} else if b.shape != lim {
		b.lim.SetLimitAt(now, rate.Limit(lim.Rate))
		b.lim.SetBurstAt(now, lim.burst())
		b.shape = lim
	}
	b.lastSeen = now
	d := Decision{Limit: lim}
	r := b.lim.ReserveN(now, 1)
	if delay := r.DelayFrom(now); !r.OK() || delay > 0 {
		r.CancelAt(now)
		d.RetryAfter = delay
		if !r.OK() || delay == rate.InfDuration {
			d.RetryAfter = time.Minute
		}
	} else {
		d.Allowed = true
	}
	tokens := b.lim.TokensAt(now)
	d.Remaining = max(int(math.Floor(tokens)), 0)
	if missing := float64(lim.burst()) - tokens; missing > 0 {
		d.Reset = time.Duration(missing / lim.Rate * float64(time.Second))
	}
	return d
}

// sweep evicts idle, refilled buckets, at most once per idle/2.
func (l *Limiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < l.idle/2 {
		return
	}
	l.lastSweep = now
	for k, b := range l.buckets {
		if now.Sub(b.lastSeen) >= l.idle && b.lim.TokensAt(now) >= float64(b.lim.Burst()) {
			delete(l.buckets, k)
		}
	}
}

// Len is the number of buckets held, for tests and metrics.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
