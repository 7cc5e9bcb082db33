package main

// Go micro-benchmarks for sandboxd's hot paths, in one process and without
// containers, so that a change to the proxy, the Connect stream writer or
// the API shows up without the noise of namespaces and cgroups:
//
//	go test -run '^$' -bench . -benchtime 2s ./bench
//
// A fake runtime.Backend gives every "sandbox" an in-process envd on a unix
// socket; the sandboxd handler (API, auth, SQLite store, proxy) is the real
// one. Each proxied benchmark has a twin that talks to the same envd on its
// socket, so the difference is the proxy's cost. The pool claim and the
// limiter of issue 8's list do not exist yet (issue 5).
//
// These are benchmarks only: `go test ./...` compiles them and runs none.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/envd"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// fakeBackend runs each sandbox's envd in this process, on a unix socket.
type fakeBackend struct {
	dir string
	mu  sync.Mutex
	sbx map[string]*fakeSandbox
}

type fakeSandbox struct {
	info runtime.Sandbox
	sock string
	srv  *envd.Server
	hs   *http.Server
}

var _ runtime.Backend = (*fakeBackend)(nil)

func defaultUser() string {
	if _, err := user.Lookup("user"); err == nil {
		return "user"
	}
	return "root"
}

func (f *fakeBackend) Create(_ context.Context, s runtime.Spec) (*runtime.Sandbox, error) {
	sock := filepath.Join(f.dir, s.ID+".sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	srv := envd.New(envd.Config{Log: slog.New(slog.DiscardHandler), DefaultUser: defaultUser()})
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(l)
	fs := &fakeSandbox{
		info: runtime.Sandbox{ID: s.ID, Template: s.Template, State: runtime.StateRunning, Spec: s, CreatedAt: time.Now()},
		sock: sock, srv: srv, hs: hs,
	}
	f.mu.Lock()
	f.sbx[s.ID] = fs
	f.mu.Unlock()
	info := fs.info
	return &info, nil
}

func (f *fakeBackend) get(id string) *fakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sbx[id]
}

func (f *fakeBackend) Destroy(_ context.Context, id string) error {
	f.mu.Lock()
	fs := f.sbx[id]
	delete(f.sbx, id)
	f.mu.Unlock()
	if fs != nil {
		fs.hs.Close()
		fs.srv.Close()
		os.Remove(fs.sock)
	}
	return nil
}

func (f *fakeBackend) Pause(context.Context, string) error  { return runtime.ErrUnavailable }
func (f *fakeBackend) Resume(context.Context, string) error { return runtime.ErrUnavailable }

func (f *fakeBackend) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	fs := f.get(id)
	if fs == nil {
		return nil, runtime.ErrNotFound
	}
	if port != runtime.EnvdPort {
		return nil, runtime.ErrUnavailable
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", fs.sock)
}

func (f *fakeBackend) Stats(context.Context, string) (runtime.Stats, error) {
	return runtime.Stats{}, nil
}

func (f *fakeBackend) List(context.Context) ([]*runtime.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*runtime.Sandbox
	for _, fs := range f.sbx {
		info := fs.info
		out = append(out, &info)
	}
	return out, nil
}

// microEnv is a real sandboxd handler on a fake backend, served on
// loopback, with one tenant and its key.
type microEnv struct {
	be   *fakeBackend
	srv  *httptest.Server
	key  string
	h    *Harness // only for its API client helpers
	stop func()
}

func newMicroEnv(b *testing.B) *microEnv {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("envd runs processes as other users: needs root")
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sbx-micro-")
	if err != nil {
		b.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(dir, "data"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := st.CreateTenant(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	key, _, err := st.CreateKey(ctx, tenant.ID("bench"))
	if err != nil {
		b.Fatal(err)
	}
	be := &fakeBackend{dir: dir, sbx: map[string]*fakeSandbox{}}
	log := slog.New(slog.DiscardHandler)
	mgr := sandbox.New(sandbox.Config{Store: st, Backend: be, BackendName: "fake", Log: log, EnvdVersion: envd.Version})
	handler := server.New(server.Config{Manager: mgr, Store: st, Log: log, EnvdVersion: envd.Version, Ready: func() bool { return true }})
	srv := httptest.NewServer(handler)
	h := &Harness{addr: srv.Listener.Addr().String(), key: key, keys: map[string]string{"bench": key}, live: map[string]bool{}, api: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	e := &microEnv{be: be, srv: srv, key: key, h: h}
	e.stop = func() {
		srv.Close()
		for _, id := range mapKeys(h.live) {
			_ = be.Destroy(ctx, id)
		}
		st.Close()
		os.RemoveAll(dir)
	}
	b.Cleanup(e.stop)
	return e
}

// targets creates a sandbox and returns the proxied and the socket path to
// its envd.
func (e *microEnv) targets(b *testing.B) (proxy, socket *envdTarget) {
	sb, err := e.h.create(context.Background(), false)
	if err != nil {
		b.Fatal(err)
	}
	proxy = e.h.proxyTarget(sb)
	fs := e.be.get(sb.ID)
	socket = newTarget("socket", "http://envd", func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", fs.sock)
	}, http.Header{"X-Access-Token": {sb.Token}})
	b.Cleanup(func() { proxy.close(); socket.close() })
	return proxy, socket
}

// pick returns the proxied or the socket target.
func (e *microEnv) pick(b *testing.B, viaProxy bool) *envdTarget {
	p, s := e.targets(b)
	if viaProxy {
		return p
	}
	return s
}

func benchHealth(b *testing.B, viaProxy bool) {
	t := newMicroEnv(b).pick(b, viaProxy)
	ctx := context.Background()
	for b.Loop() {
		if err := t.health(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// GET /health: the proxy's per-request cost with no work behind it.
func BenchmarkProxyHealth(b *testing.B)  { benchHealth(b, true) }
func BenchmarkSocketHealth(b *testing.B) { benchHealth(b, false) }

func benchStartTrue(b *testing.B, viaProxy bool) {
	t := newMicroEnv(b).pick(b, viaProxy)
	ctx := context.Background()
	for b.Loop() {
		if _, err := t.run(ctx, "/bin/true"); err != nil {
			b.Fatal(err)
		}
	}
}

// process.Start of /bin/true read to the end of its stream.
func BenchmarkProxyStartTrue(b *testing.B)  { benchStartTrue(b, true) }
func BenchmarkSocketStartTrue(b *testing.B) { benchStartTrue(b, false) }

func benchStdout(b *testing.B, viaProxy bool) {
	t := newMicroEnv(b).pick(b, viaProxy)
	ctx := context.Background()
	const size = 2 << 20
	script := fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x`, size)
	b.SetBytes(size)
	for b.Loop() {
		r, err := t.run(ctx, "/bin/sh", "-c", script)
		if err != nil {
			b.Fatal(err)
		}
		if r.stdout != size {
			b.Fatalf("got %d bytes", r.stdout)
		}
	}
}

// 2 MiB of stdout through envd's Connect stream writer (JSON codec, base64
// payloads), and through the proxy's flushing copy.
func BenchmarkProxyStdout2MiB(b *testing.B)  { benchStdout(b, true) }
func BenchmarkSocketStdout2MiB(b *testing.B) { benchStdout(b, false) }

// POST /v2/sandboxes and DELETE with a backend that costs nothing: API
// key auth, the SQLite writes of the lifecycle, envd /init.
func BenchmarkAPICreateDestroy(b *testing.B) {
	e := newMicroEnv(b)
	ctx := context.Background()
	for b.Loop() {
		sb, err := e.h.create(ctx, false)
		if err != nil {
			b.Fatal(err)
		}
		if err := e.h.destroy(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// GET /v2/sandboxes with 100 live sandboxes: the list page the SDKs' list()
// fetches.
func BenchmarkAPIList100(b *testing.B) {
	e := newMicroEnv(b)
	ctx := context.Background()
	for range 100 {
		if _, err := e.h.create(ctx, false); err != nil {
			b.Fatal(err)
		}
	}
	url := "http://" + e.h.addr + apiPrefix + "/v2/sandboxes?limit=100"
	for b.Loop() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("X-API-Key", e.key)
		resp, err := e.h.api.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var body []json.RawMessage
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || len(body) != 100 {
			b.Fatalf("list: %v, %d sandboxes", err, len(body))
		}
	}
}
