// Package server composes sandboxd's HTTP surface: it routes to E2B's
// control-plane REST API (package e2b), sandboxd's native API, the MCP
// server at /mcp (package mcp) and the data-plane proxy (package proxy),
// and owns what they share around them: API-key and JWT auth, rate limits,
// access logs, panic recovery, health and Prometheus metrics. It talks to
// the lifecycle layer (package sandbox) and never to a backend directly.
package server

import (
	"context"
	"log/slog"
	"net/http"
	rtrace "runtime/trace"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/openapi/e2bapi"
	"github.com/sandboxd/sandboxd/ratelimit"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/e2b"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/server/native"
	"github.com/sandboxd/sandboxd/server/proxy"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/template"
	"github.com/sandboxd/sandboxd/tenant"
	"github.com/sandboxd/sandboxd/volume"
	"github.com/sandboxd/sandboxd/workspace"
)

// E2BPrefix is where E2B's REST API is mounted; users set
// E2B_API_URL=http://HOST:PORT/v1/sandboxes/e2b. It is also served at the
// root, so E2B_API_URL=http://HOST:PORT works as well.
const E2BPrefix = "/v1/sandboxes/e2b"

// Config wires a server.
type Config struct {
	Manager   *sandbox.Manager
	Store     *store.Store
	Templates runtime.TemplateLister // optional
	// Builds serves E2B's template build API; nil answers it with 501.
	Builds *template.Service
	// Differ is the backend's, for workspaces; nil answers them with 501.
	Differ runtime.Differ
	// Volumes serves E2B's volumes; nil answers them with 501.
	Volumes     *volume.Service
	Metrics     *Metrics
	Log         *slog.Logger
	EnvdVersion string
	// Domain enables host routing (`<port>-<id>.<domain>`) and is returned
	// to SDKs as the sandbox domain.
	Domain string
	// Ready reports whether the server may take traffic (reconcile done).
	Ready func() bool
	// Limits rate-limits each tenant per route class (nil: no limits); its
	// tenant.DataPlane class limits the proxy by the sandbox's owner;
	// IPLimiter with IPLimit limits each client address before auth.
	Limits    *ratelimit.Tenants
	IPLimiter *ratelimit.Limiter
	IPLimit   ratelimit.Limit
	// Pools, when set, exports the warm pools' series on /metrics.
	Pools PoolStats
	// JWT verifies the native API's bearer tokens; nil accepts API keys only.
	JWT *jwtauth.Verifier
	// NativeIdleTTL is the idle TTL of native creates that name none
	// (sandboxd serve --native-idle-ttl); 0: none. E2B creates never have one.
	NativeIdleTTL time.Duration
	// NativeWSWriteWait is how long exec/ws waits for a client that takes
	// no output before it ends the session; 0: 30 s.
	NativeWSWriteWait time.Duration
	// NativeWSPingPeriod is how often exec/ws pings its client; 0: 20 s.
	NativeWSPingPeriod time.Duration
	// Version is sandboxd's, as the MCP server reports it.
	Version string
}

// New returns sandboxd's whole HTTP handler.
func New(cfg Config) http.Handler {
	log := cfg.Log
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	cfg.Metrics.RegisterSandboxCounter(sandboxCounter(cfg.Manager, log))
	cfg.Metrics.RegisterHostMemory(func() (sandbox.HostMemory, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h, err := cfg.Manager.HostMemory(ctx)
		if err != nil {
			log.Error("metrics: host memory", "err", err)
			return sandbox.HostMemory{}, false
		}
		return h, true
	})

	api := e2b.New(e2b.Config{Manager: cfg.Manager, Templates: cfg.Templates, Builds: cfg.Builds, Volumes: cfg.Volumes, EnvdVersion: cfg.EnvdVersion, Domain: cfg.Domain, Log: log})
	jsonErr := func(status int) func(http.ResponseWriter, *http.Request, error) {
		return func(w http.ResponseWriter, r *http.Request, err error) {
			if status == http.StatusBadRequest {
				httpx.WriteErrorStatus(w, status, err.Error())
				return
			}
			httpx.WriteError(w, r, log, err)
		}
	}
	strict := e2bapi.NewStrictHandlerWithOptions(api, nil, e2bapi.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  jsonErr(http.StatusBadRequest),
		ResponseErrorHandlerFunc: jsonErr(http.StatusInternalServerError),
	})
	lm := newLimitMetrics(cfg.Metrics.Registry(), cfg.Pools)
	e2bRouter := chi.NewRouter()
	e2bRouter.Use(limitIPs(cfg.IPLimiter, cfg.IPLimit, lm), e2b.WithAPIBase(E2BPrefix), authenticate(cfg.Store, cfg.Volumes, log), limitTenants(cfg.Limits, lm, refuseE2B),
		unlessRawBody(httpx.LimitJSONBody(e2b.MaxBody, jsonErr(http.StatusInternalServerError))))
	notImpl := func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteError(w, r, log, errdefs.New(errdefs.ErrNotImplemented, r.Method+" "+r.URL.Path+" is not implemented by sandboxd"))
	}
	e2bRouter.NotFound(notImpl)
	e2bRouter.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		httpx.SetAllow(w, r, e2bRouter)
		httpx.WriteError(w, r, log, errdefs.New(httpx.ErrMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path))
	})
	e2bapi.HandlerWithOptions(strict, e2bapi.ChiServerOptions{BaseRouter: e2bRouter, ErrorHandlerFunc: jsonErr(http.StatusBadRequest)})

	root := chi.NewRouter()
	root.Use(middleware.RequestID, accessLog(log), recoverer(log), cfg.Metrics.HTTPMiddleware)
	root.Get("/health", func(w http.ResponseWriter, _ *http.Request) {
		if cfg.Ready != nil && !cfg.Ready() {
			httpx.WriteErrorStatus(w, http.StatusServiceUnavailable, "starting")
			return
		}
		httpx.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	root.Method(http.MethodGet, "/metrics", cfg.Metrics.Handler())
	// Template files go to signed links, without an API key (the SDKs
	// PUT them like to a bucket's presigned URL).
	upload := limitIPs(cfg.IPLimiter, cfg.IPLimit, lm)(api.UploadHandler(
		func(r *http.Request) string { return chi.URLParam(r, "templateID") },
		func(r *http.Request) string { return chi.URLParam(r, "hash") }))
	for _, prefix := range []string{E2BPrefix, ""} {
		root.Method(http.MethodPut, prefix+"/templates/{templateID}/files/{hash}/upload", upload)
	}
	ws := workspace.New(workspace.Config{Manager: cfg.Manager, Differ: cfg.Differ, Templates: cfg.Builds, Log: log})
	nat := native.New(native.Config{Manager: cfg.Manager, Workspace: ws, Log: log, IdleTTL: cfg.NativeIdleTTL, WSWriteWait: cfg.NativeWSWriteWait,
		WSPingPeriod: cfg.NativeWSPingPeriod})
	root.Mount(NativePrefix, newNative(cfg, lm, nat)) // E2BPrefix, longer, still routes to e2b
	root.Handle(MCPPath, newMCP(cfg, lm, nat, ws))
	root.Mount(E2BPrefix, e2bRouter)
	root.Mount("/", e2bRouter)

	// The data-plane class of Limits is off unless its default has a rate.
	p := proxy.New(cfg.Manager, proxy.Config{Domain: cfg.Domain, Log: log,
		Metrics: proxyMetrics{cfg.Metrics, lm}, Limits: cfg.Limits})
	cfg.Manager.OnStop(p.CloseSandbox)
	return traceRequests(p.Wrap(root))
}

// accessLog writes one JSON line per API request with its request id and
// tenant (the proxy logs its own streams).
func accessLog(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
			var t tenant.ID
			ctx := withTenantSlot(r.Context(), &t)
			if rtrace.IsEnabled() {
				// While an execution trace runs (--debug-addr), each
				// request is a task of its own, so that `go tool trace`
				// shows where one request's goroutines waited; the tenant
				// is logged on it once known (reportTenant).
				var task *rtrace.Task
				ctx, task = rtrace.NewTask(ctx, "http request")
				defer task.End()
				rtrace.Log(ctx, "request", r.Method+" "+r.URL.Path)
			}
			r = r.WithContext(ctx)
			next.ServeHTTP(ww, r)
			if r.URL.Path == "/health" || r.URL.Path == "/metrics" {
				return
			}
			log.Info("http request", "method", r.Method, "path", r.URL.Path, "status", ww.Status(),
				"duration_ms", float64(time.Since(start).Microseconds())/1000,
				"request_id", middleware.GetReqID(r.Context()), "tenant", string(t))
		})
	}
}

type tenantSlotKey struct{}

// withTenantSlot lets the auth middleware, deeper in the chain, report the
// tenant back to the access log.
func withTenantSlot(ctx context.Context, t *tenant.ID) context.Context {
	return context.WithValue(ctx, tenantSlotKey{}, t)
}

func reportTenant(ctx context.Context, t tenant.ID) {
	if slot, ok := ctx.Value(tenantSlotKey{}).(*tenant.ID); ok {
		*slot = t
	}
	if rtrace.IsEnabled() {
		rtrace.Log(ctx, "tenant", string(t))
	}
}

// sandboxCounter counts live sandboxes by tenant and state at scrape time.
func sandboxCounter(mgr *sandbox.Manager, log *slog.Logger) func() map[string]map[string]int {
	return func() map[string]map[string]int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		counts, err := mgr.LiveCounts(ctx)
		if err != nil {
			log.Error("metrics: list sandboxes", "err", err)
			return nil
		}
		out := make(map[string]map[string]int, len(counts))
		for t, byState := range counts {
			out[string(t)] = make(map[string]int, len(byState))
			for st, n := range byState {
				out[string(t)][string(st)] = n
			}
		}
		return out
	}
}
