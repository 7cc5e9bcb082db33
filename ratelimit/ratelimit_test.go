package ratelimit

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestLimiterBucket(t *testing.T) {
	type step struct {
		after      time.Duration // advance the clock first
		allowed    bool
		remaining  int
		retryAfter time.Duration
		lim        *Limit // change the limit from this step on
		anyRetry   bool   // do not check retryAfter
	}
	tests := []struct {
		name  string
		lim   Limit
		steps []step
	}{
		{"burst then refusals", Limit{Rate: 1, Burst: 3}, []step{
			{allowed: true, remaining: 2},
			{allowed: true, remaining: 1},
			{allowed: true, remaining: 0},
			{allowed: false, remaining: 0, retryAfter: time.Second},
			{after: 500 * time.Millisecond, allowed: false, retryAfter: 500 * time.Millisecond},
			{after: 500 * time.Millisecond, allowed: true, remaining: 0},
			{after: 10 * time.Second, allowed: true, remaining: 2}, // refilled to burst, not beyond
		}},
		{"refusals do not push out the next slot", Limit{Rate: 2, Burst: 1}, []step{
			{allowed: true},
			{allowed: false, retryAfter: 500 * time.Millisecond},
			{allowed: false, retryAfter: 500 * time.Millisecond},
			{allowed: false, retryAfter: 500 * time.Millisecond},
			{after: 500 * time.Millisecond, allowed: true},
		}},
		{"zero burst is one", Limit{Rate: 1, Burst: 0}, []step{
			{allowed: true},
			{allowed: false, retryAfter: time.Second},
		}},
		{"unlimited", Limit{Rate: 0, Burst: 0}, []step{
			{allowed: true}, {allowed: true}, {allowed: true},
		}},
		{"raised limit applies at once", Limit{Rate: 0.1, Burst: 1}, []step{
			{allowed: true},
			{allowed: false, retryAfter: 10 * time.Second},
			// The new rate refills from the change on: 10/s gives a token
			// 100 ms later, not 10 s.
			{lim: &Limit{Rate: 10, Burst: 5}, after: 100 * time.Millisecond, allowed: false, anyRetry: true},
			{after: 100 * time.Millisecond, allowed: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Unix(1_000_000, 0)}
			l := New(time.Minute, clk.now)
			lim := tt.lim
			for i, s := range tt.steps {
				clk.advance(s.after)
				if s.lim != nil {
					lim = *s.lim
				}
				d := l.Allow("k", lim)
				if d.Allowed != s.allowed {
					t.Fatalf("step %d: allowed = %v, want %v", i, d.Allowed, s.allowed)
				}
				if d.Remaining != s.remaining {
					t.Errorf("step %d: remaining = %d, want %d", i, d.Remaining, s.remaining)
				}
				if !s.anyRetry && d.RetryAfter != s.retryAfter {
					t.Errorf("step %d: retry after = %v, want %v", i, d.RetryAfter, s.retryAfter)
				}
			}
		})
	}
}

func TestLimiterReset(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	l := New(time.Minute, clk.now)
	lim := Limit{Rate: 2, Burst: 4}
	for range 4 {
		l.Allow("k", lim)
	}
	d := l.Allow("k", lim)
	if got, want := d.Reset, 2*time.Second; got != want {
		t.Errorf("reset = %v, want %v (4 tokens at 2/s)", got, want)
	}
}

func TestLimiterKeysAreIndependent(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	l := New(time.Minute, clk.now)
	lim := Limit{Rate: 1, Burst: 1}
	if !l.Allow("a", lim).Allowed || l.Allow("a", lim).Allowed {
		t.Fatal("a: want one allowed, then refused")
	}
	if !l.Allow("b", lim).Allowed {
		t.Fatal("b refused because of a")
	}
}

func TestLimiterEvictsIdleBuckets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New(time.Minute, nil) // time.Now is the bubble's fake clock
		lim := Limit{Rate: 1, Burst: 2}
		l.Allow("a", lim)
		l.Allow("a", lim)
		l.Allow("b", lim)
		if got := l.Len(); got != 2 {
			t.Fatalf("buckets = %d, want 2", got)
		}
		time.Sleep(30 * time.Second)
		l.Allow("b", lim) // b stays active
		time.Sleep(45 * time.Second)
		l.Allow("c", lim) // sweeps: a idle 75 s and refilled; b idle 45 s
		if got := l.Len(); got != 2 {
			t.Fatalf("buckets after sweep = %d, want 2 (b and c)", got)
		}
		// An evicted bucket comes back full: eviction forgets nothing.
		if d := l.Allow("a", lim); !d.Allowed || d.Remaining != 1 {
			t.Fatalf("a after eviction: %+v", d)
		}
	})
}

func TestPolicy(t *testing.T) {
	p := Policy{
		Defaults: map[tenant.Class]Limit{tenant.Create: {Rate: 5, Burst: 10}, tenant.Lifecycle: {Rate: 20, Burst: 40}, tenant.Read: {Rate: 50, Burst: 100},
			tenant.DataPlane: {Rate: 200, Burst: 400}},
		Settings: func(t tenant.ID) tenant.Settings {
			if t == "slow" {
				return tenant.Settings{Limits: map[tenant.Class]tenant.Limit{tenant.Create: {Rate: tenant.Of(0.5), Burst: tenant.Of(7)}}}
			}
			return tenant.Settings{}
		},
	}
	tests := []struct {
		t    tenant.ID
		c    tenant.Class
		want Limit
	}{
		{"slow", tenant.Create, Limit{Rate: 0.5, Burst: 7}},
		{"slow", tenant.Read, Limit{Rate: 50, Burst: 100}},
		{"other", tenant.Create, Limit{Rate: 5, Burst: 10}},
		{"other", tenant.Lifecycle, Limit{Rate: 20, Burst: 40}},
		{"slow", tenant.DataPlane, Limit{Rate: 200, Burst: 400}}, // create settings do not apply
	}
	for _, tt := range tests {
		if got := p.Limit(tt.t, tt.c); got != tt.want {
			t.Errorf("Limit(%s, %s) = %+v, want %+v", tt.t, tt.c, got, tt.want)
		}
	}
}

// TestPolicyClassOverrides: every class reads its own tenant override, rate
// and burst each falling back to the server default on their own, and one
// class's override never leaks into another.
func TestPolicyClassOverrides(t *testing.T) {
	f, n := tenant.Of[float64], tenant.Of[int]
	one := func(c tenant.Class, l tenant.Limit) tenant.Settings {
		return tenant.Settings{Limits: map[tenant.Class]tenant.Limit{c: l}}
	}
	defaults := map[tenant.Class]Limit{tenant.Create: {Rate: 5, Burst: 10}, tenant.Lifecycle: {Rate: 20, Burst: 40},
		tenant.Read: {Rate: 50, Burst: 100}, tenant.DataPlane: {Rate: 200, Burst: 400}}
	tests := []struct {
		name string
		set  tenant.Settings
		c    tenant.Class
		want Limit
	}{
		{"create default", tenant.Settings{}, tenant.Create, Limit{5, 10}},
		{"create override", one(tenant.Create, tenant.Limit{Rate: f(1), Burst: n(2)}), tenant.Create, Limit{1, 2}},
		{"lifecycle default", tenant.Settings{}, tenant.Lifecycle, Limit{20, 40}},
		{"lifecycle override", one(tenant.Lifecycle, tenant.Limit{Rate: f(3), Burst: n(4)}), tenant.Lifecycle, Limit{3, 4}},
		{"lifecycle rate only", one(tenant.Lifecycle, tenant.Limit{Rate: f(3)}), tenant.Lifecycle, Limit{3, 40}},
		{"read default", tenant.Settings{}, tenant.Read, Limit{50, 100}},
		{"read override", one(tenant.Read, tenant.Limit{Rate: f(0.5), Burst: n(1)}), tenant.Read, Limit{0.5, 1}},
		{"read burst only", one(tenant.Read, tenant.Limit{Burst: n(7)}), tenant.Read, Limit{50, 7}},
		{"read override zero rate: unlimited", one(tenant.Read, tenant.Limit{Rate: f(0)}), tenant.Read, Limit{0, 100}},
		{"dataplane default", tenant.Settings{}, tenant.DataPlane, Limit{200, 400}},
		{"dataplane override", one(tenant.DataPlane, tenant.Limit{Rate: f(9), Burst: n(8)}), tenant.DataPlane, Limit{9, 8}},
		{"read override leaves lifecycle", one(tenant.Read, tenant.Limit{Rate: f(1), Burst: n(1)}), tenant.Lifecycle, Limit{20, 40}},
		{"lifecycle override leaves dataplane", one(tenant.Lifecycle, tenant.Limit{Rate: f(1)}), tenant.DataPlane, Limit{200, 400}},
		{"dataplane override leaves create", one(tenant.DataPlane, tenant.Limit{Rate: f(1)}), tenant.Create, Limit{5, 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Policy{Defaults: defaults, Settings: func(id tenant.ID) tenant.Settings {
				if id == "custom" {
					return tt.set
				}
				return tenant.Settings{}
			}}
			if got := p.Limit("custom", tt.c); got != tt.want {
				t.Errorf("Limit(custom, %s) = %+v, want %+v", tt.c, got, tt.want)
			}
			if got := p.Limit("other", tt.c); got != defaults[tt.c] {
				t.Errorf("Limit(other, %s) = %+v, want the default %+v", tt.c, got, defaults[tt.c])
			}
		})
	}
}

// TestTenantsDataPlaneIsOwnBucket: a tenant's data-plane bucket is apart
// from its API classes, and no data-plane default means no limit.
func TestTenantsDataPlaneIsOwnBucket(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	ts := &Tenants{Limiter: New(time.Minute, clk.now), Policy: Policy{
		Defaults: map[tenant.Class]Limit{tenant.Read: {Rate: 1, Burst: 1}, tenant.DataPlane: {Rate: 1, Burst: 1}},
	}}
	if !ts.Allow("a", tenant.Read).Allowed || !ts.Allow("a", tenant.DataPlane).Allowed {
		t.Fatal("first read and first data-plane request: want both allowed")
	}
	if ts.Allow("a", tenant.DataPlane).Allowed || !ts.Allow("b", tenant.DataPlane).Allowed {
		t.Fatal("want a's second data-plane request refused, b's first allowed")
	}
	off := &Tenants{Limiter: New(time.Minute, clk.now), Policy: Policy{Defaults: map[tenant.Class]Limit{tenant.Read: {Rate: 1, Burst: 1}}}}
	for range 10 {
		if d := off.Allow("a", tenant.DataPlane); !d.Allowed || !d.Limit.Unlimited() {
			t.Fatalf("no data-plane default: %+v; want unlimited", d)
		}
	}
}

func TestTenantsPickUpSettings(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	var cur tenant.Settings
	ts := &Tenants{Limiter: New(time.Minute, clk.now), Policy: Policy{
		Defaults: map[tenant.Class]Limit{tenant.Create: {Rate: 1, Burst: 1}},
		Settings: func(tenant.ID) tenant.Settings { return cur },
	}}
	if !ts.Allow("a", tenant.Create).Allowed || ts.Allow("a", tenant.Create).Allowed {
		t.Fatal("default 1/s burst 1: want allowed then refused")
	}
	// As if `tenants set a --create-burst 3` was polled in.
	cur = tenant.Settings{Limits: map[tenant.Class]tenant.Limit{tenant.Create: {Burst: tenant.Of(3)}}}
	clk.advance(time.Second)
	allowed := 0
	for range 5 {
		if ts.Allow("a", tenant.Create).Allowed {
			allowed++
		}
	}
	// SetBurstAt keeps the tokens the bucket had (1 after a second), so the
	// new burst shows once the bucket has refilled.
	if allowed < 1 {
		t.Fatalf("allowed = %d after the change", allowed)
	}
	clk.advance(10 * time.Second)
	allowed = 0
	for range 5 {
		if ts.Allow("a", tenant.Create).Allowed {
			allowed++
		}
	}
	if allowed != 3 {
		t.Fatalf("allowed = %d after refill, want the new burst 3", allowed)
	}
}
