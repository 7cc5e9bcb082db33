package tunnel

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// envd is a tunnel handler served the way envd serves it: CONNECT routed to
// it, behind an access-token check; or, with ENVD_TEST_BINARY set, an agent
// binary (package agenttest), its token set through POST /init.
type envd struct {
	tun  *Handler // in process only: use handler
	dial func(ctx context.Context) (net.Conn, error)
	// done receives once per CONNECT request when ServeHTTP has returned;
	// in process only: use handlerReturned.
	done chan struct{}
	// unauthorized is the message of a 401 for a missing or wrong token.
	unauthorized string
}

// envdUnauthorized is envd's message for a request without the token.
const envdUnauthorized = "unauthorized access, please provide a valid access token or method signing if supported"

type listenKind int

const (
	overTCP listenKind = iota
	overUnix
)

func newEnvd(t *testing.T, kind listenKind, token string) *envd {
	t.Helper()
	if agenttest.Enabled() {
		return startEnvd(t, kind, token)
	}
	e := &envd{tun: New(quietLog()), done: make(chan struct{}, 100), unauthorized: "unauthorized"}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" && r.Header.Get(envdapi.AccessTokenHeader) != token {
			http.Error(w, `{"code":401,"message":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodConnect {
			http.NotFound(w, r)
			return
		}
		defer func() { e.done <- struct{}{} }()
		e.tun.ServeHTTP(w, r)
	})

	var ln net.Listener
	var err error
	switch kind {
	case overTCP:
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	case overUnix:
		ln, err = net.Listen("unix", filepath.Join(t.TempDir(), "envd.sock"))
	}
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
		// Hijacked connections are invisible to srv.Close: the tunnel's own
		// Close ends them and waits for every handler.
		e.tun.Close()
	})
	addr := ln.Addr()
	e.dial = func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, addr.Network(), addr.String())
	}
	return e
}

// startEnvd is newEnvd against the agent binary: over TCP, or over its
// --socket, as sandboxd reaches it.
func startEnvd(t *testing.T, kind listenKind, token string) *envd {
	t.Helper()
	var args []string
	sock := ""
	if kind == overUnix {
		sock = filepath.Join(t.TempDir(), "envd.sock")
		args = []string{"--socket", sock}
	}
	a := agenttest.Start(t, agenttest.Options{DefaultUser: "root", Args: args})
	if token != "" {
		a.Init(t, map[string]any{"accessToken": token})
	}
	network, addr := "tcp", strings.TrimPrefix(a.URL, "http://")
	if sock != "" {
		network, addr = "unix", sock // served before TCP, so there by now
	}
	return &envd{
		dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		unauthorized: envdUnauthorized,
	}
}

// handler is the in-process tunnel Handler; against a binary, which has
// none to reach, it skips t (why says what for).
func (e *envd) handler(t *testing.T, why string) *Handler {
	t.Helper()
	agenttest.InProcessOnly(t, why)
	return e.tun
}

// handlerReturned waits until a CONNECT handler has returned; only the
// in-process server shows that, so against a binary it skips the rest of t.
func (e *envd) handlerReturned(t *testing.T) {
	t.Helper()
	agenttest.InProcessOnly(t, "the rest waits for the tunnel handler to return, which only the in-process server shows")
	<-e.done
}

// serveTCP runs handle for every connection accepted on a fresh 127.0.0.1
// port and returns the port. Cleanup closes the listener and waits for
// every handler.
func serveTCP(t *testing.T, handle func(c *net.TCPConn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // runs after the Close below (cleanups are LIFO)
	t.Cleanup(func() { ln.Close() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c.(*net.TCPConn))
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// echo copies a connection back to itself, then half-closes.
func echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// closedPort returns a port on 127.0.0.1 that nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

func TestDialHTTP(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, body)
	}))
	t.Cleanup(target.Close)
	port := target.Listener.Addr().(*net.TCPAddr).Port

	for name, kind := range map[string]listenKind{"tcp": overTCP, "unix": overUnix} {
		t.Run("envd over "+name, func(t *testing.T) {
			e := newEnvd(t, kind, "")
			client := &http.Client{Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return envdapi.Dial(ctx, e.dial, "", port)
				},
			}}
			t.Cleanup(client.CloseIdleConnections)
			// Several requests, so keep-alive over one tunnel is exercised.
			for i, method := range []string{http.MethodGet, http.MethodPost, http.MethodGet} {
				req, err := http.NewRequestWithContext(t.Context(), method, "http://sandbox/p"+strconv.Itoa(i), strings.NewReader("body"))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s through tunnel: %v", method, err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				want := fmt.Sprintf("%s /p%d body", method, i)
				if err != nil || resp.StatusCode != http.StatusOK || string(got) != want {
					t.Errorf("%s = %d %q, %v; want 200 %q", method, resp.StatusCode, got, err, want)
				}
			}
		})
	}
}

// A peer that answers only after reading EOF proves the client's
// half-close reaches the target while the reply still flows back.
func TestRawTCPHalfClose(t *testing.T) {
	port := serveTCP(t, func(c *net.TCPConn) {
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "got %d bytes", n)
	})
	e := newEnvd(t, overTCP, "")
	conn, err := envdapi.Dial(t.Context(), e.dial, "", port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	data := make([]byte, 1<<20)
	rand.Read(data)
	if _, err := conn.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := conn.(closeWriter).CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	got, err := io.ReadAll(conn)
	if want := fmt.Sprintf("got %d bytes", len(data)); err != nil || string(got) != want {
		t.Errorf("reply = %q, %v; want %q", got, err, want)
	}
}

func TestRawTCPEcho(t *testing.T) {
	port := serveTCP(t, echo)
	e := newEnvd(t, overTCP, "")
	conn, err := envdapi.Dial(t.Context(), e.dial, "", port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Interleaved request/response over one tunnel.
	r := bufio.NewReader(conn)
	for i := range 5 {
		line := fmt.Sprintf("line %d\n", i)
		if _, err := io.WriteString(conn, line); err != nil {
			t.Fatal(err)
		}
		got, err := r.ReadString('\n')
		if err != nil || got != line {
			t.Fatalf("echo = %q, %v; want %q", got, err, line)
		}
	}
	if err := conn.(closeWriter).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Errorf("after half-close: %q, %v; want clean EOF", rest, err)
	}
}

// When the client goes away, the handler tears both sides down and returns.
func TestTunnelEndsWithClient(t *testing.T) {
	targetGone := make(chan error, 1)
	port := serveTCP(t, func(c *net.TCPConn) {
		_, err := io.Copy(io.Discard, c)
		targetGone <- err
	})
	e := newEnvd(t, overTCP, "")
	conn, err := envdapi.Dial(t.Context(), e.dial, "", port)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "hi"); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if err := <-targetGone; err != nil {
		t.Errorf("target read ended with %v; want EOF", err)
	}
	e.handlerReturned(t) // ServeHTTP returned: no goroutine left behind
}

// When the target closes, the client sees EOF and the handler returns.
func TestTunnelEndsWithTarget(t *testing.T) {
	port := serveTCP(t, func(c *net.TCPConn) { io.WriteString(c, "bye") })
	e := newEnvd(t, overTCP, "")
	conn, err := envdapi.Dial(t.Context(), e.dial, "", port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "bye" {
		t.Errorf("read = %q, %v; want %q", got, err, "bye")
	}
	conn.Close()
	e.handlerReturned(t)
}

func TestDialRefused(t *testing.T) {
	e := newEnvd(t, overTCP, "")
	port := closedPort(t)
	conn, err := envdapi.Dial(t.Context(), e.dial, "", port)
	if err == nil {
		conn.Close()
		t.Fatal("Dial to a closed port succeeded")
	}
	var se *envdapi.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusBadGateway || !errors.Is(err, envdapi.ErrPortNotOpen) {
		t.Fatalf("Dial = %v; want a 502 StatusError matching ErrPortNotOpen", err)
	}
	if want := fmt.Sprintf("127.0.0.1:%d: port is not open", port); se.Message != want {
		t.Errorf("message = %q; want %q", se.Message, want)
	}
}

func TestDialAccessToken(t *testing.T) {
	port := serveTCP(t, echo)
	e := newEnvd(t, overTCP, "tok")
	conn, err := envdapi.Dial(t.Context(), e.dial, "tok", port)
	if err != nil {
		t.Fatalf("Dial with the token: %v", err)
	}
	conn.Close()
	for _, tok := range []string{"", "wrong"} {
		_, err := envdapi.Dial(t.Context(), e.dial, tok, port)
		var se *envdapi.StatusError
		if !errors.As(err, &se) || se.StatusCode != http.StatusUnauthorized || se.Message != e.unauthorized || errors.Is(err, envdapi.ErrPortNotOpen) {
			t.Errorf("Dial with token %q = %v; want a 401 StatusError", tok, err)
		}
	}
	if _, err := envdapi.Dial(t.Context(), e.dial, "a\r\nX-Evil: 1", port); err == nil {
		t.Error("Dial accepted a token with CR LF")
	}
}

func TestDialBadPort(t *testing.T) {
	agenttest.InProcessOnly(t, "tests the client, envdapi.Dial, alone; no agent involved")
	dialed := false
	dial := func(context.Context) (net.Conn, error) { dialed = true; return nil, errors.New("unreachable") }
	for _, port := range []int{0, -1, 65536} {
		if _, err := envdapi.Dial(t.Context(), dial, "", port); err == nil || dialed {
			t.Errorf("Dial(port %d) = %v, dialed %v; want an error before dialling", port, err, dialed)
		}
	}
}

// rawConnect sends a hand-written request to envd and returns the parsed
// response with its body.
func rawConnect(t *testing.T, e *envd, request string) (*http.Response, []byte) {
	t.Helper()
	c, err := e.dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	var body []byte
	if resp.StatusCode != http.StatusOK {
		body, _ = io.ReadAll(resp.Body)
	}
	return resp, body
}

func TestTargetRefused(t *testing.T) {
	e := newEnvd(t, overTCP, "")
	tests := []struct {
		target string
		host   string // Host header; the target's when empty
		status int
	}{
		{"10.0.0.1:80", "", http.StatusForbidden},
		{"example.com:80", "", http.StatusForbidden},
		{"127.0.0.2:80", "", http.StatusForbidden},
		{"0.0.0.0:80", "", http.StatusForbidden},
		{"[::ffff:127.0.0.1]:80", "", http.StatusForbidden},
		{"[fe80::1%25lo]:80", "", http.StatusForbidden},
		// The request-target decides, never the Host header.
		{"10.0.0.1:80", "127.0.0.1:80", http.StatusForbidden},
		{"127.0.0.1:0", "", http.StatusBadRequest},
		{"127.0.0.1:65536", "", http.StatusBadRequest},
		{"127.0.0.1:080", "", http.StatusBadRequest},
		{"127.0.0.1", "", http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			host := tt.host
			if host == "" {
				host = tt.target
			}
			resp, body := rawConnect(t, e, "CONNECT "+tt.target+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
			if resp.StatusCode != tt.status {
				t.Fatalf("status = %d (%s); want %d", resp.StatusCode, body, tt.status)
			}
			var msg struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(body, &msg); err != nil || msg.Code != tt.status || msg.Message == "" {
				t.Errorf("body = %s (%v); want JSON with code %d", body, err, tt.status)
			}
		})
	}
}

// Bytes a client sends right behind its CONNECT, before reading the 200,
// must reach the target, and bytes the target sends right away must reach
// the client even when they arrive together with the 200.
func TestEarlyBytes(t *testing.T) {
	port := serveTCP(t, func(c *net.TCPConn) {
		io.WriteString(c, "banner\n")
		echo(c)
	})
	e := newEnvd(t, overTCP, "")
	c, err := e.dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if _, err := io.WriteString(c, "CONNECT "+addr+" HTTP/1.1\r\nHost: "+addr+"\r\n\r\nearly\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT = %v, %v; want 200", resp, err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "banner\nearly\n" {
		t.Errorf("read %q, %v; want %q", got, err, "banner\nearly\n")
	}
}

// envdapi.Dial must hand over bytes its reader buffered past the 200.
func TestDialBufferedBytes(t *testing.T) {
	agenttest.InProcessOnly(t, "tests the client, envdapi.Dial, against a fake envd; no agent involved")
	// A fake envd that sends the 200 and the target's first bytes in one
	// write, then echoes.
	envdPort := serveTCP(t, func(c *net.TCPConn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, connectOK+"greeting")
		io.Copy(c, br)
		c.CloseWrite()
	})
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(envdPort))
	}
	conn, err := envdapi.Dial(t.Context(), dial, "", 1234)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, len("greeting"))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "greeting" {
		t.Fatalf("first bytes = %q, %v; want %q", buf, err, "greeting")
	}
	io.WriteString(conn, "more")
	if err := conn.(closeWriter).CloseWrite(); err != nil {
		t.Fatalf("CloseWrite through the buffered wrapper: %v", err)
	}
	if rest, err := io.ReadAll(conn); err != nil || string(rest) != "more" {
		t.Errorf("rest = %q, %v; want %q", rest, err, "more")
	}
}

// Cancelling the context aborts a handshake envd never answers.
func TestDialCancel(t *testing.T) {
	agenttest.InProcessOnly(t, "tests the client, envdapi.Dial, against a fake envd; no agent involved")
	gotRequest := make(chan struct{})
	envdPort := serveTCP(t, func(c *net.TCPConn) {
		http.ReadRequest(bufio.NewReader(c))
		close(gotRequest)
		io.Copy(io.Discard, c) // never answer; return when Dial gives up
	})
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(envdPort))
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		c, err := envdapi.Dial(ctx, dial, "", 80)
		if c != nil {
			c.Close()
		}
		errc <- err
	}()
	<-gotRequest
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("Dial = %v; want context.Canceled", err)
	}
}

// Close ends open tunnels, waits for their handlers and refuses new ones.
func TestHandlerClose(t *testing.T) {
	port := serveTCP(t, echo)
	e := newEnvd(t, overTCP, "")
	conn, err := envdapi.Dial(t.Context(), e.dial, "", port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e.handler(t, "calls Handler.Close, which a binary has no way to do but exit").Close()
	if _, err := io.ReadAll(conn); err != nil {
		t.Errorf("read after Close = %v; want EOF", err)
	}
	_, err = envdapi.Dial(t.Context(), e.dial, "", port)
	var se *envdapi.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("Dial after Close = %v; want 503", err)
	}
}

func TestNotConnect(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of the Handler on a non-CONNECT request (envd routes only CONNECT to it)")
	rec := httptest.NewRecorder()
	New(quietLog()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET = %d; want 405", rec.Code)
	}
}

// h2cTunnel serves the tunnel over h2c and returns its address: a Handler
// alone in process, or the agent binary, which serves h2c on its port.
func h2cTunnel(t *testing.T) string {
	t.Helper()
	if agenttest.Enabled() {
		a := agenttest.Start(t, agenttest.Options{DefaultUser: "root"})
		return strings.TrimPrefix(a.URL, "http://")
	}
	tun := New(quietLog())
	srv := httptest.NewUnstartedServer(tun)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(func() { srv.Close(); tun.Close() })
	return srv.Listener.Addr().String()
}

// Over HTTP/2 (h2c here) CONNECT is a stream: request body up, response
// body down, END_STREAM passed on as a half-close.
func TestHTTP2Connect(t *testing.T) {
	port := serveTCP(t, echo)
	addr := h2cTunnel(t)

	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	pr, pw := io.Pipe()
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Scheme: "http", Host: addr},
		Host:   "127.0.0.1:" + strconv.Itoa(port),
		Header: http.Header{},
		Body:   pr,
	}
	req = req.WithContext(t.Context())
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("CONNECT = %d %s; want 200 over HTTP/2", resp.StatusCode, resp.Proto)
	}
	go func() {
		io.WriteString(pw, "over h2")
		pw.Close()
	}()
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != "over h2" {
		t.Errorf("echo = %q, %v; want %q", got, err, "over h2")
	}
}

func TestParseTarget(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of parseTarget")
	tests := []struct {
		in   string
		want Target
		err  error
	}{
		{"127.0.0.1:80", Target{"127.0.0.1", 80}, nil},
		{"127.0.0.1:65535", Target{"127.0.0.1", 65535}, nil},
		{"[::1]:1", Target{"::1", 1}, nil},
		{"[0:0:0:0:0:0:0:1]:8080", Target{"::1", 8080}, nil},
		{"localhost:3000", Target{"localhost", 3000}, nil},
		{"LocalHost:3000", Target{"localhost", 3000}, nil},
		{"127.0.0.1:0", Target{}, ErrBadTarget},
		{"127.0.0.1:65536", Target{}, ErrBadTarget},
		{"127.0.0.1:-1", Target{}, ErrBadTarget},
		{"127.0.0.1:http", Target{}, ErrBadTarget},
		{"127.0.0.1:+80", Target{}, ErrBadTarget},
		{"127.0.0.1:0080", Target{}, ErrBadTarget},
		{"127.0.0.1:", Target{}, ErrBadTarget},
		{"127.0.0.1", Target{}, ErrBadTarget},
		{"::1:80", Target{}, ErrBadTarget},
		{":80", Target{}, ErrBadTarget},
		{"", Target{}, ErrBadTarget},
		{"[::1%lo]:80", Target{}, ErrNotLoopback},
		{"127.0.0.2:80", Target{}, ErrNotLoopback},
		{"[::ffff:127.0.0.1]:80", Target{}, ErrNotLoopback},
		{"10.1.2.3:22", Target{}, ErrNotLoopback},
		{"localhost.:80", Target{}, ErrNotLoopback},
		{"metadata.google.internal:80", Target{}, ErrNotLoopback},
	}
	for _, tt := range tests {
		got, err := ParseTarget(tt.in)
		if got != tt.want || !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
			t.Errorf("ParseTarget(%q) = %+v, %v; want %+v, %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func FuzzParseTarget(f *testing.F) {
	agenttest.InProcessOnly(f, "unit test of parseTarget")
	for _, s := range []string{"127.0.0.1:80", "[::1]:443", "localhost:1", "10.0.0.1:80", "127.0.0.1:99999", "[::1%eth0]:1", "::1:80", ":", "[]:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseTarget(in)
		if err != nil {
			if got != (Target{}) {
				t.Errorf("ParseTarget(%q) = %+v with error %v", in, got, err)
			}
			if !errors.Is(err, ErrBadTarget) && !errors.Is(err, ErrNotLoopback) {
				t.Errorf("ParseTarget(%q) error %v is neither kind", in, err)
			}
			return
		}
		switch got.Host {
		case "127.0.0.1", "::1", "localhost":
		default:
			t.Fatalf("ParseTarget(%q) accepted host %q", in, got.Host)
		}
		if got.Port < 1 || got.Port > 65535 {
			t.Fatalf("ParseTarget(%q) accepted port %d", in, got.Port)
		}
		// Every address dialled is a loopback literal with that port.
		for _, a := range got.addrs() {
			host, port, err := net.SplitHostPort(a)
			if err != nil || (host != "127.0.0.1" && host != "::1") || port != strconv.Itoa(got.Port) {
				t.Fatalf("ParseTarget(%q) dials %q", in, a)
			}
		}
		// The canonical form parses back to the same target.
		if again, err := ParseTarget(got.String()); err != nil || again != got {
			t.Fatalf("ParseTarget(%q) = %+v, but its String %q parses as %+v, %v", in, got, got.String(), again, err)
		}
	})
}
