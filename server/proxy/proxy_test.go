package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd"
	"github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/api/process/processconnect"
	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/tenant"
)

// fakeSandboxDialer maps sandboxes and their ports to loopback addresses.
type fakeSandboxDialer struct {
	mu    sync.Mutex
	sbx   map[string]*fakeProxySandbox
	dials atomic.Int32
}

type fakeProxySandbox struct {
	ports    map[int]string // port -> loopback address
	token    string         // traffic token
	maskHost string         // maskRequestHost
}

func (f *fakeSandboxDialer) DialSandbox(ctx context.Context, id string, port int) (net.Conn, error) {
	f.dials.Add(1)
	f.mu.Lock()
	sb := f.sbx[id]
	var addr string
	if sb != nil {
		addr = sb.ports[port]
	}
	f.mu.Unlock()
	if sb == nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if addr == "" {
		return nil, fmt.Errorf("sandbox %q port %d: %w", id, port, errdefs.ErrUnavailable)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("sandbox %q port %d: %w: %w", id, port, errdefs.ErrUnavailable, err)
	}
	return c, err
}

func (f *fakeSandboxDialer) PortAccess(_ context.Context, id string) (string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sbx[id]
	if sb == nil {
		return "", "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return sb.token, sb.maskHost, nil
}

func (f *fakeSandboxDialer) SignedFileSandbox(context.Context, url.Values, string) string { return "" }

func (f *fakeSandboxDialer) Active(context.Context, string) func() { return func() {} }

func (f *fakeSandboxDialer) SandboxTenant(_ context.Context, id string) (tenant.ID, error) {
	if _, _, err := f.PortAccess(context.Background(), id); err != nil {
		return "", err
	}
	return "acme", nil
}

func (f *fakeSandboxDialer) set(id string, sb *fakeProxySandbox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sbx[id] = sb
}

const proxyTestDomain = "sbx.test"

// testMetrics records what the proxy reports, by the series names the
// server exports it under.
type testMetrics struct {
	mu     sync.Mutex
	series map[string]float64
}

func (m *testMetrics) add(series string, v float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.series[series] += v
}

func (m *testMetrics) Request(portClass string, code int) {
	m.add(fmt.Sprintf(`sandboxd_proxy_requests_total{code="%d",port_class="%s"}`, code, portClass), 1)
}
func (m *testMetrics) StreamOpened() { m.add("sandboxd_proxy_open_streams", 1) }
func (m *testMetrics) StreamClosed() { m.add("sandboxd_proxy_open_streams", -1) }
func (m *testMetrics) Bytes(direction string, n int) {
	m.add(fmt.Sprintf(`sandboxd_proxy_bytes_total{direction="%s"}`, direction), float64(n))
}
func (m *testMetrics) Rejected(tenant, class string) {
	m.add(fmt.Sprintf(`sandboxd_rate_limited_total{class="%s",tenant="%s"}`, class, tenant), 1)
}

func scrapeMetrics(_ *testing.T, m *testMetrics) map[string]float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.series)
}

func scrapeMetricsText(t *testing.T, m *testMetrics) string {
	return fmt.Sprint(scrapeMetrics(t, m))
}

type proxyEnv struct {
	d    *fakeSandboxDialer
	m    *testMetrics
	p    *Proxy
	srv  *httptest.Server // sandboxd: proxy in front of a stub API
	envd *httptest.Server // the envd of sandbox "sbx1"
}

func newProxyEnv(t *testing.T) *proxyEnv {
	t.Helper()
	es := envd.New(envd.Config{Log: slog.New(slog.DiscardHandler), DefaultUser: "root", DiskPath: t.TempDir()})
	t.Cleanup(es.Close)
	ets := httptest.NewServer(es.Handler())
	t.Cleanup(ets.Close)

	d := &fakeSandboxDialer{sbx: map[string]*fakeProxySandbox{
		"sbx1": {ports: map[int]string{EnvdPort: ets.Listener.Addr().String()}},
	}}
	m := &testMetrics{series: map[string]float64{}}
	p := New(d, Config{Domain: proxyTestDomain, Log: slog.New(slog.DiscardHandler), Metrics: m})
	t.Cleanup(p.Close)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Test-Api", "1")
		w.WriteHeader(http.StatusTeapot)
	})
	srv := httptest.NewUnstartedServer(p.Wrap(api))
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &protocols
	srv.Start()
	t.Cleanup(srv.Close)
	return &proxyEnv{d: d, m: m, p: p, srv: srv, envd: ets}
}

// clientFor returns a client speaking HTTP/1.1 or h2c (prior knowledge).
func proxyClient(h2c bool) *http.Client {
	var protocols http.Protocols
	if h2c {
		protocols.SetUnencryptedHTTP2(true)
	} else {
		protocols.SetHTTP1(true)
	}
	return &http.Client{Transport: &http.Transport{Protocols: &protocols}}
}

func proxyDo(t *testing.T, c *http.Client, req *http.Request) (*http.Response, string) {
	t.Helper()
	if c == nil {
		c = proxyClient(false)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func proxyReq(t *testing.T, method, url string, body io.Reader, hdr map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	return req
}

func proxyEnvdHeaders(id string) map[string]string {
	return map[string]string{headerSandboxID: id, headerSandboxPort: strconv.Itoa(EnvdPort)}
}

// checkProxyError checks E2B's proxy error body and returns its message.
func checkProxyError(t *testing.T, resp *http.Response, body string, status int) string {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var e Error
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != status || e.Message == "" {
		t.Fatalf("body %q: want {sandboxId, message, code: %d}", body, status)
	}
	return e.Message
}

func TestProxyRouting(t *testing.T) {
	env := newProxyEnv(t)
	for _, h2c := range []bool{false, true} {
		c := proxyClient(h2c)
		// Header routing, as with E2B_SANDBOX_URL.
		resp, body := proxyDo(t, c, proxyReq(t, "GET", env.srv.URL+"/health", nil, proxyEnvdHeaders("sbx1")))
		if resp.StatusCode != http.StatusNoContent || body != "" {
			t.Fatalf("h2c=%v header-routed /health: %d %q", h2c, resp.StatusCode, body)
		}
		// Host routing, as with <port>-<id>.<domain>.
		resp, body = proxyDo(t, c, proxyReq(t, "GET", env.srv.URL+"/health", nil,
			map[string]string{"Host": "49983-sbx1." + proxyTestDomain + ":443"}))
		if resp.StatusCode != http.StatusNoContent || body != "" {
			t.Fatalf("h2c=%v host-routed /health: %d %q", h2c, resp.StatusCode, body)
		}
		// Anything else is the API's.
		resp, _ = proxyDo(t, c, proxyReq(t, "GET", env.srv.URL+"/health", nil, nil))
		if resp.StatusCode != http.StatusTeapot || resp.Header.Get("X-Test-Api") != "1" {
			t.Fatalf("h2c=%v API request: %d", h2c, resp.StatusCode)
		}
		resp, _ = proxyDo(t, c, proxyReq(t, "GET", env.srv.URL+"/health", nil,
			map[string]string{"Host": "api." + proxyTestDomain}))
		if resp.StatusCode != http.StatusTeapot {
			t.Fatalf("h2c=%v API host: %d", h2c, resp.StatusCode)
		}
	}
}

func TestProxyPoolsConnections(t *testing.T) {
	env := newProxyEnv(t)
	c := proxyClient(false)
	for range 5 {
		if resp, _ := proxyDo(t, c, proxyReq(t, "GET", env.srv.URL+"/health", nil, proxyEnvdHeaders("sbx1"))); resp.StatusCode != 204 {
			t.Fatalf("/health: %d", resp.StatusCode)
		}
	}
	if n := env.d.dials.Load(); n != 1 {
		t.Fatalf("%d dials for 5 sequential requests, want 1 (pooled)", n)
	}
	// CloseSandbox drops the pooled connection; the next request dials.
	env.p.CloseSandbox("sbx1")
	env.p.up.mu.Lock()
	left := len(env.p.up.conns["sbx1"])
	env.p.up.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d connections left after CloseSandbox", left)
	}
	if resp, _ := proxyDo(t, c, proxyReq(t, "GET", env.srv.URL+"/health", nil, proxyEnvdHeaders("sbx1"))); resp.StatusCode != 204 {
		t.Fatalf("/health after CloseSandbox: %d", resp.StatusCode)
	}
	if n := env.d.dials.Load(); n != 2 {
		t.Fatalf("%d dials, want 2", n)
	}
}

// proxyHeaderTransport adds headers to every request, as the SDKs do, and
// remembers the protocol of the last response.
type proxyHeaderTransport struct {
	base  http.RoundTripper
	hdr   map[string]string
	proto atomic.Value
}

func (h *proxyHeaderTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.hdr {
		r.Header.Set(k, v)
	}
	resp, err := h.base.RoundTrip(r)
	if resp != nil {
		h.proto.Store(resp.Proto)
	}
	return resp, err
}

// TestProxyConnectStream runs process.Start through the proxy over HTTP/1.1
// (Python SDK) and h2c (Node): the two lines must arrive as separate events,
// the second one 200 ms after the first, i.e. nothing buffers the stream.
func TestProxyConnectStream(t *testing.T) {
	env := newProxyEnv(t)
	for _, tc := range []struct {
		name  string
		h2c   bool
		proto string
	}{{"http1", false, "HTTP/1.1"}, {"h2c", true, "HTTP/2.0"}} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := proxyEnvdHeaders("sbx1")
			hdr["Authorization"] = "Basic cm9vdDo=" // user root; must reach envd
			ht := &proxyHeaderTransport{base: proxyClient(tc.h2c).Transport, hdr: hdr}
			pc := processconnect.NewProcessClient(&http.Client{Transport: ht}, env.srv.URL, connect.WithProtoJSON())
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{
				Cmd: "sh", Args: []string{"-c", "echo a; sleep 0.2; echo b"},
			}}))
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			var outs []string
			var at []time.Time
			var started, ended bool
			for stream.Receive() {
				ev := stream.Msg().GetEvent()
				switch {
				case ev.GetStart() != nil:
					started = true
				case ev.GetData() != nil:
					outs = append(outs, string(ev.GetData().GetStdout()))
					at = append(at, time.Now())
				case ev.GetEnd() != nil:
					ended = true
					if !ev.GetEnd().GetExited() || ev.GetEnd().GetExitCode() != 0 {
						t.Fatalf("end event %v", ev.GetEnd())
					}
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if !started || !ended {
				t.Fatalf("start %v end %v", started, ended)
			}
			if len(outs) != 2 || outs[0] != "a\n" || outs[1] != "b\n" {
				t.Fatalf("stdout events %q, want [a\\n b\\n]", outs)
			}
			if gap := at[1].Sub(at[0]); gap < 120*time.Millisecond {
				t.Fatalf("events %v apart: the stream was buffered", gap)
			}
			if got := ht.proto.Load(); got != tc.proto {
				t.Fatalf("spoke %v, want %s", got, tc.proto)
			}
		})
	}
}

// echoUpgradeServer answers any request with 101 and then echoes bytes.
func echoUpgradeServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				if !strings.EqualFold(req.Header.Get("Upgrade"), "echo") {
					_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
				_, _ = io.Copy(c, br)
			})
		}
	})
	return ln.Addr().String()
}

func TestProxyUpgrade(t *testing.T) {
	env := newProxyEnv(t)
	env.d.set("sbx2", &fakeProxySandbox{ports: map[int]string{8080: echoUpgradeServer(t)}})

	c, err := net.Dial("tcp", env.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: 8080-sbx2."+proxyTestDomain+"\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || !strings.EqualFold(resp.Header.Get("Upgrade"), "echo") {
		t.Fatalf("upgrade answered %d %v", resp.StatusCode, resp.Header)
	}
	for _, msg := range []string{"hello\n", "world\n"} {
		_, _ = io.WriteString(c, msg)
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo %q: got %q, %v", msg, got, err)
		}
	}
	c.Close()
	proxyWaitFor(t, "open streams back to 0", func() bool { return scrapeMetrics(t, env.m)["sandboxd_proxy_open_streams"] == 0 })
	if scrapeMetrics(t, env.m)[`sandboxd_proxy_requests_total{code="101",port_class="port"}`] != 1 {
		t.Fatalf("101 not counted:\n%s", scrapeMetricsText(t, env.m))
	}
}

func TestProxyUnknownSandbox(t *testing.T) {
	env := newProxyEnv(t)
	for _, hdr := range []map[string]string{
		proxyEnvdHeaders("nope"),
		{"Host": "49983-nope." + proxyTestDomain},
		{"Host": "8080-nope." + proxyTestDomain}, // other ports: the traffic-token lookup says it first
	} {
		resp, body := proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/health", nil, hdr))
		const want = `{"sandboxId":"nope","message":"The sandbox was not found","code":502}`
		if resp.StatusCode != http.StatusBadGateway || body != want {
			t.Fatalf("%v: %d %s, want 502 %s", hdr, resp.StatusCode, body, want)
		}
		checkProxyError(t, resp, body, http.StatusBadGateway)
	}
}

func TestProxyPortNotOpen(t *testing.T) {
	env := newProxyEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	env.d.set("sbx2", &fakeProxySandbox{ports: map[int]string{8081: closed}})
	for _, port := range []string{"8081", "8082"} { // refused; not mapped at all
		resp, body := proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/", nil,
			map[string]string{headerSandboxID: "sbx2", headerSandboxPort: port}))
		if msg := checkProxyError(t, resp, body, http.StatusBadGateway); msg != msgPortNotOpen {
			t.Fatalf("port %s: message %q", port, msg)
		}
	}
}

// A connection that breaks without an error kind: 502, and "not found" only
// if the sandbox is gone.
func TestProxyBrokenUpstream(t *testing.T) {
	env := newProxyEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	env.d.set("sbx2", &fakeProxySandbox{ports: map[int]string{EnvdPort: ln.Addr().String()}})
	resp, body := proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/health", nil, proxyEnvdHeaders("sbx2")))
	if msg := checkProxyError(t, resp, body, http.StatusBadGateway); msg != msgUpstreamFailed {
		t.Fatalf("message %q", msg)
	}
}

// userServer is a port inside a sandbox: it reports what it received.
func proxyUserServer(t *testing.T) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{
			"host":          r.Host,
			"path":          r.URL.RequestURI(),
			"apiKey":        r.Header.Get("X-Api-Key"),
			"authorization": r.Header.Get("Authorization"),
			"traffic":       r.Header.Get(headerTrafficToken),
			"sandboxId":     r.Header.Get(headerSandboxID),
			"forwardedHost": r.Header.Get("X-Forwarded-Host"),
		})
	}))
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

func TestProxyTrafficToken(t *testing.T) {
	env := newProxyEnv(t)
	env.d.set("sbx2", &fakeProxySandbox{
		ports: map[int]string{8080: proxyUserServer(t), EnvdPort: env.envd.Listener.Addr().String()},
		token: "s3cret",
	})
	host := "8080-sbx2." + proxyTestDomain
	for _, tok := range []string{"", "wrong", "s3cre"} {
		hdr := map[string]string{"Host": host}
		if tok != "" {
			hdr["e2b-traffic-access-token"] = tok
		}
		resp, body := proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/", nil, hdr))
		checkProxyError(t, resp, body, http.StatusForbidden)
	}
	resp, body := proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/a/b?c=d", nil, map[string]string{
		"Host":                     host,
		"E2B-Traffic-Access-Token": "s3cret",
		"X-API-KEY":                "e2b_0123456789012345678901234567890123456789",
		"Authorization":            "Bearer user-app-token",
	}))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("with token: %d %s", resp.StatusCode, body)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"host": host, "path": "/a/b?c=d", "apiKey": "", "authorization": "Bearer user-app-token",
		"traffic": "", "sandboxId": "", "forwardedHost": host,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("upstream saw %s=%q, want %q", k, got[k], v)
		}
	}
	// envd's port is exempt from the traffic token.
	if resp, _ := proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/health", nil, proxyEnvdHeaders("sbx2"))); resp.StatusCode != 204 {
		t.Fatalf("envd port without traffic token: %d", resp.StatusCode)
	}
	// A public sandbox needs none, and routing headers reach the port.
	env.d.set("sbx3", &fakeProxySandbox{ports: map[int]string{8080: proxyUserServer(t)}})
	resp, body = proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/", nil, map[string]string{headerSandboxID: "sbx3", headerSandboxPort: "8080"}))
	if resp.StatusCode != 200 || !strings.Contains(body, `"sandboxId":"sbx3"`) {
		t.Fatalf("public sandbox: %d %s", resp.StatusCode, body)
	}
}

// TestProxyMaskRequestHost: a sandbox's maskRequestHost is the Host its
// user ports see, ${PORT} replaced; envd's port keeps its own.
func TestProxyMaskRequestHost(t *testing.T) {
	env := newProxyEnv(t)
	env.d.set("sbx4", &fakeProxySandbox{
		ports:    map[int]string{8080: proxyUserServer(t), EnvdPort: env.envd.Listener.Addr().String()},
		maskHost: "localhost:${PORT}",
	})
	resp, body := proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/", nil, map[string]string{"Host": "8080-sbx4." + proxyTestDomain}))
	if resp.StatusCode != 200 || !strings.Contains(body, `"host":"localhost:8080"`) || !strings.Contains(body, `"forwardedHost":"8080-sbx4.`+proxyTestDomain+`"`) {
		t.Fatalf("masked host: %d %s, want Host localhost:8080 and the client's in X-Forwarded-Host", resp.StatusCode, body)
	}
}

func TestProxyRefusesInternalPaths(t *testing.T) {
	env := newProxyEnv(t)
	for _, p := range []string{"/init", "//init", "/init/", "/./init", "/%69nit", "/freeze", "/unfreeze",
		"/collapse", "/fsfreeze", "/fsthaw", "/upgrade"} {
		resp, body := proxyDo(t, nil, proxyReq(t, "POST", env.srv.URL+p, strings.NewReader(`{"envVars":{"X":"1"}}`), proxyEnvdHeaders("sbx1")))
		checkProxyError(t, resp, body, http.StatusNotFound)
	}
	// The /init above never reached envd.
	resp, body := proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/envs", nil, proxyEnvdHeaders("sbx1")))
	if resp.StatusCode != 200 || strings.Contains(body, `"X"`) {
		t.Fatalf("/envs: %d %s", resp.StatusCode, body)
	}
	// Other ports may have such paths.
	env.d.set("sbx2", &fakeProxySandbox{ports: map[int]string{8080: proxyUserServer(t)}})
	if resp, _ := proxyDo(t, nil, proxyReq(t, "POST", env.srv.URL+"/init", nil,
		map[string]string{headerSandboxID: "sbx2", headerSandboxPort: "8080"})); resp.StatusCode != 200 {
		t.Fatalf("/init on a user port: %d", resp.StatusCode)
	}

	// CONNECT would reach envd's tunnel to any port.
	c, err := net.Dial("tcp", env.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\nE2b-Sandbox-Id: sbx1\r\nE2b-Sandbox-Port: 49983\r\n\r\n")
	cresp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	cresp.Body.Close()
	if cresp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("CONNECT: %d", cresp.StatusCode)
	}
}

func TestProxyBadRouting(t *testing.T) {
	env := newProxyEnv(t)
	for _, hdr := range []map[string]string{
		{headerSandboxID: "sbx1"},
		{headerSandboxPort: "49983"},
		{headerSandboxID: "sbx1", headerSandboxPort: "http"},
		{headerSandboxID: "sbx1", headerSandboxPort: "70000"},
		{headerSandboxID: "SBX-1", headerSandboxPort: "49983"},
	} {
		resp, body := proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/health", nil, hdr))
		checkProxyError(t, resp, body, http.StatusBadRequest)
	}
}

func TestProxyCORSPreflight(t *testing.T) {
	env := newProxyEnv(t)
	resp, _ := proxyDo(t, nil, proxyReq(t, "OPTIONS", env.srv.URL+"/process.Process/Start", nil, map[string]string{
		"Origin":                         "http://localhost:5173",
		"Access-Control-Request-Method":  "POST",
		"Access-Control-Request-Headers": "connect-protocol-version,content-type,e2b-sandbox-id,e2b-sandbox-port",
	}))
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "e2b-sandbox-id") {
		t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
}

// TestProxyClientDisconnect: a client that goes away mid-stream ends the
// upstream request too.
func TestProxyClientDisconnect(t *testing.T) {
	env := newProxyEnv(t)
	gone := make(chan struct{}, 2)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
			gone <- struct{}{}
		case <-time.After(20 * time.Second):
		}
	}))
	defer up.Close()
	env.d.set("sbx2", &fakeProxySandbox{ports: map[int]string{3000: up.Listener.Addr().String()}})

	for _, h2c := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		req := proxyReq(t, "GET", env.srv.URL+"/events", nil, map[string]string{headerSandboxID: "sbx2", headerSandboxPort: "3000"})
		resp, err := proxyClient(h2c).Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || line != "data: first\n" {
			t.Fatalf("h2c=%v first event %q, %v", h2c, line, err)
		}
		if v := scrapeMetrics(t, env.m)["sandboxd_proxy_open_streams"]; v != 1 {
			t.Fatalf("open streams %v during the stream, want 1", v)
		}
		cancel()
		resp.Body.Close()
		select {
		case <-gone:
		case <-time.After(10 * time.Second):
			t.Fatalf("h2c=%v: upstream request still running 10 s after the client left", h2c)
		}
		proxyWaitFor(t, "open streams back to 0", func() bool { return scrapeMetrics(t, env.m)["sandboxd_proxy_open_streams"] == 0 })
	}
}

// TestProxyRequestBodyStreams: a request body reaches the sandbox while the
// client is still sending it, and the response flows back meanwhile.
func TestProxyRequestBodyStreams(t *testing.T) {
	env := newProxyEnv(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.WriteHeader(200)
		http.NewResponseController(w).Flush()
		br := bufio.NewReader(r.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			_, _ = io.WriteString(w, "echo "+line)
			http.NewResponseController(w).Flush()
		}
	}))
	defer up.Close()
	env.d.set("sbx2", &fakeProxySandbox{ports: map[int]string{3000: up.Listener.Addr().String()}})

	for _, h2c := range []bool{false, true} {
		pr, pw := io.Pipe()
		req := proxyReq(t, "POST", env.srv.URL+"/duplex", pr, map[string]string{headerSandboxID: "sbx2", headerSandboxPort: "3000"})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		// On timeout, end the body too: the transport waits for it.
		context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) })
		resp, err := proxyClient(h2c).Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		for _, msg := range []string{"one\n", "two\n"} {
			_, _ = io.WriteString(pw, msg)
			got, err := br.ReadString('\n')
			if err != nil || got != "echo "+msg {
				t.Fatalf("h2c=%v: got %q, %v", h2c, got, err)
			}
		}
		pw.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
	}
}

func TestProxyMetrics(t *testing.T) {
	env := newProxyEnv(t)
	proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/health", nil, proxyEnvdHeaders("sbx1")))
	proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/health", nil, proxyEnvdHeaders("nope")))
	proxyDo(t, nil, proxyReq(t, "GET", env.srv.URL+"/health", nil, map[string]string{headerSandboxID: "sbx1"}))
	wants := map[string]float64{
		`sandboxd_proxy_requests_total{code="204",port_class="envd"}`: 1,
		`sandboxd_proxy_requests_total{code="502",port_class="envd"}`: 1,
		`sandboxd_proxy_requests_total{code="400",port_class="none"}`: 1,
		`sandboxd_proxy_open_streams`:                                 0,
	}
	// The proxy counts a request when its handler returns, which can be
	// just after the client has read the whole response.
	var got map[string]float64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got = scrapeMetrics(t, env.m)
		missing := false
		for series, want := range wants {
			if v, ok := got[series]; !ok || v != want {
				missing = true
			}
		}
		if !missing || time.Now().After(deadline) {
			break
		}
	}
	for series, want := range wants {
		if v, ok := got[series]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	if got[`sandboxd_proxy_bytes_total{direction="in"}`] <= 0 || got[`sandboxd_proxy_bytes_total{direction="out"}`] <= 0 {
		t.Errorf("proxy bytes not counted:\n%s", scrapeMetricsText(t, env.m))
	}
}

func TestProxyUpstreamHost(t *testing.T) {
	id, port, ok := parseUpstreamHost(upstreamHost("abc123", 8080) + ":80")
	if !ok || id != "abc123" || port != 8080 {
		t.Fatalf("round trip: %q %d %v", id, port, ok)
	}
	for _, bad := range []string{"abc-80.example.com:80", "abc.sandbox:80", "-80.sandbox", "abc-0.sandbox", "a-b-1.sandbox"} {
		if _, _, ok := parseUpstreamHost(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func proxyWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An answer that comes before the client's upload was read to its end
// (envd's 507 for a disk too full) closes the client's connection and says
// so, so that the client's next request does not meet the close; an answer
// after the whole body keeps the connection.
func TestProxyEarlyAnswerSaysClose(t *testing.T) {
	env := newProxyEnv(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/early" {
			w.WriteHeader(http.StatusInsufficientStorage) // the body unread
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer up.Close()
	env.d.set("sbx2", &fakeProxySandbox{ports: map[int]string{3000: up.Listener.Addr().String()}})
	hdr := map[string]string{headerSandboxID: "sbx2", headerSandboxPort: "3000"}
	c := proxyClient(false)
	for _, tc := range []struct {
		path      string
		status    int
		wantClose bool
	}{
		{"/early", http.StatusInsufficientStorage, true},
		{"/read", http.StatusNoContent, false},
	} {
		for i := range 3 {
			resp, _ := proxyDo(t, c, proxyReq(t, "POST", env.srv.URL+tc.path, bytes.NewReader(make([]byte, 4<<20)), hdr))
			if resp.StatusCode != tc.status || resp.Close != tc.wantClose {
				t.Fatalf("%s #%d: %d, Connection: close %v; want %d, %v", tc.path, i, resp.StatusCode, resp.Close, tc.status, tc.wantClose)
			}
			// The next request on the same client works either way.
			if resp, _ := proxyDo(t, c, proxyReq(t, "GET", env.srv.URL+"/read", nil, hdr)); resp.StatusCode != http.StatusNoContent {
				t.Fatalf("%s #%d: the next request: %d", tc.path, i, resp.StatusCode)
			}
		}
	}
}

// A client that reads the answer only once its whole upload is sent (undici,
// so the JS SDK) gets an early error answer: the proxy drains the rest of
// the body instead of letting the server reset the connection under it. A
// client that stalls gets the answer at once and the connection closed
// after the drain's bound.
func TestProxyErrorAnswerDrainsUpload(t *testing.T) {
	env := newProxyEnv(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInsufficientStorage) // the body unread
		_, _ = w.Write([]byte(`{"code":507,"message":"disk full"}`))
	}))
	t.Cleanup(up.Close)
	env.d.set("sbx2", &fakeProxySandbox{ports: map[int]string{3000: up.Listener.Addr().String()}})
	env.p.drainTimeout = 500 * time.Millisecond // before any request

	// More than the loopback's socket buffers hold, so that a reset comes
	// while the client still writes.
	const size = 24 << 20
	for _, tc := range []struct {
		name string
		send int // bytes of the body the client sends before it reads
	}{
		{"whole upload, then read", size},
		{"stalled upload", 64 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", env.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\n%s: sbx2\r\n%s: 3000\r\nContent-Length: %d\r\n\r\n",
				headerSandboxID, headerSandboxPort, size)
			chunk := make([]byte, 64<<10)
			for sent := 0; sent < tc.send; sent += len(chunk) {
				if _, err := c.Write(chunk); err != nil {
					t.Fatalf("write after %d bytes: %v", sent, err)
				}
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(body), "disk full") {
				t.Fatalf("answer %d %q (%v); want 507 with envd's body", resp.StatusCode, body, err)
			}
			if !resp.Close {
				t.Error("the answer does not say Connection: close")
			}
			// The server ends the connection: at once after a drained
			// body, after the drain's bound for a stalled one.
			if _, err := br.ReadByte(); err == nil {
				t.Error("the connection stayed open")
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Errorf("the connection stayed open: %v", err)
			}
		})
	}
}
