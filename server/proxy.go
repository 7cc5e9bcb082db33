package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/ratelimit"
)

// sandboxDialer is what the proxy needs from the lifecycle layer.
type sandboxDialer interface {
	// DialSandbox opens a stream to port inside sandbox id, resuming the sandbox first if it is paused with auto-resume. A missing, killed or (paused without auto-resume) sandbox fails with an error wrapping errdefs.ErrNotFound; a port nobody listens on wraps errdefs.ErrUnavailable.
	DialSandbox(ctx context.Context, id string, port int) (net.Conn, error)
	// TrafficToken returns the token that requests to ports other than envd's must carry in `e2b-traffic-access-token`, or "" when the sandbox's traffic is public. Missing sandbox: errdefs.ErrNotFound.
	TrafficToken(ctx context.Context, id string) (string, error)
	// SignedFileSandbox finds the sandbox whose envd access token signed a
	// `/files` URL (E2B's uploadUrl/downloadUrl), or "" if none did.
	SignedFileSandbox(ctx context.Context, q url.Values, op string) string
}

// activityTracker is implemented by a sandboxDialer that keeps idle TTLs
// (sandbox.Manager): Active marks the sandbox busy until done is called.
type activityTracker interface {
	Active(ctx context.Context, id string) (done func())
}

// headerTrafficToken guards ports other than envd's on sandboxes created
// with network.allowPublicTraffic false (wire doc §5).
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

// upstreamSuffix ends the synthetic host of an upstream URL,
// `<id>-<port>.sandbox`. The transport pools connections by it, and its
// dialer decodes the sandbox and port from it; it is never resolved.
const upstreamSuffix = ".sandbox"

// proxy forwards data-plane requests to envd or to other ports in a sandbox.
//
// One http.Transport carries all of them, so connections to one port of one
// sandbox are kept alive and reused. Because a pooled connection to a
// sandbox that was paused would hang rather than fail (and so never trigger
// auto-resume), the lifecycle layer should call CloseSandbox when it pauses
// or kills a sandbox.
type proxy struct {
	d      sandboxDialer
	domain string
	log    *slog.Logger
	m      *Metrics
	tr     *http.Transport
	rp     *httputil.ReverseProxy
	// limits, when set, rate-limits the data plane per sandbox owner
	// (class tenant.DataPlane); lm counts its rejections.
	limits *ratelimit.Tenants
	lm     *limitMetrics

	mu    sync.Mutex
	conns map[string]map[*proxyConn]struct{} // by sandbox id; every open upstream connection
}

// proxyTarget is the sandbox and port a request goes to, carried in the
// request's context from Wrap to Rewrite and the error handler.
type proxyTarget struct {
	id   string
	port int
}

type proxyTargetKey struct{}

func newProxy(d sandboxDialer, domain string, log *slog.Logger, m *Metrics) *proxy {
	if log == nil {
		log = slog.Default()
	}
	p := &proxy{d: d, domain: domain, log: log, m: m, conns: map[string]map[*proxyConn]struct{}{}}
	var protocols http.Protocols
	protocols.SetHTTP1(true) // envd and user ports are spoken to in HTTP/1.1
	p.tr = &http.Transport{
		DialContext: p.dialUpstream,
		Protocols:   &protocols,
		// Pass bodies through untouched: transparent gzip would change
		// them and buffer streams.
		DisableCompression:    true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     p.tr,
		FlushInterval: -1, // every chunk at once: Connect server streams, SSE
		ErrorHandler:  p.upstreamError,
		// Client disconnects mid-body are routine; keep them out of the
		// warning log.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return p
}

// Wrap sends data-plane requests (host `<port>-<id>.<domain>`, or the
// E2b-Sandbox-Id/E2b-Sandbox-Port headers) to the sandbox and everything
// else to api.
func (p *proxy) Wrap(api http.Handler) http.Handler {
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

func (p *proxy) serve(w http.ResponseWriter, r *http.Request, id string, port int, routeErr error) {
	class := portClassNone
	if routeErr == nil {
		class = portClassPort
		if port == EnvdPort {
			class = portClassEnvd
		}
	}
	rec := &statusRecorder{ResponseWriter: w}
	defer func() {
		code := rec.status
		if code == 0 {
			code = http.StatusOK
		}
		p.m.proxyRequest(class, code)
	}()

	switch {
	case routeErr != nil:
		msg := "invalid E2b-Sandbox-Id or E2b-Sandbox-Port"
		if !errors.Is(routeErr, errBadRoute) {
			msg = routeErr.Error()
		}
		writeProxyError(rec, http.StatusBadRequest, "", msg)
		return
	case r.Method == http.MethodConnect:
		// envd answers CONNECT with a tunnel to any port: that must not be
		// reachable from outside, past the traffic token.
		writeProxyError(rec, http.StatusMethodNotAllowed, id, msgConnectMethod)
		return
	case port == EnvdPort && isEnvdInternalPath(r.URL.Path):
		writeProxyError(rec, http.StatusNotFound, id, msgInternalPath)
		return
	case !p.allowDataPlane(rec, r, id):
		return
	}
	if port != EnvdPort {
		token, err := p.d.TrafficToken(r.Context(), id)
		if err != nil {
			p.writeUpstreamError(rec, r, proxyTarget{id, port}, err)
			return
		}
		if token != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get(headerTrafficToken)), []byte(token)) != 1 {
			writeProxyError(rec, http.StatusForbidden, id, msgBadTrafficToken)
			return
		}
	}

	if a, ok := p.d.(activityTracker); ok {
		// Any data-plane request is activity for the idle TTL, for as long
		// as it lasts (streams and websockets included).
		defer a.Active(r.Context(), id)()
	}
	p.m.proxyStreamOpened()
	defer p.m.proxyStreamClosed()
	if r.ProtoMajor == 1 {
		// Let the response flow while the request body still does (client
		// streams, bidirectional protocols); HTTP/2 always can.
		_ = http.NewResponseController(rec).EnableFullDuplex()
	}
	ctx := context.WithValue(r.Context(), proxyTargetKey{}, proxyTarget{id, port})
	p.rp.ServeHTTP(rec, r.WithContext(ctx))
}

// rewrite points the outbound request at the sandbox. ReverseProxy has
// already removed hop-by-hop headers (keeping Upgrade for websockets) and
// X-Forwarded-*.
func (p *proxy) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(proxyTargetKey{}).(proxyTarget)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = upstreamHost(t.id, t.port)
	if t.port == EnvdPort {
		pr.Out.Host = "" // the URL's host
	} else {
		// The user's server sees the host the client asked for (virtual
		// hosts, dev servers checking Host).
		pr.Out.Host = pr.In.Host
		pr.SetXForwarded()
	}
	// sandboxd's credentials are not the sandbox's business. Authorization
	// stays: envd takes the RPC user from it (Basic), user servers their own.
	pr.Out.Header.Del("X-Api-Key")
	pr.Out.Header.Del(headerTrafficToken)
}

func upstreamHost(id string, port int) string {
	return id + "-" + strconv.Itoa(port) + upstreamSuffix
}

// parseUpstreamHost decodes upstreamHost's output, with or without a port.
func parseUpstreamHost(addr string) (id string, port int, ok bool) {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		addr = h
	}
	label, ok := strings.CutSuffix(addr, upstreamSuffix)
	if !ok {
		return "", 0, false
	}
	id, ps, ok := strings.Cut(label, "-")
	if !ok || !validSandboxID(id) {
		return "", 0, false
	}
	port, err := parsePort(ps)
	if err != nil {
		return "", 0, false
	}
	return id, port, true
}

// dialUpstream is the transport's dialer: it opens a connection into the
// sandbox named by the synthetic host.
func (p *proxy) dialUpstream(ctx context.Context, _, addr string) (net.Conn, error) {
	id, port, ok := parseUpstreamHost(addr)
	if !ok {
		return nil, fmt.Errorf("proxy: unexpected upstream address %q", addr)
	}
	c, err := p.d.DialSandbox(ctx, id, port)
	if err != nil {
		return nil, err
	}
	pc := &proxyConn{Conn: c, p: p, id: id}
	p.mu.Lock()
	set := p.conns[id]
	if set == nil {
		set = map[*proxyConn]struct{}{}
		p.conns[id] = set
	}
	set[pc] = struct{}{}
	p.mu.Unlock()
	return pc, nil
}

// CloseSandbox closes every upstream connection to sandbox id, idle or in
// use: requests and streams through them fail, and the next request dials
// afresh (and so resumes a paused sandbox, or answers 502 for a dead one).
// The lifecycle layer calls it when it pauses or kills a sandbox.
func (p *proxy) CloseSandbox(id string) {
	p.mu.Lock()
	set := p.conns[id]
	delete(p.conns, id)
	p.mu.Unlock()
	for c := range set {
		_ = c.Close()
	}
}

// Close closes all upstream connections, including upgraded ones that
// http.Server.Shutdown does not see.
func (p *proxy) Close() {
	p.tr.CloseIdleConnections()
	p.mu.Lock()
	all := p.conns
	p.conns = map[string]map[*proxyConn]struct{}{}
	p.mu.Unlock()
	for _, set := range all {
		for c := range set {
			_ = c.Close()
		}
	}
}

// proxyConn is an upstream connection: it counts the bytes it carries and
// leaves the proxy's set when closed.
type proxyConn struct {
	net.Conn
	p    *proxy
	id   string
	once sync.Once
}

func (c *proxyConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.p.m.proxyBytesAdd(directionOut, n)
	return n, err
}

func (c *proxyConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.p.m.proxyBytesAdd(directionIn, n)
	return n, err
}

func (c *proxyConn) Close() error {
	c.once.Do(func() {
		c.p.mu.Lock()
		if set := c.p.conns[c.id]; set != nil {
			delete(set, c)
			if len(set) == 0 {
				delete(c.p.conns, c.id)
			}
		}
		c.p.mu.Unlock()
	})
	return c.Conn.Close()
}

// upstreamError is the ReverseProxy's error handler: the dial or the round
// trip failed before a response was written.
func (p *proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(proxyTargetKey{}).(proxyTarget)
	p.writeUpstreamError(w, r, t, err)
}

// writeUpstreamError answers a failure to reach the sandbox, by error kind.
func (p *proxy) writeUpstreamError(w http.ResponseWriter, r *http.Request, t proxyTarget, err error) {
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
		_, terr := p.d.TrafficToken(ctx, t.id)
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
	writeProxyError(w, status, t.id, msg)
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

// proxyError is E2B's proxy error body (wire doc §5).
type proxyError struct {
	SandboxID string `json:"sandboxId,omitempty"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

func writeProxyError(w http.ResponseWriter, status int, id, msg string) {
	b, _ := json.Marshal(proxyError{SandboxID: id, Message: msg, Code: status})
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
