// Package proxy is sandboxd's data plane: it forwards requests routed to a
// sandbox (host `<port>-<id>.<domain>`, or E2B's routing headers) to envd or
// to another port inside it, over the lifecycle layer's private channel,
// and answers failures in E2B's proxy error shape. Upstream, its pooled
// transport into sandboxes, also carries the native API's calls to envd.
package proxy

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/ratelimit"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/telemetry"
	"github.com/sandboxd/sandboxd/tenant"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Lifecycle is everything the proxy needs from the lifecycle layer
// (sandbox.Manager), named here rather than discovered by type assertion.
type Lifecycle interface {
	// DialSandbox opens a stream to port inside sandbox id, resuming the sandbox first if it is paused with auto-resume. A missing, killed or (paused without auto-resume) sandbox fails with an error wrapping errdefs.ErrNotFound; a port nobody listens on wraps errdefs.ErrUnavailable.
	DialSandbox(ctx context.Context, id string, port int) (net.Conn, error)
	// PortAccess returns the token that requests to ports other than envd's must carry in `e2b-traffic-access-token` ("" when the sandbox's traffic is public) and the Host header they reach the sandbox with (E2B's maskRequestHost, `${PORT}` standing for the port; "": the client's). Missing sandbox: errdefs.ErrNotFound.
	PortAccess(ctx context.Context, id string) (token, maskHost string, err error)
	// SignedFileSandbox finds the sandbox whose envd access token signed a
	// `/files` URL (E2B's uploadUrl/downloadUrl), or "" if none did.
	SignedFileSandbox(ctx context.Context, q url.Values, op string) string
	// Active marks sandbox id busy, for its idle TTL, until done is called.
	Active(ctx context.Context, id string) (done func())
	// SandboxTenant is the owner of sandbox id: data-plane requests carry
	// envd's token, not an API key, so the proxy keys its limit by it.
	SandboxTenant(ctx context.Context, id string) (tenant.ID, error)
}

// headerTrafficToken guards ports other than envd's on sandboxes created
// with network.allowPublicTraffic false, as E2B's client proxy does.
const headerTrafficToken = "E2b-Traffic-Access-Token"

// The proxy's own error messages. The first two are E2B's, word for word:
// SDKs and E2B's tests match them.
const (
	msgSandboxNotFound = "The sandbox was not found"
	msgPortNotOpen     = "The sandbox is running but port is not open"
	msgBadTrafficToken = "Missing or invalid traffic access token (header e2b-traffic-access-token)"
	msgInternalPath    = "Not found"
	msgConnectMethod   = "CONNECT is not supported through the sandbox proxy"
	msgUpstreamFailed  = "Error proxying the request to the sandbox"
)

// envdInternalPaths are envd routes only the orchestrator may call; the
// public proxy answers them 404 like E2B's does.
var envdInternalPaths = []string{"/init", "/freeze", "/unfreeze", "/collapse", "/fsfreeze", "/fsthaw", "/upgrade"}

// Proxy forwards data-plane requests to envd or to other ports in a sandbox.
//
// One upstream carries all of them, so connections to one port of one
// sandbox are kept alive and reused. Because a pooled connection to a
// sandbox that was paused would hang rather than fail (and so never trigger
// auto-resume), the lifecycle layer should call CloseSandbox when it pauses
// or kills a sandbox.
type Proxy struct {
	d      Lifecycle
	domain string
	log    *slog.Logger
	m      Metrics
	up     *Upstream
	rp     *httputil.ReverseProxy
	// limits, when set, rate-limits the data plane per sandbox owner
	// (class tenant.DataPlane).
	limits *ratelimit.Tenants
	// drainMax and drainTimeout bound the drain of a request body after an
	// error answer (drainAfterError): an upload larger or slower than this
	// still loses the answer, as before, rather than hold a connection and
	// a goroutine for it.
	drainMax     int64
	drainTimeout time.Duration
}

// Config configures a Proxy.
type Config struct {
	// Domain enables host routing (`<port>-<id>.<domain>`); "": headers only.
	Domain string
	Log    *slog.Logger
	// Metrics observes the proxy; nil: none.
	Metrics Metrics
	// Limits rate-limits the data plane per sandbox owner (class
	// tenant.DataPlane); nil: no limits.
	Limits *ratelimit.Tenants
}

// Labels the proxy reports its requests and bytes by.
const (
	PortEnvd = "envd" // requests to envd's port
	PortUser = "port" // requests to any other port in the sandbox
	PortNone = "none" // requests refused before a port was known

	DirectionIn  = "in"  // client to sandbox
	DirectionOut = "out" // sandbox to client
)

// Metrics is what the proxy reports (the server's Prometheus metrics).
type Metrics interface {
	// Request counts a request by port class and status.
	Request(portClass string, code int)
	// StreamOpened and StreamClosed bracket a forwarded request.
	StreamOpened()
	StreamClosed()
	// Bytes counts bytes carried in direction.
	Bytes(direction string, n int)
	// Rejected counts a request the data-plane limit refused.
	Rejected(tenant, class string)
}

type noMetrics struct{}

func (noMetrics) Request(string, int)     {}
func (noMetrics) StreamOpened()           {}
func (noMetrics) StreamClosed()           {}
func (noMetrics) Bytes(string, int)       {}
func (noMetrics) Rejected(string, string) {}

// proxyTarget is the sandbox and port a request goes to, carried in the
// request's context from Wrap to Rewrite and the error handler.
type proxyTarget struct {
	id       string
	port     int
	maskHost string // the Host a user port gets, if not the client's
}

type proxyTargetKey struct{}

// New returns a proxy into the sandboxes of lc.
func New(lc Lifecycle, cfg Config) *Proxy {
	log, m := cfg.Log, cfg.Metrics
	if log == nil {
		log = slog.Default()
	}
	if m == nil {
		m = noMetrics{}
	}
	p := &Proxy{d: lc, domain: cfg.Domain, log: log, m: m, limits: cfg.Limits,
		drainMax: 64 << 20, drainTimeout: 10 * time.Second}
	p.up = NewUpstream(lc.DialSandbox, m.Bytes)
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     p.up.Transport(),
		FlushInterval: -1, // every chunk at once: Connect server streams, SSE
		ErrorHandler:  p.upstreamError,
		// A Connect stream the sandbox breaks off ends with an error
		// envelope, not a cut connection (connectstream.go).
		ModifyResponse: modifyResponse,
		// Client disconnects mid-body are routine; keep them out of the
		// warning log.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return p
}

// Wrap sends data-plane requests (host `<port>-<id>.<domain>`, or the
// E2b-Sandbox-Id/E2b-Sandbox-Port headers) to the sandbox and everything
// else to api.
func (p *Proxy) Wrap(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, port, ok, err := dataPlaneTarget(r, p.domain)
		if !ok && r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
			// A pre-signed URL under E2B_SANDBOX_URL carries no routing
			// headers: the signature itself names the sandbox.
			op := "read"
			if r.Method == http.MethodPost {
				op = "write"
			}
			if id = p.d.SignedFileSandbox(r.Context(), r.URL.Query(), op); id != "" {
				p.serve(w, r, id, EnvdPort, nil)
				return
			}
		}
		if !ok {
			if isDataPlanePreflight(r) {
				writePreflight(w, r)
				return
			}
			api.ServeHTTP(w, r)
			return
		}
		p.serve(w, r, id, port, err)
	})
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, id string, port int, routeErr error) {
	class := PortNone
	if routeErr == nil {
		class = PortUser
		if port == EnvdPort {
			class = PortEnvd
		}
	}
	rec := &httpx.StatusRecorder{ResponseWriter: w}
	defer func() {
		code := rec.Status
		if code == 0 {
			code = http.StatusOK
		}
		p.m.Request(class, code)
	}()

	switch {
	case routeErr != nil:
		msg := "invalid E2b-Sandbox-Id or E2b-Sandbox-Port"
		if !errors.Is(routeErr, errBadRoute) {
			msg = routeErr.Error()
		}
		WriteError(rec, http.StatusBadRequest, "", msg)
		return
	case r.Method == http.MethodConnect:
		// envd answers CONNECT with a tunnel to any port: that must not be
		// reachable from outside, past the traffic token.
		WriteError(rec, http.StatusMethodNotAllowed, id, msgConnectMethod)
		return
	case port == EnvdPort && isEnvdInternalPath(r.URL.Path):
		WriteError(rec, http.StatusNotFound, id, msgInternalPath)
		return
	case !p.allowDataPlane(rec, r, id):
		return
	}
	target := proxyTarget{id: id, port: port}
	if port != EnvdPort {
		token, maskHost, err := p.d.PortAccess(r.Context(), id)
		if err != nil {
			p.writeUpstreamError(rec, r, target, err)
			return
		}
		target.maskHost = strings.ReplaceAll(maskHost, "${PORT}", strconv.Itoa(port))
		if token != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get(headerTrafficToken)), []byte(token)) != 1 {
			WriteError(rec, http.StatusForbidden, id, msgBadTrafficToken)
			return
		}
	}

	// Any data-plane request is activity for the idle TTL, for as long as
	// it lasts (streams and websockets included).
	defer p.d.Active(r.Context(), id)()
	p.m.StreamOpened()
	defer p.m.StreamClosed()
	if r.ProtoMajor == 1 {
		// Let the response flow while the request body still does (client
		// streams, bidirectional protocols); HTTP/2 always can.
		_ = http.NewResponseController(rec).EnableFullDuplex()
	}
	ctx, span := tracer.Start(r.Context(), "sandbox.proxy", trace.WithAttributes(
		attribute.String("sandbox.id", id), attribute.Int("sandbox.port", port), attribute.String("sandbox.port_class", class)))
	defer func() {
		span.SetAttributes(attribute.Int("http.response.status_code", rec.Status))
		span.End()
	}()
	ctx = context.WithValue(ctx, proxyTargetKey{}, target)
	var body *requestBody
	if r.ProtoMajor == 1 && r.Body != nil && r.Body != http.NoBody {
		body = &requestBody{src: r.Body}
		ctx = context.WithValue(ctx, requestBodyKey{}, body)
	}
	out := r.WithContext(ctx)
	if body != nil {
		out.Body = body
	}
	p.rp.ServeHTTP(rec, out)
	if body != nil && rec.Status >= http.StatusBadRequest {
		p.drainAfterError(rec, r, body, target)
	}
}

// tracer is the proxy's: a span per proxied request, whose context goes on
// to the sandbox in traceparent.
var tracer = otel.Tracer("github.com/sandboxd/sandboxd/server/proxy")

// rewrite points the outbound request at the sandbox. ReverseProxy has
// already removed hop-by-hop headers (keeping Upgrade for websockets) and
// X-Forwarded-*.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(proxyTargetKey{}).(proxyTarget)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = upstreamHost(t.id, t.port)
	if t.port == EnvdPort {
		pr.Out.Host = "" // the URL's host
	} else {
		// The user's server sees the host the client asked for (virtual
		// hosts, dev servers checking Host), unless the sandbox masks it.
		pr.Out.Host = pr.In.Host
		if t.maskHost != "" {
			pr.Out.Host = t.maskHost
		}
		pr.SetXForwarded()
	}
	// sandboxd's credentials are not the sandbox's business. Authorization
	// stays: envd takes the RPC user from it (Basic), user servers their own.
	pr.Out.Header.Del("X-Api-Key")
	pr.Out.Header.Del(headerTrafficToken)
	telemetry.Inject(pr.In.Context(), pr.Out.Header)
}

// requestBody stands between an HTTP/1.1 client's request body and the
// transport that forwards it, for the answers that come before the body's
// end (envd's 507 to an upload too large for the disk, with the body still
// arriving).
//
// Such an answer says Connection: close (answerEarly): Go's server may close
// the connection after it without saying so, and a client that reused it
// would meet the close under its next request.
//
// And an error answer is followed by a bounded drain of the rest of the body
// (drainAfterError). Without it, Go's server closes the connection with more
// than 256 KiB unread, the kernel answers the client's next bytes with a
// reset, and a client that reads the answer only once its upload is sent
// (undici, so the JS SDK's files.write) loses the answer to "fetch failed".
// Close detaches the transport instead of closing the client's body (the
// server closes that after the handler), so that the drain can still read
// it; a transport read after Close fails.
type requestBody struct {
	src      io.ReadCloser
	eof      atomic.Bool
	detached atomic.Bool
}

type requestBodyKey struct{}

// errBodyDetached ends a transport's read of a body the handler is done with.
var errBodyDetached = errors.New("proxy: request body read after the answer")

func (b *requestBody) Read(p []byte) (int, error) {
	if b.detached.Load() {
		return 0, errBodyDetached
	}
	n, err := b.src.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

func (b *requestBody) Close() error {
	b.detached.Store(true)
	return nil
}

// drainAfterError reads and discards what is left of the client's body once
// an error answer is written, so that a client that sends its whole body
// before it reads gets the answer (requestBody). The answer is flushed
// first: a client that reads as it sends has it at once.
func (p *Proxy) drainAfterError(w http.ResponseWriter, r *http.Request, b *requestBody, t proxyTarget) {
	b.detached.Store(true)
	if b.eof.Load() || r.Context().Err() != nil {
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	// The deadline also ends a transport read still in flight, which holds
	// the server body's lock the drain waits for.
	_ = rc.SetReadDeadline(time.Now().Add(p.drainTimeout))
	n, err := io.CopyN(io.Discard, b.src, p.drainMax)
	_ = rc.SetReadDeadline(time.Time{})
	if err == io.EOF {
		b.eof.Store(true)
	}
	p.log.Debug("proxy: drained the request body after an error answer", "sandbox_id", t.id, "port", t.port,
		"bytes", n, "complete", err == io.EOF)
}

// modifyResponse is ReverseProxy's ModifyResponse: what the proxy changes
// in envd's (or a sandbox port's) answer on its way to the client.
func modifyResponse(resp *http.Response) error {
	answerEarly(resp)
	guardConnectStream(resp)
	return nil
}

// answerEarly marks an answer to a request whose body was not read to its
// end as the connection's last (requestBody).
func answerEarly(resp *http.Response) {
	if b, ok := resp.Request.Context().Value(requestBodyKey{}).(*requestBody); ok && !b.eof.Load() {
		resp.Header.Set("Connection", "close")
	}
}

// CloseSandbox closes every upstream connection to sandbox id, idle or in
// use: requests and streams through them fail, and the next request dials
// afresh (and so resumes a paused sandbox, or answers 502 for a dead one).
// The lifecycle layer calls it when it pauses or kills a sandbox.
func (p *Proxy) CloseSandbox(id string) { p.up.CloseSandbox(id) }

// Close closes all upstream connections, including upgraded ones that
// http.Server.Shutdown does not see.
func (p *Proxy) Close() { p.up.Close() }

// upstreamError is the ReverseProxy's error handler: the dial or the round
// trip failed before a response was written.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(proxyTargetKey{}).(proxyTarget)
	p.writeUpstreamError(w, r, t, err)
}

// writeUpstreamError answers a failure to reach the sandbox, by error kind.
func (p *Proxy) writeUpstreamError(w http.ResponseWriter, r *http.Request, t proxyTarget, err error) {
	if r.Context().Err() != nil {
		// The client went away; nobody reads this answer.
		p.log.Debug("proxy: client gone", "sandbox_id", t.id, "port", t.port, "err", err)
		w.WriteHeader(499)
		return
	}
	status, msg := classifyUpstreamError(err)
	if status == 0 {
		// No kind: the connection broke (a killed sandbox can do that to
		// a pooled connection). Tell a dead sandbox apart from a failing
		// one by asking whether it still exists.
		status, msg = http.StatusBadGateway, msgUpstreamFailed
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		_, _, terr := p.d.PortAccess(ctx, t.id)
		cancel()
		if errors.Is(terr, errdefs.ErrNotFound) {
			msg = msgSandboxNotFound
		}
	}
	level := slog.LevelDebug
	if msg == msgUpstreamFailed {
		level = slog.LevelWarn
	}
	p.log.Log(r.Context(), level, "proxy: cannot reach sandbox", "sandbox_id", t.id, "port", t.port,
		"method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	WriteError(w, status, t.id, msg)
}

// classifyUpstreamError maps an error kind to the proxy's status and message;
// 0 when err has no kind the proxy knows.
func classifyUpstreamError(err error) (int, string) {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusBadGateway, msgSandboxNotFound
	case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, envdapi.ErrPortNotOpen),
		errors.Is(err, syscall.ECONNREFUSED):
		return http.StatusBadGateway, msgPortNotOpen
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden, "Access to the sandbox was denied"
	case errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict, "The sandbox is changing state, try again"
	case errors.Is(err, errdefs.ErrResourceExhausted), errors.Is(err, errdefs.ErrRateLimited):
		return http.StatusTooManyRequests, "Too many requests to the sandbox"
	case errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "The sandbox did not answer in time"
	}
	return 0, ""
}

// Error is E2B's client-proxy error body: the SDKs read a 502 with it as
// "the sandbox is gone".
type Error struct {
	SandboxID string `json:"sandboxId,omitempty"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

// WriteError answers status in the proxy's error shape.
func WriteError(w http.ResponseWriter, status int, id, msg string) {
	b, _ := json.Marshal(Error{SandboxID: id, Message: msg, Code: status})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// isEnvdInternalPath reports whether p names one of envd's orchestrator-only
// routes, however spelled (dot segments, doubled or trailing slashes).
func isEnvdInternalPath(p string) bool {
	p = path.Clean("/" + p)
	for _, ip := range envdInternalPaths {
		if p == ip || strings.HasPrefix(p, ip+"/") {
			return true
		}
	}
	return false
}

// isDataPlanePreflight reports a browser's CORS preflight for a request that
// will carry the routing headers: the preflight itself carries none, so the
// proxy answers it, as envd would.
func isDataPlanePreflight(r *http.Request) bool {
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	for _, v := range r.Header.Values("Access-Control-Request-Headers") {
		for h := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(h), headerSandboxID) {
				return true
			}
		}
	}
	return false
}

// writePreflight answers like envd's CORS layer: any origin, the requested
// headers, envd's methods.
func writePreflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Methods", "HEAD, GET, POST, PUT, PATCH, DELETE")
	h.Set("Access-Control-Allow-Headers", strings.Join(r.Header.Values("Access-Control-Request-Headers"), ", "))
	h.Set("Access-Control-Max-Age", "7200")
	w.WriteHeader(http.StatusNoContent)
}

// allowDataPlane applies the data-plane class of the owner of sandbox id.
// Over the limit it answers 429 in the proxy's error shape, with
// Retry-After and X-RateLimit-*, and reports false. An unknown sandbox
// passes: the dial answers for it.
func (p *Proxy) allowDataPlane(w http.ResponseWriter, r *http.Request, id string) bool {
	if p.limits == nil || p.limits.Policy.Limit("", tenant.DataPlane).Unlimited() {
		return true
	}
	t, err := p.d.SandboxTenant(r.Context(), id)
	if err != nil {
		return true
	}
	d := p.limits.Allow(t, tenant.DataPlane)
	if d.Allowed || d.Limit.Unlimited() {
		return true
	}
	retry := httpx.LimitHeaders(w, d)
	WriteError(w, http.StatusTooManyRequests, id, httpx.LimitMessage(d, "data-plane", retry))
	p.m.Rejected(string(t), string(tenant.DataPlane))
	return false
}
