package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/ratelimit"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/sandboxtest"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/store/storetest"
	"github.com/sandboxd/sandboxd/tenant"
)

type limitClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *limitClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *limitClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type limitEnv struct {
	h        http.Handler
	st       *store.Store
	be       *sandboxtest.Backend
	mgr      *sandbox.Manager
	settings *sandbox.Settings
	metrics  *Metrics
	clock    *limitClock
	keys     map[string]string
}

// newLimitEnv is the whole sandboxd handler over a real store and a fake
// backend, with per-tenant limits on a fake clock: tenant "a" may create at
// 1/s with a burst of 2; the server default (tenant "b") is 1/s burst 2 too.
func newLimitEnv(t *testing.T) *limitEnv {
	t.Helper()
	return newLimitEnvWith(t, nil)
}

// newLimitEnvWith is newLimitEnv with mod applied to the Manager's config.
func newLimitEnvWith(t *testing.T, mod func(*sandbox.Config)) *limitEnv {
	t.Helper()
	ctx := context.Background()
	st, _ := storetest.Open(t)
	e := &limitEnv{st: st, keys: map[string]string{}, clock: &limitClock{t: time.Unix(1_700_000_000, 0)}}
	for _, name := range []string{"a", "b"} {
		if _, err := st.EnsureTenant(ctx, name); err != nil {
			t.Fatal(err)
		}
		key, _, err := st.CreateKey(ctx, tenant.ID(name))
		if err != nil {
			t.Fatal(err)
		}
		e.keys[name] = key
	}
	create := tenant.Limit{Rate: tenant.Of(1.0), Burst: tenant.Of(2)}
	if _, err := st.UpdateTenantSettings(ctx, "a", func(s *tenant.Settings) { s.SetLimit(tenant.Create, create) }); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	e.settings = sandbox.NewSettings(st, sandbox.Defaults{}, log)
	if err := e.settings.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	e.be = sandboxtest.New()
	t.Cleanup(e.be.Close)
	cfg := sandbox.Config{Store: st, Backend: e.be, BackendName: "fake", Log: log, Settings: e.settings}
	if mod != nil {
		mod(&cfg)
	}
	e.mgr = sandbox.New(cfg)
	e.metrics = NewMetrics()
	limits := &ratelimit.Tenants{
		Limiter: ratelimit.New(time.Minute, e.clock.now),
		Policy: ratelimit.Policy{
			Defaults: map[tenant.Class]ratelimit.Limit{
				tenant.Create:    {Rate: 1, Burst: 2},
				tenant.Lifecycle: {Rate: 100, Burst: 100},
				tenant.Read:      {Rate: 100, Burst: 100},
			},
			Settings: e.settings.Stored,
		},
	}
	e.h = New(Config{Manager: e.mgr, Store: st, Metrics: e.metrics, Log: log, Limits: limits})
	return e
}

func (e *limitEnv) do(t *testing.T, who, method, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("X-API-KEY", e.keys[who])
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return rec
}

func (e *limitEnv) create(t *testing.T, who string) *httptest.ResponseRecorder {
	return e.do(t, who, http.MethodPost, E2BPrefix+"/sandboxes", `{"templateID":"base","timeout":60}`)
}

func TestRateLimitTenantIsolation(t *testing.T) {
	e := newLimitEnv(t)
	var codes []int
	for range 3 {
		codes = append(codes, e.create(t, "a").Code)
	}
	if codes[0] != 201 || codes[1] != 201 || codes[2] != 429 {
		t.Fatalf("tenant a creates: %v, want [201 201 429]", codes)
	}
	rec := e.create(t, "a")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a: %d, want 429", rec.Code)
	}
	if got := rec.Header().Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1", got)
	}
	for h, want := range map[string]string{"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0"} {
		if got := rec.Header().Get(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
	if reset, err := strconv.ParseInt(rec.Header().Get("X-RateLimit-Reset"), 10, 64); err != nil || reset < time.Now().Unix() {
		t.Errorf("X-RateLimit-Reset = %q", rec.Header().Get("X-RateLimit-Reset"))
	}
	var body httpx.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Code != 429 || !strings.Contains(body.Message, "rate limit") {
		t.Fatalf("429 body %q (%v), want E2B's {code:429,message}", rec.Body, err)
	}
	// Tenant b is unaffected by a's flood.
	for i := range 2 {
		if rec := e.create(t, "b"); rec.Code != 201 {
			t.Fatalf("tenant b create %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	// a's reads have their own bucket.
	if rec := e.do(t, "a", http.MethodGet, E2BPrefix+"/v2/sandboxes", ""); rec.Code != 200 {
		t.Fatalf("a list while create-limited: %d %s", rec.Code, rec.Body)
	}
	// A second later a has a token again.
	e.clock.advance(time.Second)
	if rec := e.create(t, "a"); rec.Code != 201 {
		t.Fatalf("a after refill: %d %s", rec.Code, rec.Body)
	}
	m := scrapeMetrics(t, e.metrics)
	if got := m[`sandboxd_ratelimit_rejections_total{class="create",tenant="a"}`]; got != 2 {
		t.Errorf("rejections of a = %v, want 2", got)
	}
}

// TestRateLimitFlood: a floods creates at 10× its limit for 10 s while b
// creates at its own rate; a gets 429s with Retry-After, b none, and once
// everything is killed nothing is left in the backend or the store.
func TestRateLimitFlood(t *testing.T) {
	e := newLimitEnv(t)
	var aOK, a429, bOK, b429 int
	for step := range 100 { // 10 s in 100 ms steps
		rec := e.create(t, "a")
		switch rec.Code {
		case 201:
			aOK++
		case 429:
			a429++
			if rec.Header().Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
		default:
			t.Fatalf("a: %d %s", rec.Code, rec.Body)
		}
		if step%10 == 0 {
			switch rec := e.create(t, "b"); rec.Code {
			case 201:
				bOK++
			case 429:
				b429++
			default:
				t.Fatalf("b: %d %s", rec.Code, rec.Body)
			}
		}
		e.clock.advance(100 * time.Millisecond)
	}
	// a: the burst of 2 plus one per second after.
	if aOK < 10 || aOK > 12 || a429 != 100-aOK {
		t.Errorf("a: %d created, %d refused; want about 11 and the rest refused", aOK, a429)
	}
	if bOK != 10 || b429 != 0 {
		t.Errorf("b: %d created, %d refused; want 10 and 0", bOK, b429)
	}
	// Nothing leaks: refused creates made nothing, and kills clean up.
	live, err := e.st.ListLive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != aOK+bOK || e.be.Len() != aOK+bOK {
		t.Fatalf("%d rows, %d backend sandboxes; want %d", len(live), e.be.Len(), aOK+bOK)
	}
	for _, sb := range live {
		e.clock.advance(time.Second)
		if rec := e.do(t, string(sb.Tenant), http.MethodDelete, E2BPrefix+"/sandboxes/"+sb.ID, ""); rec.Code != 204 {
			t.Fatalf("kill %s: %d %s", sb.ID, rec.Code, rec.Body)
		}
	}
	if live, _ := e.st.ListLive(context.Background()); len(live) != 0 || e.be.Len() != 0 {
		t.Fatalf("after kills: %d rows, %d backend sandboxes", len(live), e.be.Len())
	}
}

func TestQuotaAnswers429AndHostGuard503(t *testing.T) {
	e := newLimitEnv(t)
	if _, err := e.st.UpdateTenantSettings(context.Background(), "b", func(s *tenant.Settings) { s.MaxSandboxes = tenant.Of(1) }); err != nil {
		t.Fatal(err)
	}
	if err := e.settings.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec := e.create(t, "b"); rec.Code != 201 {
		t.Fatalf("first: %d %s", rec.Code, rec.Body)
	}
	e.clock.advance(time.Second)
	rec := e.create(t, "b")
	if rec.Code != 429 || !strings.Contains(rec.Body.String(), "quota") || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("over quota: %d %q Retry-After %q", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
	}
}

func TestRouteClass(t *testing.T) {
	tests := []struct {
		method, path string
		want         tenant.Class
	}{
		{"POST", "/sandboxes", tenant.Create},
		{"POST", E2BPrefix + "/sandboxes", tenant.Create},
		{"POST", "/v2/sandboxes", tenant.Create},
		{"POST", "/sandboxes/abc/connect", tenant.Create},
		{"POST", "/v2/sandboxes/abc/connect", tenant.Create},
		{"POST", E2BPrefix + "/sandboxes/abc/resume", tenant.Create},
		{"POST", "/sandboxes/abc/pause", tenant.Lifecycle},
		{"POST", "/sandboxes/abc/timeout", tenant.Lifecycle},
		{"DELETE", "/sandboxes/abc", tenant.Lifecycle},
		{"PUT", "/sandboxes/abc/network", tenant.Lifecycle},
		{"GET", "/sandboxes/abc", tenant.Read},
		{"GET", "/v2/sandboxes", tenant.Read},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, tt.path, nil)
		if got := routeClass(r); got != tt.want {
			t.Errorf("%s %s: got %s, want %s", tt.method, tt.path, got, tt.want)
		}
	}
}

func TestIPLimitBeforeAuth(t *testing.T) {
	e := newLimitEnv(t)
	log := slog.New(slog.DiscardHandler)
	clk := &limitClock{t: time.Unix(1_700_000_000, 0)}
	h := New(Config{Manager: e.mgr, Store: e.st, Metrics: NewMetrics(), Log: log,
		IPLimiter: ratelimit.New(time.Minute, clk.now), IPLimit: ratelimit.Limit{Rate: 1, Burst: 2}})
	var codes []int
	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/v2/sandboxes", nil)
		req.Header.Set("X-API-KEY", "e2b_bogus")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
	}
	if codes[0] != 401 || codes[1] != 401 || codes[2] != 429 {
		t.Fatalf("bad-key requests from one address: %v, want [401 401 429]", codes)
	}
}

// The native API shares the tenant's buckets and answers 429 in its own
// error shape.
func TestRateLimitNativeAPI(t *testing.T) {
	e := newLimitEnv(t)
	var last *httptest.ResponseRecorder
	var codes []int
	for range 3 {
		last = e.do(t, "a", http.MethodPost, NativePrefix, `{"template":"base"}`)
		codes = append(codes, last.Code)
	}
	if codes[0] != http.StatusCreated || codes[1] != http.StatusCreated || codes[2] != http.StatusTooManyRequests {
		t.Fatalf("native creates of tenant a = %v; want 201, 201, 429 (burst 2)", codes)
	}
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(last.Body.Bytes(), &body); err != nil || body.Error.Code != "resource_exhausted" || body.Error.Message == "" {
		t.Errorf("429 body = %s; want the native error shape with code resource_exhausted", last.Body)
	}
	if last.Header().Get("Retry-After") == "" || last.Header().Get("X-RateLimit-Limit") == "" {
		t.Errorf("429 headers = %v; want Retry-After and X-RateLimit-*", last.Header())
	}
	if c := e.do(t, "b", http.MethodPost, NativePrefix, `{"template":"base"}`).Code; c != http.StatusCreated {
		t.Errorf("tenant b's native create = %d; want 201 (its own bucket)", c)
	}
}

// TestRateLimitTenantReadRate: a tenant's own read_rate / read_burst (set in
// the store, picked up by the settings cache) override the server's read
// default for that tenant only: its GETs get 429 while another tenant's,
// under the default, do not, and its creates keep their own bucket.
func TestRateLimitTenantReadRate(t *testing.T) {
	e := newLimitEnv(t)
	ctx := t.Context()
	read := tenant.Limit{Rate: tenant.Of(1.0), Burst: tenant.Of(2)}
	if _, err := e.st.UpdateTenantSettings(ctx, "a", func(s *tenant.Settings) { s.SetLimit(tenant.Read, read) }); err != nil {
		t.Fatal(err)
	}
	if err := e.settings.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	list := E2BPrefix + "/v2/sandboxes"
	var codes []int
	for range 4 {
		codes = append(codes, e.do(t, "a", http.MethodGet, list, "").Code)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 || codes[3] != 429 {
		t.Fatalf("tenant a GETs at read rate 1/s burst 2: %v, want [200 200 429 429]", codes)
	}
	rec := e.do(t, "a", http.MethodGet, list, "")
	if got := rec.Header().Get("X-RateLimit-Limit"); rec.Code != 429 || got != "2" {
		t.Errorf("a: %d, X-RateLimit-Limit %q; want 429, 2 (its own burst)", rec.Code, got)
	}
	for i := range 20 { // the default: 100/s burst 100
		if rec := e.do(t, "b", http.MethodGet, list, ""); rec.Code != 200 {
			t.Fatalf("tenant b GET %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	if rec := e.create(t, "a"); rec.Code != 201 {
		t.Fatalf("tenant a create after its reads ran out: %d %s", rec.Code, rec.Body)
	}
	e.clock.advance(time.Second)
	if rec := e.do(t, "a", http.MethodGet, list, ""); rec.Code != 200 {
		t.Fatalf("tenant a GET a second later: %d, want 200", rec.Code)
	}
}

// TestResumeFromDiskHostGuard503: a sandbox paused to disk leaves the host
// memory budget, so another create fits; its resume must fit the budget
// again and answers 503 with Retry-After, like a create, when it does not.
// A sandbox left resuming lists as paused.
func TestResumeFromDiskHostGuard503(t *testing.T) {
	e := newLimitEnvWith(t, func(c *sandbox.Config) { c.HostMemoryMB = 1024 }) // two of 512 MiB
	create := func() *httptest.ResponseRecorder {
		t.Helper()
		e.clock.advance(time.Second)
		return e.create(t, "b")
	}
	var ids []string
	for range 2 {
		rec := create()
		if rec.Code != 201 {
			t.Fatalf("create: %d %s", rec.Code, rec.Body)
		}
		var sb struct{ SandboxID string }
		if err := json.Unmarshal(rec.Body.Bytes(), &sb); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.SandboxID)
	}
	if rec := create(); rec.Code != 503 {
		t.Fatalf("third create over budget: %d %s; want 503", rec.Code, rec.Body)
	}
	if rec := e.do(t, "b", http.MethodPost, E2BPrefix+"/sandboxes/"+ids[0]+"/pause", `{"memory":false}`); rec.Code != 204 {
		t.Fatalf("pause to disk: %d %s", rec.Code, rec.Body)
	}
	if rec := create(); rec.Code != 201 {
		t.Fatalf("create with one sandbox on disk: %d %s; want 201", rec.Code, rec.Body)
	}
	rec := e.do(t, "b", http.MethodPost, E2BPrefix+"/sandboxes/"+ids[0]+"/connect", `{"timeout":60}`)
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "budget") {
		t.Fatalf("resume over budget: %d %q Retry-After %q; want 503 with Retry-After", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
	}

	sb, err := e.st.GetSandboxAny(context.Background(), ids[1])
	if err != nil {
		t.Fatal(err)
	}
	sb.State = store.StateResuming
	if err := e.st.UpdateSandbox(context.Background(), &sb); err != nil {
		t.Fatal(err)
	}
	rec = e.do(t, "b", http.MethodGet, E2BPrefix+"/v2/sandboxes?state=paused", "")
	var listed []struct{ SandboxID, State string }
	if err := json.Unmarshal(rec.Body.Bytes(), &listed); rec.Code != 200 || err != nil {
		t.Fatalf("list paused: %d %s %v", rec.Code, rec.Body, err)
	}
	got := map[string]string{}
	for _, l := range listed {
		got[l.SandboxID] = l.State
	}
	if got[ids[0]] != "paused" || got[ids[1]] != "paused" || len(got) != 2 {
		t.Errorf("paused list: %v; want %s and the resuming %s, both paused", got, ids[0], ids[1])
	}
}
