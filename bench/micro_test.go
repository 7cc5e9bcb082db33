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
// limiter are benchmarked through their exported APIs: Pools
// over sandboxtest's in-memory backend, and ratelimit's Limiter/Tenants.
//
// These are benchmarks only: `go test ./...` compiles them and runs none.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/envd"
	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/ratelimit"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/sandboxtest"
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

func (f *fakeBackend) Pause(context.Context, string, runtime.PauseKind) error {
	return runtime.ErrUnavailable
}
func (f *fakeBackend) Resume(context.Context, string) (bool, error) {
	return false, runtime.ErrUnavailable
}

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
	mgr  *sandbox.Manager
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
	mgr := sandbox.New(sandbox.Config{Store: st, Backend: be, BackendName: "fake", Log: log, EnvdVersion: envdapi.Version})
	handler := server.New(server.Config{Manager: mgr, Store: st, Log: log, EnvdVersion: envdapi.Version, Ready: func() bool { return true }})
	srv := httptest.NewServer(handler)
	h := &Harness{addr: srv.Listener.Addr().String(), key: key, keys: map[string]string{"bench": key}, live: map[string]bool{}, api: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	e := &microEnv{be: be, mgr: mgr, srv: srv, key: key, h: h}
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

// ---- pool claim (package pool) ----

var benchPoolKey = pool.Key{Tenant: "bench", Template: "base", CPUCount: 2, MemoryMB: 512, DiskMB: 1024}

// poolEnv runs pool.Pools over sandboxtest's in-memory backend (Create is a
// map insert, /health is answered by Health directly). Refills can be held
// back with frozen (through Admit), so that a hit benchmark measures Claim
// and not the refiller racing it for the lock.
type poolEnv struct {
	p       *pool.Pools
	be      *sandboxtest.Backend
	frozen  atomic.Bool
	minWarm atomic.Int64
}

// poolEnv is its pools' admission: one seed pool, min_warm from the env,
// refills held back while frozen.
func (e *poolEnv) Seeds() []pool.Key { return []pool.Key{benchPoolKey} }

func (e *poolEnv) MinWarm(k pool.Key) int {
	if k.Tenant == benchPoolKey.Tenant {
		return int(e.minWarm.Load())
	}
	return 0
}

func (e *poolEnv) AdmitMember(context.Context, pool.Key, int, int) error {
	if e.frozen.Load() {
		return errors.New("frozen")
	}
	return nil
}

func newPoolEnv(b *testing.B, minWarm int, lead time.Duration) *poolEnv {
	b.Helper()
	e := &poolEnv{be: sandboxtest.New()}
	e.minWarm.Store(int64(minWarm))
	var n atomic.Int64
	e.p = pool.New(pool.Config{
		Backend:    e.be,
		Health:     func(context.Context, string) error { return nil },
		Admission:  e,
		NewID:      func() string { return fmt.Sprintf("m%d", n.Add(1)) },
		NewToken:   func() string { return "tok" },
		Log:        slog.New(slog.DiscardHandler),
		Lead:       lead,
		MaxPerPool: max(minWarm, 1),
		Parallel:   8,
		Tick:       time.Hour, // only claims (and kick) wake the refiller
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.p.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done; e.be.Close() })
	return e
}

// kick wakes the refiller: a claim on a key of another tenant (whose
// min_warm is 0, so its pool never fills).
func (e *poolEnv) kick() {
	e.p.Claim(pool.Key{Tenant: "kick", Template: "base", CPUCount: 2, MemoryMB: 512, DiskMB: 1024}, false)
}

func (e *poolEnv) ready() int {
	for _, s := range e.p.Stats() {
		if s.Key == benchPoolKey {
			return s.Ready
		}
	}
	return 0
}

// refill lets the refiller bring the pool back to min_warm, then freezes it.
func (e *poolEnv) refill(b *testing.B) {
	want := int(e.minWarm.Load())
	e.frozen.Store(false)
	deadline := time.Now().Add(30 * time.Second)
	for e.ready() < want {
		if time.Now().After(deadline) {
			b.Fatalf("pool holds %d ready members after 30s, want %d", e.ready(), want)
		}
		e.kick()
		time.Sleep(200 * time.Microsecond)
	}
	e.frozen.Store(true)
}

// Claim of a ready member (a hit), refills held back: the lock, the
// claim-rate update, the hit count and the wake of the refiller. The pool
// is refilled outside the timer every 1024 claims.
func BenchmarkPoolClaimHit(b *testing.B) {
	const size = 1024
	e := newPoolEnv(b, size, -1)
	e.refill(b)
	left := size
	b.ReportAllocs()
	for b.Loop() {
		if left == 0 {
			b.StopTimer()
			e.refill(b)
			left = size
			b.StartTimer()
		}
		if _, ok := e.p.Claim(benchPoolKey, false); !ok {
			b.Fatal("claim missed a full pool")
		}
		left--
	}
}

// Claim of an empty pool (a miss: the caller would cold create). min_warm 0
// and no adaptive sizing, so the pool stays empty; each claim still wakes
// the refiller, whose pass runs concurrently, as in sandboxd.
func BenchmarkPoolClaimMiss(b *testing.B) {
	e := newPoolEnv(b, 0, -1)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := e.p.Claim(benchPoolKey, false); ok {
			b.Fatal("claim hit an empty pool")
		}
	}
}

// Misses from GOMAXPROCS goroutines at once, on 16 keys (tenants): the
// cost of Pools' one lock under contention.
func BenchmarkPoolClaimMissParallel(b *testing.B) {
	e := newPoolEnv(b, 0, -1)
	var keys [16]pool.Key
	for i := range keys {
		keys[i] = benchPoolKey
		keys[i].Tenant = tenant.ID(fmt.Sprintf("t%d", i))
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		k := keys[int(next.Add(1))%len(keys)]
		for pb.Next() {
			e.p.Claim(k, false)
		}
	})
}

// fixedWarm admits every member and keeps claimed pools this warm.
type fixedWarm int

func (fixedWarm) Seeds() []pool.Key                                     { return nil }
func (n fixedWarm) MinWarm(pool.Key) int                                { return int(n) }
func (fixedWarm) AdmitMember(context.Context, pool.Key, int, int) error { return nil }

// POST /v2/sandboxes + DELETE through the real handler with a warm pool of
// 8 over the in-process-envd fake backend: the API path of a warm claim
// (auth, SQLite, Claim, /init), to set beside APICreateDestroy (no pool).
// The refiller runs concurrently, as in sandboxd; hits/op says how many
// creates were served from the pool.
func BenchmarkAPIWarmCreateDestroy(b *testing.B) {
	e := newMicroEnv(b)
	const size = 8
	p := pool.New(pool.Config{
		Backend:   e.be,
		Health:    e.mgr.EnvdHealth,
		Admission: fixedWarm(size),
		NewID:     sandbox.NewID,
		NewToken:  sandbox.NewToken,
		Log:       slog.New(slog.DiscardHandler),
		Lead:      -1,
		Parallel:  2,
	})
	e.mgr.UsePool(p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	// The first create is a miss that makes the pool; wait for it to fill.
	sb, err := e.h.create(ctx, false)
	if err != nil {
		b.Fatal(err)
	}
	if err := e.h.destroy(ctx, sb.ID); err != nil {
		b.Fatal(err)
	}
	waitReady := func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			ready := 0
			for _, s := range p.Stats() {
				ready += s.Ready
			}
			if ready >= size {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("pool holds %d ready members after 30s, want %d", ready, size)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitReady()
	hits0 := poolHits(p)
	for b.Loop() {
		sb, err := e.h.create(ctx, false)
		if err != nil {
			b.Fatal(err)
		}
		if err := e.h.destroy(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(poolHits(p)-hits0)/float64(b.N), "hits/op")
}

func poolHits(p *pool.Pools) uint64 {
	var h uint64
	for _, c := range p.Counts() {
		h += c.Hits
	}
	return h
}

// ---- limiter (package ratelimit) ----

// Allow on one key whose bucket never runs dry (rate far above the loop's):
// what every API request pays when limits are on.
func BenchmarkLimiterAllow(b *testing.B) {
	l := ratelimit.New(10*time.Minute, nil)
	lim := ratelimit.Limit{Rate: 1e12, Burst: 1 << 30}
	b.ReportAllocs()
	for b.Loop() {
		if !l.Allow("create/bench", lim).Allowed {
			b.Fatal("refused")
		}
	}
}

// Allow on an empty bucket: the refusal path (reserve, cancel, Retry-After),
// what a flooding tenant's requests cost.
func BenchmarkLimiterRefuse(b *testing.B) {
	l := ratelimit.New(10*time.Minute, nil)
	lim := ratelimit.Limit{Rate: 1e-9, Burst: 1}
	l.Allow("create/flood", lim)
	b.ReportAllocs()
	for b.Loop() {
		if l.Allow("create/flood", lim).Allowed {
			b.Fatal("allowed")
		}
	}
}

// Allow over 10,000 keys in turn (a client address per request, as the
// per-IP limit sees them): map lookups over a large set of buckets.
func BenchmarkLimiterAllow10kKeys(b *testing.B) {
	l := ratelimit.New(10*time.Minute, nil)
	lim := ratelimit.Limit{Rate: 1e12, Burst: 1 << 30}
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("ip/10.0.%d.%d", i/256, i%256)
		l.Allow(keys[i], lim)
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		l.Allow(keys[i], lim)
		i++
		if i == len(keys) {
			i = 0
		}
	}
}

// Tenants.Allow from GOMAXPROCS goroutines over 16 tenants: the policy
// lookup (tenant settings over the class default) plus Limiter's one lock
// under contention.
func BenchmarkLimiterTenantsParallel(b *testing.B) {
	set := tenant.Settings{Limits: map[tenant.Class]tenant.Limit{tenant.Create: {Rate: tenant.Of(1e12), Burst: tenant.Of(1 << 30)}}}
	ts := &ratelimit.Tenants{
		Limiter: ratelimit.New(10*time.Minute, nil),
		Policy: ratelimit.Policy{
			Defaults: map[tenant.Class]ratelimit.Limit{
				tenant.Create: {Rate: 5, Burst: 20},
				tenant.Read:   {Rate: 1e12, Burst: 1 << 30},
			},
			Settings: func(tenant.ID) tenant.Settings { return set },
		},
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		t := tenant.ID(fmt.Sprintf("t%d", next.Add(1)%16))
		c := tenant.Create
		for pb.Next() {
			ts.Allow(t, c)
		}
	})
}
