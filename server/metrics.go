package server

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/server/proxy"
)

// Metrics is sandboxd's Prometheus instrumentation. It owns its registry (no
// global state, so tests and several servers in one process do not collide)
// with the Go runtime and process collectors, the control plane's HTTP
// metrics, sandbox create latency, sandbox counts by tenant and state, and
// the data-plane proxy's requests, bytes and open streams.
//
// All methods are safe on a nil *Metrics, where they do nothing.
type Metrics struct {
	reg *prometheus.Registry

	httpRequests *prometheus.CounterVec   // route, method, code
	httpDuration *prometheus.HistogramVec // route, method

	// CreateLatency observes how long creating a sandbox took, labelled by
	// template and by where it was served from (e.g. "cold", "snapshot",
	// "pool"); see ObserveCreate.
	CreateLatency *prometheus.HistogramVec

	sandboxCounts atomic.Pointer[func() map[string]map[string]int]
	hostMemory    atomic.Pointer[func() (sandbox.HostMemory, bool)]

	// The sandbox metrics history's sampling passes (ObserveMetricsPass)
	// and the sandbox log entries evicted to stay in bounds (LogsDropped).
	metricsPass     prometheus.Histogram
	metricsSampled  prometheus.Gauge
	logEntryDropped prometheus.Counter

	// Creates whose claimed member failed envd's /init and went on cold
	// (ClaimFallback).
	claimFallbacks *prometheus.CounterVec // template, served_from
	// deferredInits counts the /init of claimed members sent after the
	// create's answer (DeferredInit).
	deferredInits *prometheus.CounterVec // by, result

	proxyRequests *prometheus.CounterVec // port_class, code
	proxyBytes    *prometheus.CounterVec // direction
	proxyStreams  prometheus.Gauge

	// Children resolved once: the proxy adds to these on every read/write.
	proxyBytesIn, proxyBytesOut prometheus.Counter
}

// routeOther labels requests that matched no chi route; raw paths are never
// used as labels (sandbox ids in paths would make cardinality unbounded).
const routeOther = "other"

// NewMetrics builds the metrics and their registry.
func NewMetrics() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_http_requests_total",
		Help: "Control-plane HTTP requests by chi route pattern, method and status code.",
	}, []string{"route", "method", "code"})
	m.httpDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sandboxd_http_request_duration_seconds",
		Help:    "Control-plane HTTP request latency by chi route pattern and method.",
		Buckets: prometheus.DefBuckets,
	}, []string{"route", "method"})
	m.CreateLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sandboxd_sandbox_create_seconds",
		Help:    "Time to create a sandbox, until envd answers, by template and where it was served from.",
		Buckets: []float64{.025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"template", "served_from"})
	m.proxyRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_proxy_requests_total",
		Help: "Data-plane requests proxied to sandboxes, by port class (envd or port) and status code.",
	}, []string{"port_class", "code"})
	m.proxyBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_proxy_bytes_total",
		Help: "Bytes the data-plane proxy carried to sandboxes (in) and from them (out), HTTP framing included.",
	}, []string{"direction"})
	m.proxyStreams = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sandboxd_proxy_open_streams",
		Help: "Data-plane requests in flight, including long-lived streams and upgraded connections.",
	})
	m.metricsPass = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sandboxd_sandbox_metrics_pass_seconds",
		Help:    "Time of one pass sampling every running sandbox's resource use for the metrics history.",
		Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 2.5, 5, 10},
	})
	m.metricsSampled = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sandboxd_sandbox_metrics_sampled",
		Help: "Sandboxes the last metrics history pass sampled.",
	})
	m.logEntryDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandboxd_sandbox_log_entries_dropped_total",
		Help: "Sandbox log entries evicted (oldest first) to keep each sandbox's log within its bounds.",
	})
	m.claimFallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_pool_claim_fallbacks_total",
		Help: "Creates whose claimed warm member (served_from: pool or spare) failed envd's /init or was not running: the member was destroyed and the create went on cold.",
	}, []string{"template", "served_from"})
	m.deferredInits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_envd_deferred_inits_total",
		Help: "envd /init requests of claimed warm members sent after the create's answer (--defer-claim-init), by who sent them (claim: in the background; dial: a request to the sandbox, after a failure or a restart) and result (ok, error).",
	}, []string{"by", "result"})
	m.proxyBytesIn = m.proxyBytes.WithLabelValues(proxy.DirectionIn)
	m.proxyBytesOut = m.proxyBytes.WithLabelValues(proxy.DirectionOut)

	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.httpRequests, m.httpDuration, m.CreateLatency,
		m.proxyRequests, m.proxyBytes, m.proxyStreams,
		m.metricsPass, m.metricsSampled, m.logEntryDropped, m.claimFallbacks, m.deferredInits,
		sandboxCollector{m}, hostMemoryCollector{m},
	)
	return m
}

// Registry is the registry the metrics live in, for callers that add their
// own collectors.
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Handler serves the metrics in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ObserveCreate records one sandbox creation.
func (m *Metrics) ObserveCreate(template, servedFrom string, d time.Duration) {
	if m == nil {
		return
	}
	m.CreateLatency.WithLabelValues(template, servedFrom).Observe(d.Seconds())
}

// DeferredInit counts a claimed member's /init sent after the create's
// answer, by "claim" or "dial", failed when err is not nil.
func (m *Metrics) DeferredInit(by string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.deferredInits.WithLabelValues(by, result).Inc()
}

// ClaimFallback counts a create whose claimed member failed envd's /init,
// or was not running, and that went on as a cold create.
func (m *Metrics) ClaimFallback(template, servedFrom string) {
	if m == nil {
		return
	}
	m.claimFallbacks.WithLabelValues(template, servedFrom).Inc()
}

// ObserveMetricsPass records one pass of the sandbox metrics sampler.
func (m *Metrics) ObserveMetricsPass(sampled int, d time.Duration) {
	if m == nil {
		return
	}
	m.metricsPass.Observe(d.Seconds())
	m.metricsSampled.Set(float64(sampled))
}

// LogsDropped counts sandbox log entries evicted to stay in bounds.
func (m *Metrics) LogsDropped(n int) {
	if m == nil {
		return
	}
	m.logEntryDropped.Add(float64(n))
}

// RegisterSandboxCounter sets the function that reports live sandboxes as
// tenant -> state -> count. It is called at every scrape (so it must be
// cheap and safe for concurrent use) and exported as
// sandboxd_sandboxes{tenant,state}. A later call replaces an earlier one;
// nil removes it.
func (m *Metrics) RegisterSandboxCounter(f func() map[string]map[string]int) {
	if m == nil {
		return
	}
	if f == nil {
		m.sandboxCounts.Store(nil)
		return
	}
	m.sandboxCounts.Store(&f)
}

var sandboxesDesc = prometheus.NewDesc("sandboxd_sandboxes",
	"Live sandboxes by tenant and lifecycle state.", []string{"tenant", "state"}, nil)

// sandboxCollector asks the lifecycle layer for its counts at scrape time.
type sandboxCollector struct{ m *Metrics }

func (c sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sandboxesDesc }

func (c sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.m.sandboxCounts.Load()
	if f == nil {
		return
	}
	for tenant, states := range (*f)() {
		for state, n := range states {
			ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), tenant, state)
		}
	}
}

// RegisterHostMemory sets the function that reports the host's memory as
// admission sees it (false: not known now), called at every scrape.
func (m *Metrics) RegisterHostMemory(f func() (sandbox.HostMemory, bool)) {
	if m == nil {
		return
	}
	if f == nil {
		m.hostMemory.Store(nil)
		return
	}
	m.hostMemory.Store(&f)
}

var (
	hostCommittedDesc = prometheus.NewDesc("sandboxd_host_memory_committed_bytes",
		"Memory the host budget counts as taken: the limits of live sandboxes (not those paused to disk), warm members and creates under way.", nil, nil)
	hostBudgetDesc = prometheus.NewDesc("sandboxd_host_memory_budget_bytes",
		"The host memory budget (--host-memory-mb); absent when there is none.", nil, nil)
	hostAvailableDesc = prometheus.NewDesc("sandboxd_host_memory_available_bytes",
		"The kernel's MemAvailable, which creates must leave the reserve of.", nil, nil)
	hostReserveDesc = prometheus.NewDesc("sandboxd_host_memory_reserve_bytes",
		"Memory creates must leave available (--host-memory-reserve-mb); absent when off.", nil, nil)
)

// hostMemoryCollector reports the host's memory as admission sees it.
type hostMemoryCollector struct{ m *Metrics }

func (c hostMemoryCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, hostCommittedDesc, hostBudgetDesc, hostAvailableDesc, hostReserveDesc)
}

// describe sends a collector's descriptions.
func describe(ch chan<- *prometheus.Desc, descs ...*prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

func (c hostMemoryCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.m.hostMemory.Load()
	if f == nil {
		return
	}
	h, ok := (*f)()
	if !ok {
		return
	}
	const mib = 1 << 20
	gauge := func(d *prometheus.Desc, mb int) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(mb)*mib)
	}
	gauge(hostCommittedDesc, h.Committed)
	if h.Budget > 0 {
		gauge(hostBudgetDesc, h.Budget)
	}
	if h.Available >= 0 {
		gauge(hostAvailableDesc, h.Available)
	}
	if h.Reserve > 0 {
		gauge(hostReserveDesc, h.Reserve)
	}
}

// HTTPMiddleware records sandboxd_http_requests_total and
// sandboxd_http_request_duration_seconds for next. The route label is the
// chi route pattern the request matched (read after next ran), or "other".
// It works both as a chi middleware (router.Use) and wrapped around a chi
// router from outside: then it supplies the routing context chi fills in.
func (m *Metrics) HTTPMiddleware(next http.Handler) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rctx := chi.RouteContext(r.Context())
		if rctx == nil {
			rctx = chi.NewRouteContext()
			r = r.WithContext(context.WithValue(r.Context(), chi.RouteCtxKey, rctx))
		}
		rec := &httpx.StatusRecorder{ResponseWriter: w}
		defer func() {
			route := rctx.RoutePattern()
			if route == "" {
				route = routeOther
			}
			method := methodLabel(r.Method)
			code := rec.Status
			if code == 0 {
				code = http.StatusOK // nothing written: net/http answers 200
			}
			m.httpRequests.WithLabelValues(route, method, strconv.Itoa(code)).Inc()
			m.httpDuration.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
		}()
		next.ServeHTTP(rec, r)
	})
}

// methodLabel bounds the method label to the standard methods.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "OTHER"
}

// proxyMetrics reports the proxy's observations into m.
type proxyMetrics struct {
	m  *Metrics
	lm *limitMetrics
}

func (p proxyMetrics) Request(portClass string, code int) { p.m.proxyRequest(portClass, code) }
func (p proxyMetrics) StreamOpened()                      { p.m.proxyStreamOpened() }
func (p proxyMetrics) StreamClosed()                      { p.m.proxyStreamClosed() }
func (p proxyMetrics) Bytes(direction string, n int)      { p.m.proxyBytesAdd(direction, n) }
func (p proxyMetrics) Rejected(tenant, class string)      { p.lm.rejected(tenant, class) }

// Proxy instrumentation, through proxyMetrics.

func (m *Metrics) proxyRequest(portClass string, code int) {
	if m == nil {
		return
	}
	m.proxyRequests.WithLabelValues(portClass, strconv.Itoa(code)).Inc()
}

func (m *Metrics) proxyStreamOpened() {
	if m != nil {
		m.proxyStreams.Inc()
	}
}

func (m *Metrics) proxyStreamClosed() {
	if m != nil {
		m.proxyStreams.Dec()
	}
}

func (m *Metrics) proxyBytesAdd(direction string, n int) {
	if m == nil || n <= 0 {
		return
	}
	if direction == proxy.DirectionIn {
		m.proxyBytesIn.Add(float64(n))
	} else {
		m.proxyBytesOut.Add(float64(n))
	}
}
