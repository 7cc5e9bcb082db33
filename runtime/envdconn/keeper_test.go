package envdconn_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// keeperEnvd is an envd stand-in on a unix socket that counts the
// connections it accepted and can close them all (an envd restarted).
type keeperEnvd struct {
	path     string
	accepted atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
	handler  http.HandlerFunc
}

func newKeeperEnvd(t *testing.T, h http.HandlerFunc) *keeperEnvd {
	t.Helper()
	e := &keeperEnvd{path: filepath.Join(t.TempDir(), "envd.sock"), handler: h}
	ln, err := net.Listen("unix", e.path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: h,
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateNew {
				e.accepted.Add(1)
				e.mu.Lock()
				e.conns = append(e.conns, c)
				e.mu.Unlock()
			}
		},
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return e
}

// cut closes every connection envd accepted so far, from envd's side.
func (e *keeperEnvd) cut() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.conns {
		c.Close()
	}
	e.conns = nil
}

func (e *keeperEnvd) dial(ctx context.Context) (net.Conn, error) {
	return envdconn.DialSocket(ctx, e.path, "sb")
}

func TestKeeper(t *testing.T) {
	ok := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/init" {
			body, _ := io.ReadAll(r.Body)
			if string(body) != `{"a":1}` {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
		}
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		if r.URL.Path == "/big" {
			w.WriteHeader(http.StatusOK)
			w.Write([]byte(strings.Repeat("x", 5000)))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
	type ask struct {
		path   string
		last   bool // AskLast
		before func(e *keeperEnvd, k *envdconn.Keeper)
	}
	tests := []struct {
		name string
		asks []ask
		// wantDials is how many connections envd accepted in all.
		wantDials int64
	}{
		{"one connection for requests in a row", []ask{{path: "/health"}, {path: "/init"}, {path: "/health"}}, 1},
		{"envd closes it: the next dials", []ask{{path: "/close"}, {path: "/health"}, {path: "/health"}}, 2},
		{"an answer longer than read: not kept", []ask{{path: "/big"}, {path: "/health"}}, 2},
		{"envd gone from under a kept one: asked again on a new one", []ask{
			{path: "/health"},
			{path: "/init", before: func(e *keeperEnvd, _ *envdconn.Keeper) { e.cut() }},
			{path: "/health"},
		}, 2},
		{"forgotten: the next dials", []ask{
			{path: "/health"},
			{path: "/health", before: func(_ *keeperEnvd, k *envdconn.Keeper) { k.Forget("sb") }},
		}, 2},
		{"AskLast uses the kept one and keeps none", []ask{
			{path: "/health"},
			{path: "/init", last: true},
			{path: "/health"},
		}, 2},
		{"AskLast without one dials and keeps none", []ask{
			{path: "/init", last: true},
			{path: "/health"},
		}, 2},
		{"closed: the next dials", []ask{
			{path: "/health"},
			{path: "/health", before: func(_ *keeperEnvd, k *envdconn.Keeper) { k.Close() }},
		}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newKeeperEnvd(t, ok)
			var k envdconn.Keeper
			t.Cleanup(k.Close)
			for i, a := range tt.asks {
				if a.before != nil {
					a.before(e, &k)
				}
				method, body := http.MethodGet, []byte(nil)
				if a.path == "/init" {
					method, body = http.MethodPost, []byte(`{"a":1}`)
				}
				askFn := k.Ask
				if a.last {
					askFn = k.AskLast
				}
				status, msg, err := askFn(t.Context(), "sb", e.dial, method, a.path, body)
				if err != nil || (status != http.StatusNoContent && status != http.StatusOK) {
					t.Fatalf("ask %d (%s) = %d %q, %v; want 204 or 200", i, a.path, status, msg, err)
				}
				if a.path == "/big" && len(msg) != 4096 {
					t.Errorf("ask %d (/big) read %d bytes; want the first 4096", i, len(msg))
				}
			}
			if got := e.accepted.Load(); got != tt.wantDials {
				t.Errorf("envd accepted %d connections; want %d", got, tt.wantDials)
			}
		})
	}
}

// A connection idle for longer than MaxIdle is closed at a later request
// (to any sandbox), and a sandbox's next request dials again.
func TestKeeperMaxIdle(t *testing.T) {
	e := newKeeperEnvd(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	k := envdconn.Keeper{MaxIdle: 50 * time.Millisecond}
	t.Cleanup(k.Close)
	ask := func(id string) {
		t.Helper()
		if _, _, err := k.Ask(t.Context(), id, e.dial, http.MethodGet, "/health", nil); err != nil {
			t.Fatal(err)
		}
	}
	ask("a")
	ask("b")
	time.Sleep(60 * time.Millisecond)
	ask("b") // reuses b's, and drops a's, idle for longer than MaxIdle
	if got := e.accepted.Load(); got != 2 {
		t.Fatalf("envd accepted %d connections; want 2 (a's and b's)", got)
	}
	ask("a")
	if got := e.accepted.Load(); got != 3 {
		t.Errorf("envd accepted %d connections; want 3 (a's dropped, dialled again)", got)
	}
}

// A request whose context ends is not asked again, and its connection is
// not kept: the context's end left a deadline on it.
func TestKeeperContextEnds(t *testing.T) {
	release := make(chan struct{})
	e := newKeeperEnvd(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		w.WriteHeader(http.StatusNoContent)
	})
	t.Cleanup(func() { close(release) })
	var k envdconn.Keeper
	t.Cleanup(k.Close)
	if _, _, err := k.Ask(t.Context(), "sb", e.dial, http.MethodGet, "/health", nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := k.Ask(ctx, "sb", e.dial, http.MethodGet, "/slow", nil); err == nil {
		t.Fatal("ask of /slow past its context's end succeeded")
	}
	if got := e.accepted.Load(); got != 1 {
		t.Errorf("envd accepted %d connections; want 1 (no second try after the context ended)", got)
	}
	if _, _, err := k.Ask(t.Context(), "sb", e.dial, http.MethodGet, "/health", nil); err != nil {
		t.Fatal(err)
	}
	if got := e.accepted.Load(); got != 2 {
		t.Errorf("envd accepted %d connections; want 2 (the timed-out one not kept)", got)
	}
}
