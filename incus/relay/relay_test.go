package relay

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestPipe: bytes go both ways through the relay, and a half-close from
// either end reaches the other, which can still send.
func TestPipe(t *testing.T) {
	noLeaks(t)
	r := startRelay(t, nil)
	d := r.dialer(t)
	for _, tc := range []struct {
		name   string
		target func(*net.TCPConn)
		client func(t *testing.T, c net.Conn)
	}{
		{
			// The client sends its request and half-closes; the target
			// reads to EOF, then answers.
			name: "client half-closes first",
			target: func(c *net.TCPConn) {
				req, err := io.ReadAll(c)
				if err != nil {
					return
				}
				_, _ = c.Write(append([]byte("got "), req...))
				_ = c.CloseWrite()
			},
			client: func(t *testing.T, c net.Conn) {
				if _, err := io.WriteString(c, "hello relay"); err != nil {
					t.Fatal(err)
				}
				if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(c)
				if err != nil || string(got) != "got hello relay" {
					t.Errorf("after CloseWrite, read %q, %v; want %q", got, err, "got hello relay")
				}
			},
		},
		{
			// The target speaks first and half-closes; the client sees
			// EOF, then sends, and the target still reads it.
			name: "target half-closes first",
			target: func(c *net.TCPConn) {
				if _, err := io.WriteString(c, "banner"); err != nil {
					return
				}
				_ = c.CloseWrite()
				req, err := io.ReadAll(c)
				if err != nil || string(req) != "after EOF" {
					req = []byte("bad: " + string(req))
				}
				// The read side of the client has ended: log what came.
				_ = req
				targetGot <- string(req)
			},
			client: func(t *testing.T, c net.Conn) {
				got, err := io.ReadAll(c)
				if err != nil || string(got) != "banner" {
					t.Errorf("read %q, %v; want the banner, then EOF", got, err)
				}
				if _, err := io.WriteString(c, "after EOF"); err != nil {
					t.Fatalf("write after the target's half-close: %v", err)
				}
				_ = c.(interface{ CloseWrite() error }).CloseWrite()
				select {
				case got := <-targetGot:
					if got != "after EOF" {
						t.Errorf("target read %q; want %q", got, "after EOF")
					}
				case <-time.After(5 * time.Second):
					t.Error("the target did not read the client's bytes")
				}
			},
		},
		{
			// Larger than the copy buffer and TLS records, both ways.
			name:   "a megabyte echoed",
			target: echo,
			client: func(t *testing.T, c net.Conn) {
				big := strings.Repeat("0123456789abcdef", 1<<16)
				go func() {
					_, _ = io.WriteString(c, big)
					_ = c.(interface{ CloseWrite() error }).CloseWrite()
				}()
				got, err := io.ReadAll(c)
				if err != nil || string(got) != big {
					t.Errorf("echo of 1 MiB: %d bytes, %v", len(got), err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := listenTarget(t, "127.0.0.2", tc.target)
			c, err := d.Dial(t.Context(), r.addr, tg.addr)
			if err != nil {
				t.Fatalf("Dial = %v", err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			tc.client(t, c)
		})
	}
	if got := counterValue(r.srv.dials.WithLabelValues(resultOK)); got != 3 {
		t.Errorf("dials ok = %v; want 3", got)
	}
}

var targetGot = make(chan string, 1)

// TestSessionResumption: a second Dial to the relay resumes the session.
func TestSessionResumption(t *testing.T) {
	noLeaks(t)
	r := startRelay(t, nil)
	d := r.dialer(t)
	tg := listenTarget(t, "127.0.0.2", echo)
	for i, want := range []bool{false, true, true} {
		c, err := d.Dial(t.Context(), r.addr, tg.addr)
		if err != nil {
			t.Fatalf("Dial %d = %v", i, err)
		}
		if got := c.(*tls.Conn).ConnectionState().DidResume; got != want {
			t.Errorf("dial %d resumed = %v; want %v", i, got, want)
		}
		// The ticket comes after the handshake: read something so the
		// client has it for the next dial.
		roundTrip(t, c, "x")
		c.Close()
	}
}

func roundTrip(tb testing.TB, c net.Conn, msg string) {
	tb.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		tb.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		tb.Fatalf("echo: %q, %v; want %q", buf, err, msg)
	}
}

// TestHandshakeRefused: a client without the pinned certificate, or not
// on TLS 1.3, or a relay with another certificate than the pinned one: no
// pipe, nothing dialed, and the error is not a RefusedError (the relay is
// not usable, rather than the sandbox not reachable).
func TestHandshakeRefused(t *testing.T) {
	noLeaks(t)
	r := startRelay(t, nil)
	tg := listenTarget(t, "127.0.0.2", echo)
	stranger := newPair(t, "stranger")
	for _, tc := range []struct {
		name string
		cfg  func() *tls.Config
		// byServer: the relay refuses the client (counted); otherwise the
		// client refuses the relay.
		byServer bool
	}{
		{"unpinned client certificate", func() *tls.Config {
			cfg, _ := ClientTLS(stranger.cert, stranger.key, r.server.cert)
			return cfg
		}, true},
		{"no client certificate", func() *tls.Config {
			cfg := r.dialer(t).TLS.Clone()
			cfg.Certificates = nil
			return cfg
		}, true},
		{"TLS 1.2", func() *tls.Config {
			cfg := r.dialer(t).TLS.Clone()
			cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
			return cfg
		}, true},
		{"relay not the pinned one", func() *tls.Config {
			cfg, _ := ClientTLS(r.client.cert, r.client.key, stranger.cert)
			return cfg
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := counterValue(r.srv.dials.WithLabelValues(resultUnauthenticated))
			d := &Dialer{TLS: tc.cfg()}
			c, err := d.Dial(t.Context(), r.addr, tg.addr)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if errors.Is(err, ErrRefused) {
				t.Errorf("Dial = %v; want a TLS error, not ErrRefused", err)
			}
			t.Logf("Dial = %v", err)
			if tc.byServer {
				waitFor(t, "the relay counts the refusal", func() bool {
					return counterValue(r.srv.dials.WithLabelValues(resultUnauthenticated)) == before+1
				})
			}
		})
	}
	if n := tg.accepted.Load(); n != 0 {
		t.Errorf("target accepted %d connections; want none", n)
	}
}

func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRequestRefused: a malformed or too long request line, a target
// outside the allowed prefixes or one that refuses, get ERR with their
// code; nothing outside the prefixes is dialed.
func TestRequestRefused(t *testing.T) {
	noLeaks(t)
	// A listener outside 127.0.0.0/30 that must see no connection.
	outside := listenTarget(t, "127.0.0.9", echo)
	closed := closedPort(t, "127.0.0.2")
	r := startRelay(t, nil)
	timeouts := startRelay(t, func(c *ServerConfig) { c.DialTimeout = time.Nanosecond })
	inside := listenTarget(t, "127.0.0.2", echo)
	for _, tc := range []struct {
		name  string
		relay *testRelay
		line  string
		code  string
	}{
		{"outside the prefixes", r, "DIAL " + outside.addr.String() + "\n", CodeForbidden},
		{"public address", r, "DIAL 8.8.8.8:53\n", CodeForbidden},
		{"nothing listens", r, "DIAL " + closed.String() + "\n", CodeRefused},
		{"dial timeout", timeouts, "DIAL " + inside.addr.String() + "\n", CodeTimeout},
		{"port 0", r, "DIAL 127.0.0.2:0\n", CodeBadRequest},
		{"port too big", r, "DIAL 127.0.0.2:65536\n", CodeBadRequest},
		{"IPv6", r, "DIAL [::1]:80\n", CodeBadRequest},
		{"4-in-6", r, "DIAL [::ffff:127.0.0.2]:80\n", CodeBadRequest},
		{"host name", r, "DIAL localhost:80\n", CodeBadRequest},
		{"no port", r, "DIAL 127.0.0.2\n", CodeBadRequest},
		{"lower case", r, "dial " + inside.addr.String() + "\n", CodeBadRequest},
		{"CRLF", r, "DIAL " + inside.addr.String() + "\r\n", CodeBadRequest},
		{"trailing word", r, "DIAL " + inside.addr.String() + " now\n", CodeBadRequest},
		{"HTTP", r, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", CodeBadRequest},
		{"empty", r, "\n", CodeBadRequest},
		{"too long", r, "DIAL 127.0.0.2:" + strings.Repeat("0", 60) + "80\n", CodeBadRequest},
		{"endless", r, strings.Repeat("A", 100<<10), CodeBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := inside.accepted.Load()
			got := rawRequest(t, tc.relay, tc.line)
			if !strings.HasPrefix(got, "ERR "+tc.code+" ") {
				t.Errorf("answer = %q; want ERR %s", got, tc.code)
			}
			if tc.code != CodeTimeout && inside.accepted.Load() != before {
				t.Error("the relay dialed a target for a bad request")
			}
		})
	}
	if n := outside.accepted.Load(); n != 0 {
		t.Errorf("the target outside the prefixes accepted %d connections", n)
	}
	if got := counterValue(r.srv.dials.WithLabelValues(CodeForbidden)); got != 2 {
		t.Errorf("dials forbidden = %v; want 2", got)
	}

	// The Dialer makes them RefusedErrors, with the code.
	d := r.dialer(t)
	for _, tc := range []struct {
		target netip.AddrPort
		code   string
	}{
		{outside.addr, CodeForbidden},
		{closed, CodeRefused},
	} {
		c, err := d.Dial(t.Context(), r.addr, tc.target)
		var re *RefusedError
		if !errors.As(err, &re) || re.Code != tc.code || !errors.Is(err, ErrRefused) || re.Target != tc.target {
			if c != nil {
				c.Close()
			}
			t.Errorf("Dial(%s) = %v; want a RefusedError %s", tc.target, err, tc.code)
		}
	}
}

// rawRequest sends line over a TLS connection of r's pinned client and
// returns the relay's answer line, checking that the relay closes then.
func rawRequest(t *testing.T, r *testRelay, line string) string {
	t.Helper()
	c, err := tls.Dial("tcp", r.addr, r.dialer(t).TLS)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() { _, _ = io.WriteString(c, line) }() // may block on a long line the relay does not read
	br := bufio.NewReader(c)
	answer, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("read answer: %q, %v", answer, err)
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
		t.Errorf("after the answer: %q, %v; want EOF", rest, err)
	}
	return strings.TrimSuffix(answer, "\n")
}

// closedPort is an address of ip where nothing listens.
func closedPort(t *testing.T, ip string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	return ap
}

// TestCloseEndsPipes: Close ends open pipes at both ends, and Serve
// returns ErrServerClosed (startRelay's cleanup checks it).
func TestCloseEndsPipes(t *testing.T) {
	noLeaks(t)
	r := startRelay(t, nil)
	ended := make(chan error, 1)
	tg := listenTarget(t, "127.0.0.2", func(c *net.TCPConn) {
		_, err := io.Copy(c, c)
		ended <- err
	})
	c, err := r.dialer(t).Dial(t.Context(), r.addr, tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "before")
	r.srv.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("client read after Close = %d, %v; want the connection ended", n, err)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Error("the target's connection is still open after Close")
	}
	if _, err := r.dialer(t).Dial(t.Context(), r.addr, tg.addr); err == nil {
		t.Error("Dial after Close succeeded")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestShutdown: Shutdown stops new connections, waits for open pipes
// until its context ends, and returns once they have.
func TestShutdown(t *testing.T) {
	noLeaks(t)
	r := startRelay(t, nil)
	tg := listenTarget(t, "127.0.0.2", echo)
	d := r.dialer(t)
	c, err := d.Dial(t.Context(), r.addr, tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := r.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with a pipe open = %v; want DeadlineExceeded", err)
	}
	if _, err := d.Dial(t.Context(), r.addr, tg.addr); err == nil {
		t.Error("Dial after Shutdown succeeded")
	}
	roundTrip(t, c, "still piped") // left open
	_ = c.(*tls.Conn).CloseWrite()
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("read to EOF: %v", err)
	}
	if err := r.srv.Shutdown(t.Context()); err != nil {
		t.Errorf("Shutdown after the pipe ended = %v", err)
	}
}

// TestDialContext: a Dial to a relay that never answers ends with ctx.
func TestDialContext(t *testing.T) {
	noLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c // silent: no TLS
		}
	}()
	r := &testRelay{server: newPair(t, "relay"), client: newPair(t, "sandboxd")}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = r.dialer(t).Dial(ctx, ln.Addr().String(), netip.MustParseAddrPort("127.0.0.2:1"))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrRefused) {
		t.Errorf("Dial to a silent relay = %v; want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Dial returned after %v; want about 200ms", d)
	}
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Error("the silent relay saw no connection")
	}
}

func TestNewServerErrors(t *testing.T) {
	p := newPair(t, "relay")
	good := ServerConfig{Certificate: p.tlsCert(t), ClientCerts: [][]byte{p.der(t)}, Allow: []netip.Prefix{allowed}}
	for _, tc := range []struct {
		name string
		edit func(*ServerConfig)
	}{
		{"no certificate", func(c *ServerConfig) { c.Certificate = tls.Certificate{} }},
		{"no client certificate", func(c *ServerConfig) { c.ClientCerts = nil }},
		{"no prefix", func(c *ServerConfig) { c.Allow = nil }},
		{"IPv6 prefix", func(c *ServerConfig) { c.Allow = []netip.Prefix{netip.MustParsePrefix("fd00::/8")} }},
	} {
		cfg := good
		tc.edit(&cfg)
		if _, err := NewServer(cfg); err == nil {
			t.Errorf("%s: NewServer succeeded", tc.name)
		}
	}
	s, err := NewServer(good)
	if err != nil {
		t.Fatalf("NewServer(good) = %v", err)
	}
	s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(ln); err != ErrServerClosed {
		t.Errorf("Serve after Close = %v; want ErrServerClosed", err)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{"DIAL 10.135.0.7:49983", true},
		{"DIAL 10.135.0.7:1", true},
		{"DIAL 10.135.0.7:0", false},
		{"DIAL 10.135.0.7:65536", false},
		{"DIAL  10.135.0.7:80", false},
		{"DIAL 10.135.0.7:80 ", false},
		{"DIAL 010.135.0.7:80", false},
		{"DIAL [fe80::1%eth0]:80", false},
	} {
		if _, err := parseRequest(tc.line); (err == nil) != tc.ok {
			t.Errorf("parseRequest(%q) = %v; want ok %v", tc.line, err, tc.ok)
		}
	}
	target := netip.MustParseAddrPort("10.135.0.7:49983")
	if err := parseAnswer(target, "OK"); err != nil {
		t.Errorf("parseAnswer(OK) = %v", err)
	}
	var re *RefusedError
	if err := parseAnswer(target, "ERR refused dial tcp4: connection refused"); !errors.As(err, &re) || re.Code != CodeRefused || re.Detail != "dial tcp4: connection refused" {
		t.Errorf("parseAnswer(ERR) = %#v", err)
	}
	if err := parseAnswer(target, "HTTP/1.1 400 Bad Request"); err == nil || errors.Is(err, ErrRefused) {
		t.Errorf("parseAnswer(HTTP) = %v; want a malformed answer, not ErrRefused", err)
	}
	if l := errLine(CodeError, "a\nb\rc"+strings.Repeat("x", 1000)); strings.Count(l, "\n") != 1 || len(l) > maxAnswerLine {
		t.Errorf("errLine made %d bytes, %d newlines", len(l), strings.Count(l, "\n"))
	}
}

// counterValue is c's value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
