package server

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/ratelimit"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/proxy"
	"github.com/sandboxd/sandboxd/tenant"
)

// fakeClock is a settable clock for the limiter.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestProxyDataPlaneLimit: the data plane is limited per tenant owning the
// sandbox (requests carry no API key): over the limit it answers 429 in the
// proxy's JSON shape with Retry-After; another tenant is not affected; the
// bucket refills with time; an unknown sandbox is the dial's 502.
func TestProxyDataPlaneLimit(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	limits := &ratelimit.Tenants{
		Limiter: ratelimit.New(time.Hour, clock.now),
		Policy: ratelimit.Policy{Defaults: map[tenant.Class]ratelimit.Limit{
			tenant.DataPlane: {Rate: 0.5, Burst: 2},
		}},
	}
	e := newFakeEnv(t, func(c *Config) { c.Limits = limits })
	ctx := context.Background()
	if _, err := e.st.EnsureTenant(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	a1, err := e.mgr.Create(tenant.WithContext(ctx, "acme"), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := e.mgr.Create(tenant.WithContext(ctx, "acme"), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b1, err := e.mgr.Create(tenant.WithContext(ctx, "other"), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	health := func(id string) (*http.Response, []byte) {
		return e.do(t, http.MethodGet, "/health", "", map[string]string{
			"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-API-KEY": ""})
	}
	for i, id := range []string{a1.ID, a2.ID} { // the burst: 2
		if r, b := health(id); r.StatusCode != http.StatusNoContent {
			t.Fatalf("request %d = %d %s; want 204", i+1, r.StatusCode, b)
		}
	}
	for _, id := range []string{a1.ID, a2.ID} { // one bucket for the tenant, not per sandbox
		r, b := health(id)
		if r.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("over the limit (%s) = %d %s; want 429", id, r.StatusCode, b)
		}
		if ra := r.Header.Get("Retry-After"); ra != "2" {
			t.Errorf("Retry-After = %q; want 2 (one token at 0.5/s)", ra)
		}
		if r.Header.Get("X-RateLimit-Limit") != "2" || r.Header.Get("X-RateLimit-Remaining") != "0" {
			t.Errorf("X-RateLimit-Limit/Remaining = %q/%q; want 2/0",
				r.Header.Get("X-RateLimit-Limit"), r.Header.Get("X-RateLimit-Remaining"))
		}
		var pe proxy.Error
		if err := json.Unmarshal(b, &pe); err != nil || pe.Code != 429 || pe.SandboxID != id || pe.Message == "" ||
			r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("429 body = %s (%v); want the proxy's JSON error for %s", b, err, id)
		}
	}
	if r, b := health(b1.ID); r.StatusCode != http.StatusNoContent {
		t.Errorf("other tenant = %d %s; want 204", r.StatusCode, b)
	}
	if r, b := health("nosuchsandbox"); r.StatusCode != http.StatusBadGateway {
		t.Errorf("unknown sandbox = %d %s; want 502", r.StatusCode, b)
	}
	// The control plane has its own classes: not limited by the data plane.
	if r, b := e.do(t, http.MethodGet, "/v1/sandboxes/"+a1.ID, "", nil); r.StatusCode != http.StatusOK {
		t.Errorf("native get = %d %s; want 200", r.StatusCode, b)
	}
	clock.add(2 * time.Second)
	if r, b := health(a1.ID); r.StatusCode != http.StatusNoContent {
		t.Errorf("after 2s = %d %s; want 204", r.StatusCode, b)
	}
	if r, _ := health(a1.ID); r.StatusCode != http.StatusTooManyRequests {
		t.Errorf("after the refilled token = %d; want 429", r.StatusCode)
	}
}

// TestProxyDataPlaneLimitOff: with no data-plane rate (the default) the
// proxy never refuses, whatever the other classes say.
func TestProxyDataPlaneLimitOff(t *testing.T) {
	limits := &ratelimit.Tenants{
		Limiter: ratelimit.New(time.Hour, nil),
		Policy: ratelimit.Policy{Defaults: map[tenant.Class]ratelimit.Limit{
			tenant.Read: {Rate: 0.001, Burst: 1},
		}},
	}
	e := newFakeEnv(t, func(c *Config) { c.Limits = limits })
	sb, err := e.mgr.Create(tenant.WithContext(context.Background(), "acme"), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		r, b := e.do(t, http.MethodGet, "/health", "", map[string]string{"E2b-Sandbox-Id": sb.ID, "E2b-Sandbox-Port": "49983"})
		if r.StatusCode != http.StatusNoContent {
			t.Fatalf("request %d = %d %s; want 204", i+1, r.StatusCode, b)
		}
	}
}
