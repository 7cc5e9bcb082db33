package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/proxy"
)

// scrapeMetricsText returns m's exposition in the text format.
func scrapeMetricsText(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	m.Handler().ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// scrapeMetrics returns every sample as `name{labels}` -> value (labels in
// the exposition's order, which is sorted by label name).
func scrapeMetrics(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for line := range strings.Lines(scrapeMetricsText(t, m)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

func TestMetricsHTTPMiddleware(t *testing.T) {
	m := NewMetrics()
	r := chi.NewRouter()
	r.Get("/sandboxes/{sandboxID}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
	})
	r.Route("/v1/sandboxes/e2b", func(r chi.Router) {
		r.Post("/sandboxes", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	})
	r.Get("/health", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	// Wrapped from outside the router: the middleware supplies chi's context.
	srv := httptest.NewServer(m.HTTPMiddleware(r))
	defer srv.Close()

	for _, rq := range []struct{ method, path string }{
		{"GET", "/sandboxes/abc"}, {"GET", "/sandboxes/def"}, {"POST", "/v1/sandboxes/e2b/sandboxes"},
		{"GET", "/health"}, {"GET", "/no/such/route/xyz"}, {"BREW", "/health"},
	} {
		req, _ := http.NewRequest(rq.method, srv.URL+rq.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	got := scrapeMetrics(t, m)
	for series, want := range map[string]float64{
		`sandboxd_http_requests_total{code="404",method="GET",route="/sandboxes/{sandboxID}"}`:       2,
		`sandboxd_http_requests_total{code="201",method="POST",route="/v1/sandboxes/e2b/sandboxes"}`: 1,
		`sandboxd_http_requests_total{code="200",method="GET",route="/health"}`:                      1,
		`sandboxd_http_requests_total{code="404",method="GET",route="other"}`:                        1,
		`sandboxd_http_requests_total{code="405",method="OTHER",route="other"}`:                      1,
		`sandboxd_http_request_duration_seconds_count{method="GET",route="/sandboxes/{sandboxID}"}`:  2,
	} {
		if v, ok := got[series]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	text := scrapeMetricsText(t, m)
	for _, raw := range []string{"/sandboxes/abc", "/no/such"} {
		if strings.Contains(text, raw) {
			t.Errorf("raw path %q in the metrics", raw)
		}
	}

	// As a chi middleware (router.Use) it sees the same patterns.
	m2 := NewMetrics()
	r2 := chi.NewRouter()
	r2.Use(m2.HTTPMiddleware)
	r2.Get("/templates/{templateID}", func(w http.ResponseWriter, r *http.Request) {})
	rec := httptest.NewRecorder()
	r2.ServeHTTP(rec, httptest.NewRequest("GET", "/templates/base", nil))
	if v := scrapeMetrics(t, m2)[`sandboxd_http_requests_total{code="200",method="GET",route="/templates/{templateID}"}`]; v != 1 {
		t.Errorf("router.Use: count %v, want 1\n%s", v, scrapeMetricsText(t, m2))
	}
}

func TestMetricsSeries(t *testing.T) {
	m := NewMetrics()
	var mu sync.Mutex
	counts := map[string]map[string]int{"acme": {"running": 3, "paused": 1}, "beta": {"running": 0}}
	m.RegisterSandboxCounter(func() map[string]map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return counts
	})
	m.RegisterHostMemory(func() (sandbox.HostMemory, bool) {
		return sandbox.HostMemory{Committed: 1536, Budget: 4096, Available: -1}, true
	})
	m.ObserveCreate("base", "cold", 1500*time.Millisecond)
	m.HTTPMiddleware(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil))
	m.proxyRequest(proxy.PortEnvd, 200)
	m.proxyBytesAdd(proxy.DirectionIn, 10)
	m.proxyBytesAdd(proxy.DirectionOut, 20)
	m.proxyStreamOpened()

	got := scrapeMetrics(t, m)
	for series, want := range map[string]float64{
		`sandboxd_sandboxes{state="running",tenant="acme"}`:                                   3,
		`sandboxd_sandboxes{state="paused",tenant="acme"}`:                                    1,
		`sandboxd_sandboxes{state="running",tenant="beta"}`:                                   0,
		`sandboxd_sandbox_create_seconds_count{served_from="cold",template="base"}`:           1,
		`sandboxd_sandbox_create_seconds_sum{served_from="cold",template="base"}`:             1.5,
		`sandboxd_sandbox_create_seconds_bucket{served_from="cold",template="base",le="2.5"}`: 1,
		`sandboxd_http_requests_total{code="404",method="GET",route="other"}`:                 1,
		`sandboxd_http_request_duration_seconds_count{method="GET",route="other"}`:            1,
		`sandboxd_proxy_requests_total{code="200",port_class="envd"}`:                         1,
		`sandboxd_proxy_bytes_total{direction="in"}`:                                          10,
		`sandboxd_proxy_bytes_total{direction="out"}`:                                         20,
		`sandboxd_proxy_open_streams`:                                                         1,
		`sandboxd_host_memory_committed_bytes`:                                                1536 << 20,
		`sandboxd_host_memory_budget_bytes`:                                                   4096 << 20,
	} {
		if v, ok := got[series]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	// Unknown or off: absent, not zero.
	for _, name := range []string{"sandboxd_host_memory_available_bytes", "sandboxd_host_memory_reserve_bytes"} {
		if _, ok := got[name]; ok {
			t.Errorf("%s present; want it absent when unknown or off", name)
		}
	}
	// The Go and process collectors are there.
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := got[name]; !ok {
			t.Errorf("%s missing", name)
		}
	}

	// The counter is read at every scrape.
	mu.Lock()
	counts = map[string]map[string]int{"acme": {"running": 4}}
	mu.Unlock()
	got = scrapeMetrics(t, m)
	if got[`sandboxd_sandboxes{state="running",tenant="acme"}`] != 4 {
		t.Errorf("sandbox count not refreshed")
	}
	if _, ok := got[`sandboxd_sandboxes{state="paused",tenant="acme"}`]; ok {
		t.Errorf("stale series kept")
	}
}

func TestMetricsNil(t *testing.T) {
	var m *Metrics
	m.ObserveCreate("base", "cold", time.Second)
	m.RegisterSandboxCounter(nil)
	m.RegisterHostMemory(nil)
	m.proxyRequest(proxy.PortEnvd, 200)
	m.proxyBytesAdd(proxy.DirectionIn, 1)
	m.proxyStreamOpened()
	m.proxyStreamClosed()
	h := http.NotFoundHandler()
	if m.HTTPMiddleware(h) == nil || m.Handler() == nil {
		t.Fatal("nil Metrics must still give handlers")
	}
}
