package relay

import (
	"crypto/tls"
	"encoding/pem"
	"github.com/sandboxd/sandboxd/internal/testcert"
	"io"
	"log/slog"
	"net"
	"net/netip"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// pair is a self-signed certificate and its key, PEM.
type pair struct{ cert, key []byte }

// newPair makes an ECDSA P-256 self-signed certificate, like Incus's own.
func newPair(tb testing.TB, cn string) pair {
	tb.Helper()
	p := testcert.New(tb, cn)
	return pair{cert: p.Cert, key: p.Key}
}

func (p pair) der(tb testing.TB) []byte {
	tb.Helper()
	blk, _ := pem.Decode(p.cert)
	return blk.Bytes
}

func (p pair) tlsCert(tb testing.TB) tls.Certificate {
	tb.Helper()
	c, err := tls.X509KeyPair(p.cert, p.key)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// testRelay is a relay on a random loopback port whose targets are
// 127.0.0.0/30, and the certificates it serves with and pins.
type testRelay struct {
	srv          *Server
	addr         string
	server       pair // the relay's
	client       pair // pinned
	reg          *prometheus.Registry
	serveErr     chan error
	serveErrOnce sync.Once
}

var allowed = netip.MustParsePrefix("127.0.0.0/30")

// startRelay serves a relay until the test ends; edit adjusts its config.
func startRelay(tb testing.TB, edit func(*ServerConfig)) *testRelay {
	tb.Helper()
	r := &testRelay{server: newPair(tb, "relay"), client: newPair(tb, "sandboxd"), reg: prometheus.NewRegistry(), serveErr: make(chan error, 1)}
	cfg := ServerConfig{
		Certificate: r.server.tlsCert(tb),
		ClientCerts: [][]byte{newPair(tb, "other sandboxd").der(tb), r.client.der(tb)},
		Allow:       []netip.Prefix{allowed},
		Log:         slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Registerer:  r.reg,
	}
	if testing.Verbose() {
		cfg.Log = slog.New(slog.NewJSONHandler(tWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	r.srv, r.addr = srv, ln.Addr().String()
	go func() { r.serveErr <- srv.Serve(ln) }()
	tb.Cleanup(func() {
		srv.Close()
		if err := <-r.serveErr; err != ErrServerClosed {
			tb.Errorf("Serve = %v; want ErrServerClosed", err)
		}
	})
	return r
}

// dialer is a Dialer of r's pinned client.
func (r *testRelay) dialer(tb testing.TB) *Dialer {
	tb.Helper()
	cfg, err := ClientTLS(r.client.cert, r.client.key, r.server.cert)
	if err != nil {
		tb.Fatal(err)
	}
	return &Dialer{TLS: cfg, Timeout: 5 * time.Second}
}

// tWriter sends the relay's log to the test's.
type tWriter struct{ tb testing.TB }

func (w tWriter) Write(p []byte) (int, error) { w.tb.Log(string(p)); return len(p), nil }

// target is a TCP server on a loopback address that runs handle on each
// connection and counts them.
type target struct {
	addr     netip.AddrPort
	accepted atomic.Int32
}

// listenTarget serves handle on ip (a random port) until the test ends,
// and waits then for the handlers, which must return once their
// connection is closed.
func listenTarget(tb testing.TB, ip string, handle func(*net.TCPConn)) *target {
	tb.Helper()
	ln, err := net.Listen("tcp4", net.JoinHostPort(ip, "0"))
	if err != nil {
		tb.Fatal(err)
	}
	tg := &target{addr: netip.MustParseAddrPort(ln.Addr().String())}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tg.accepted.Add(1)
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c.(*net.TCPConn))
			}()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return tg
}

// echo sends back what it reads until EOF, then half-closes.
func echo(c *net.TCPConn) {
	if _, err := io.Copy(c, c); err == nil {
		_ = c.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, c)
}

// noLeaks fails the test if it ends with more goroutines than it started
// with, once they have had 5 s to end. Register it first: cleanups run
// last-in first-out, so it checks after every other.
func noLeaks(tb testing.TB) {
	tb.Helper()
	before := goruntime.NumGoroutine()
	tb.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := goruntime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:goruntime.Stack(buf, true)]
				tb.Errorf("%d goroutines at the end, %d at the start:\n%s", n, before, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
