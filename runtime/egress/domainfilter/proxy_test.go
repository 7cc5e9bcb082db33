package domainfilter

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime/egress/internal/audit"
)

// evilIP stands for the address a sandbox connects to: never dialled,
// since the proxy dials the name.
var evilIP = netip.MustParseAddr("192.0.2.66")

// tlsTalk connects through the proxy with sni (none if ""), and does a
// whole session: greeting, an echoed line, half-close, farewell. It
// returns what the server said.
func tlsTalk(h *harness, dst netip.AddrPort, sni string, split bool) (string, error) {
	c := h.dial(dst)
	var conn net.Conn = c
	if split {
		conn = &splitConn{TCPConn: c}
	}
	cfg := &tls.Config{ServerName: sni, RootCAs: certPool()}
	if sni == "" {
		cfg.InsecureSkipVerify = true
	}
	tc := tls.Client(conn, cfg)
	if err := tc.Handshake(); err != nil {
		return "", fmt.Errorf("handshake: %w", err)
	}
	r := bufio.NewReader(tc)
	greeting, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("greeting: %w", err)
	}
	if _, err := io.WriteString(tc, "ping\n"); err != nil {
		return "", err
	}
	if l, err := r.ReadString('\n'); err != nil || l != "ping\n" {
		return "", fmt.Errorf("echo: %q, %v", l, err)
	}
	// close_notify, then the TCP half-close: the answer still comes.
	if err := tc.CloseWrite(); err != nil {
		return "", err
	}
	if err := c.CloseWrite(); err != nil {
		return "", err
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		return "", fmt.Errorf("farewell: %w", err)
	}
	return greeting + string(rest), nil
}

// splitConn sends the first TLS record it writes as two records, in two
// writes apart in time, like a ClientHello spanning records and
// segments.
type splitConn struct {
	*net.TCPConn
	done bool
}

func (s *splitConn) Write(b []byte) (int, error) {
	if s.done || len(b) < 5 || b[0] != recordHandshake {
		return s.TCPConn.Write(b)
	}
	s.done = true
	n := int(b[3])<<8 | int(b[4])
	body, rest := b[5:5+n], b[5+n:]
	cut := 3 // even the handshake header is split
	first := append([]byte{b[0], b[1], b[2], 0, byte(cut)}, body[:cut]...)
	second := append([]byte{b[0], b[1], b[2], byte((n - cut) >> 8), byte(n - cut)}, body[cut:]...)
	if _, err := s.TCPConn.Write(first); err != nil {
		return 0, err
	}
	time.Sleep(20 * time.Millisecond)
	if _, err := s.TCPConn.Write(append(second, rest...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// httpTalk sends a request head with host, a 5-byte body and a
// half-close, and returns the response body.
func httpTalk(h *harness, dst netip.AddrPort, head string) (string, error) {
	c := h.dial(dst)
	if _, err := io.WriteString(c, head+"hello"); err != nil {
		return "", err
	}
	if err := c.CloseWrite(); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return body, nil
}

func TestProxy(t *testing.T) {
	good := startTLSServer(t, "good")
	web := startHTTPServer(t, "web")
	type tcase struct {
		name  string
		rules map[string][]uint16
		talk  func(h *harness) (string, error)
		want  string // what the server said; "" for denied
		// for denials: the audit line's host and reason
		host, reason string
		asked        string // a question AllowsHost must have had
	}
	get := func(host string) string {
		return "GET /x HTTP/1.1\r\nUser-Agent: t\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"
	}
	cases := []tcase{{
		name:  "tls allowed sni",
		rules: map[string][]uint16{"allowed.test": nil},
		talk:  func(h *harness) (string, error) { return tlsTalk(h, at(good.port), "allowed.test", false) },
		want:  "good sni=allowed.test\nbye good\n",
	}, {
		name:  "tls sni across two records",
		rules: map[string][]uint16{"allowed.test": nil},
		talk:  func(h *harness) (string, error) { return tlsTalk(h, at(good.port), "allowed.test", true) },
		want:  "good sni=allowed.test\nbye good\n",
	}, {
		name:   "tls denied sni",
		rules:  map[string][]uint16{"allowed.test": nil},
		talk:   func(h *harness) (string, error) { return tlsTalk(h, at(good.port), "denied.test", false) },
		host:   "denied.test",
		reason: "no domain rule allows it",
	}, {
		name:  "forged sni goes to the name's address, not the one connected to",
		rules: map[string][]uint16{"allowed.test": nil},
		talk: func(h *harness) (string, error) {
			return tlsTalk(h, netip.AddrPortFrom(evilIP, good.port), "allowed.test", false)
		},
		want: "good sni=allowed.test\nbye good\n",
	}, {
		name:   "tls without sni",
		rules:  map[string][]uint16{"allowed.test": nil},
		talk:   func(h *harness) (string, error) { return tlsTalk(h, at(good.port), "", false) },
		reason: "no hostname",
	}, {
		name:   "name resolving only to unreachable addresses",
		rules:  map[string][]uint16{"private.test": nil},
		talk:   func(h *harness) (string, error) { return tlsTalk(h, at(good.port), "private.test", false) },
		host:   "private.test",
		reason: "resolves only to unreachable addresses",
	}, {
		name:  "unreachable addresses skipped",
		rules: map[string][]uint16{"mixed.test": nil},
		talk:  func(h *harness) (string, error) { return tlsTalk(h, at(good.port), "mixed.test", false) },
		want:  "good sni=mixed.test\nbye good\n",
	}, {
		name:   "wildcard rule on another port",
		rules:  map[string][]uint16{"*.github.test": {443}},
		talk:   func(h *harness) (string, error) { return tlsTalk(h, at(good.port), "www.github.test", false) },
		host:   "www.github.test",
		reason: "no domain rule allows it",
		asked:  fmt.Sprintf("www.github.test:%d", good.port),
	}, {
		name:  "wildcard rule on the original port",
		rules: map[string][]uint16{"*.github.test": {good.port}},
		talk:  func(h *harness) (string, error) { return tlsTalk(h, at(good.port), "www.github.test", false) },
		want:  "good sni=www.github.test\nbye good\n",
		asked: fmt.Sprintf("www.github.test:%d", good.port),
	}, {
		name:  "http allowed host",
		rules: map[string][]uint16{"allowed.test": nil},
		talk: func(h *harness) (string, error) {
			return httpTalk(h, netip.AddrPortFrom(evilIP, web.port), get("Allowed.Test.:8080"))
		},
		want:  "web host=Allowed.Test.:8080 body=5",
		asked: fmt.Sprintf("allowed.test:%d", web.port),
	}, {
		name:   "http denied host",
		rules:  map[string][]uint16{"allowed.test": nil},
		talk:   func(h *harness) (string, error) { return httpTalk(h, at(web.port), get("denied.test")) },
		host:   "denied.test",
		reason: "no domain rule allows it",
	}, {
		name:   "http without host",
		rules:  map[string][]uint16{"allowed.test": nil},
		talk:   func(h *harness) (string, error) { return httpTalk(h, at(web.port), "GET / HTTP/1.0\r\n\r\n") },
		reason: "no hostname",
	}, {
		name:  "http two hosts",
		rules: map[string][]uint16{"allowed.test": nil},
		talk: func(h *harness) (string, error) {
			return httpTalk(h, at(web.port), "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: denied.test\r\n\r\n")
		},
		reason: "no hostname",
	}, {
		name:   "other protocol",
		rules:  map[string][]uint16{"allowed.test": nil},
		talk:   func(h *harness) (string, error) { return httpTalk(h, at(web.port), "SSH-2.0-OpenSSH_9.6\r\n") },
		reason: "no hostname",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.rules)
			got, err := tc.talk(h)
			allowed, denied := h.f.Counts("sbx-1")
			if tc.asked != "" && !slices.Contains(h.pol.questions(), tc.asked) {
				t.Errorf("AllowsHost asked %v, want %s among them", h.pol.questions(), tc.asked)
			}
			for _, d := range h.dialedAddrs() {
				if !strings.HasPrefix(d, "127.0.0.1:") {
					t.Errorf("dialled %s", d)
				}
			}
			if tc.want != "" {
				if err != nil || got != tc.want {
					t.Fatalf("got %q, %v; want %q", got, err, tc.want)
				}
				if allowed != 1 || denied != 0 {
					t.Errorf("counts %d allowed %d denied, want 1 0", allowed, denied)
				}
				return
			}
			if err == nil {
				t.Fatalf("got through: %q", got)
			}
			if allowed != 0 || denied != 1 {
				t.Errorf("counts %d allowed %d denied, want 0 1", allowed, denied)
			}
			a := h.logs.audits()
			if len(a) != 1 {
				t.Fatalf("audit lines %v, want 1", a)
			}
			if a[0]["host"] != tc.host || a[0]["reason"] != tc.reason || a[0]["decision"] != "denied" || a[0]["sandbox_id"] != "sbx-1" {
				t.Errorf("audit line %v, want host %q reason %q", a[0], tc.host, tc.reason)
			}
		})
	}
}

// A denied connection is reset, not closed in order.
func TestDeniedIsReset(t *testing.T) {
	h := newHarness(t, map[string][]uint16{"allowed.test": nil})
	c := h.dial(at(80))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n")
	_, err := io.ReadAll(c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read: %v, want a reset", err)
	}
	if len(h.dialedAddrs()) != 0 {
		t.Errorf("dialled %v", h.dialedAddrs())
	}
}

func TestPeekTimeout(t *testing.T) {
	h := newHarness(t, map[string][]uint16{"allowed.test": nil}, func(c *Config) { c.PeekTimeout = 200 * time.Millisecond })
	c := h.dial(at(443))
	start := time.Now()
	if _, err := io.ReadAll(c); err == nil {
		t.Fatal("a silent client was not reset")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v", d)
	}
	if _, denied := h.f.Counts("sbx-1"); denied != 1 {
		t.Errorf("denied %d, want 1", denied)
	}
}

func TestUnknownSource(t *testing.T) {
	h := newHarness(t, map[string][]uint16{"allowed.test": nil}, func(c *Config) {
		c.Sandboxes = &fakeSandboxes{empty: true}
	})
	good := startTLSServer(t, "good")
	if got, err := tlsTalk(h, at(good.port), "allowed.test", false); err == nil {
		t.Fatalf("got through: %q", got)
	}
	if a, d := h.f.Counts("sbx-1"); a+d != 0 {
		t.Errorf("counted %d %d", a, d)
	}
	if len(h.logs.audits()) != 0 || good.conns.Load() != 0 {
		t.Error("audited or reached the server")
	}
}

// openTLS opens a session through the proxy and leaves it open.
func openTLS(t *testing.T, h *harness, port uint16, sni string) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	c := h.dial(at(port))
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: certPool()})
	r := bufio.NewReader(tc)
	if l, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(l, "good sni="+sni) {
		t.Fatalf("greeting %q, %v", l, err)
	}
	return tc, r
}

func ping(tc *tls.Conn, r *bufio.Reader) error {
	if _, err := io.WriteString(tc, "ping\n"); err != nil {
		return err
	}
	l, err := r.ReadString('\n')
	if err == nil && l != "ping\n" {
		err = fmt.Errorf("echo %q", l)
	}
	return err
}

func TestRecheck(t *testing.T) {
	good := startTLSServer(t, "good")
	h := newHarness(t, map[string][]uint16{"allowed.test": nil, "keep.test": nil})
	gone, gr := openTLS(t, h, good.port, "allowed.test")
	kept, kr := openTLS(t, h, good.port, "keep.test")
	h.pol.set(map[string][]uint16{"keep.test": nil})
	h.f.Recheck(loopback)
	gone.SetDeadline(time.Now().Add(5 * time.Second))
	if err := ping(gone, gr); err == nil {
		t.Error("the connection the policy no longer allows still works")
	}
	if err := ping(kept, kr); err != nil {
		t.Errorf("the allowed connection: %v", err)
	}
	// The sandbox is gone: everything of it goes.
	h.pol.set(nil)
	h.f.Recheck(loopback)
	kept.SetDeadline(time.Now().Add(5 * time.Second))
	if err := ping(kept, kr); err == nil {
		t.Error("still works after its last rule went")
	}
}

func TestForgetClosesConnections(t *testing.T) {
	good := startTLSServer(t, "good")
	h := newHarness(t, map[string][]uint16{"allowed.test": nil})
	tc, r := openTLS(t, h, good.port, "allowed.test")
	h.f.Forget("sbx-1")
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := ping(tc, r); err == nil {
		t.Error("a forgotten sandbox's connection still works")
	}
}

func TestOriginalDstNeedsTCP(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, err := originalDst(a); err == nil {
		t.Error("no error for a pipe")
	}
	// A connection nft did not redirect has no original destination
	// to tell (or, without conntrack, no way to ask).
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if d, err := originalDst(c); err == nil && d.Port() != uint16(ln.Addr().(*net.TCPAddr).Port) {
		t.Errorf("original destination %v of a direct connection", d)
	}
}

func TestAuditRateLimit(t *testing.T) {
	h := newHarness(t, map[string][]uint16{"allowed.test": nil})
	deny := func(host string) {
		c := h.dial(at(80))
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		io.ReadAll(c)
	}
	for range 5 {
		deny("denied.test")
	}
	if n := len(h.logs.audits()); n != 1 {
		t.Fatalf("%d audit lines for one destination, want 1", n)
	}
	start := time.Now()
	for i := range 60 {
		deny(fmt.Sprintf("d%d.test", i))
	}
	max := 20 + int(time.Since(start).Seconds()*10) + 1
	n := len(h.logs.audits())
	if n < 20 || n > max {
		t.Fatalf("%d audit lines for 61 destinations, want 20..%d", n, max)
	}
	if _, denied := h.f.Counts("sbx-1"); denied != 65 {
		t.Errorf("denied %d, want 65", denied)
	}
}

func TestAuditLimiterMemory(t *testing.T) {
	var a audit.Limiter
	now := time.Now()
	for i := range 100000 {
		a.Allow(now.Add(time.Duration(i)*time.Millisecond), fmt.Sprint(i))
	}
	if a.Keys() > audit.MaxKeys {
		t.Fatalf("%d keys kept", a.Keys())
	}
}

func settleGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want %d:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close ends live proxied connections, half-read ones, DNS-over-TCP
// connections and queries waiting on a silent upstream, and leaves no
// goroutine behind.
func TestCloseLeavesNothing(t *testing.T) {
	good := startTLSServer(t, "good")
	dns := startDNS(t, map[string][]string{"allowed.test": {"127.0.0.1"}})
	settleGoroutines(t, runtime.NumGoroutine())
	base := runtime.NumGoroutine()
	pol := newPolicy(map[string][]uint16{"allowed.test": nil, "slow.test": nil})
	var dst netip.AddrPort
	var mu sync.Mutex
	f, err := Start(context.Background(), Config{
		Listen:      loopback,
		Reachable:   onlyLoopback,
		Resolvers:   []netip.AddrPort{dns.addr},
		Sandboxes:   &fakeSandboxes{p: pol},
		OriginalDst: func(net.Conn) (netip.AddrPort, error) { mu.Lock(); defer mu.Unlock(); return dst, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	dst = at(good.port)
	mu.Unlock()
	live, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.ProxyPort()))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	tc := tls.Client(live, &tls.Config{ServerName: "allowed.test", RootCAs: certPool()})
	r := bufio.NewReader(tc)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	half, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.ProxyPort()))
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	io.WriteString(half, "GET / HTTP/1.1\r\n")
	dnsConn, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.DNSPort()))
	if err != nil {
		t.Fatal(err)
	}
	defer dnsConn.Close()
	if resp := tcpQuery(t, dnsConn, query(t, 7, "allowed.test", true)); rcodeOf(resp) != 0 {
		t.Fatalf("rcode %d", rcodeOf(resp))
	}
	// A query stuck on an upstream that does not answer.
	u, err := net.Dial("udp4", fmt.Sprintf("127.0.0.1:%d", f.DNSPort()))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	u.Write(query(t, 8, "slow.test", true))
	time.Sleep(100 * time.Millisecond)
	if runtime.NumGoroutine() <= base {
		t.Fatal("nothing running?")
	}
	start := time.Now()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	settleGoroutines(t, base)
	for _, c := range []net.Conn{live, half, dnsConn} {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%v still open after Close: %v", c.LocalAddr(), err)
		}
	}
}

func TestStartWithContext(t *testing.T) {
	base := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	f, err := Start(ctx, Config{Listen: loopback, Reachable: onlyLoopback, Sandboxes: &fakeSandboxes{}})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", f.ProxyPort()), time.Second); err == nil {
		// The listener may close a moment after cancel.
		time.Sleep(100 * time.Millisecond)
	}
	f.Close()
	settleGoroutines(t, base)
}

func TestStartNeeds(t *testing.T) {
	ok := Config{Listen: loopback, Reachable: onlyLoopback, Sandboxes: &fakeSandboxes{}}
	for name, mod := range map[string]func(*Config){
		"listen":    func(c *Config) { c.Listen = netip.Addr{} },
		"sandboxes": func(c *Config) { c.Sandboxes = nil },
		"reachable": func(c *Config) { c.Reachable = nil },
	} {
		cfg := ok
		mod(&cfg)
		if f, err := Start(t.Context(), cfg); err == nil {
			f.Close()
			t.Errorf("started without %s", name)
		}
	}
}
