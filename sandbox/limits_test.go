package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox/sandboxtest"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/store/storetest"
	"github.com/sandboxd/sandboxd/tenant"
)

type testEnv struct {
	st       *store.Store
	be       *sandboxtest.Backend
	settings *Settings
	m        *Manager
	served   sync.Map // sandbox template -> last served_from
}

func newTestEnv(t *testing.T, mod func(*Config)) *testEnv {
	t.Helper()
	ctx := context.Background()
	st, _ := storetest.Open(t)
	for _, name := range []string{"a", "b"} {
		if _, err := st.EnsureTenant(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	be := sandboxtest.New()
	t.Cleanup(be.Close)
	e := &testEnv{st: st, be: be}
	e.settings = NewSettings(st, Defaults{}, slog.New(slog.DiscardHandler))
	cfg := Config{
		Store: st, Backend: be, BackendName: "fake", Log: slog.New(slog.DiscardHandler), Settings: e.settings,
		OnCreateFrom: func(template, servedFrom string, _ time.Duration) { e.served.Store(template, servedFrom) },
	}
	if mod != nil {
		mod(&cfg)
	}
	e.m = New(cfg)
	return e
}

func (e *testEnv) set(t *testing.T, name string, fn func(*tenant.Settings)) {
	t.Helper()
	if _, err := e.st.UpdateTenantSettings(context.Background(), tenant.ID(name), fn); err != nil {
		t.Fatal(err)
	}
	if err := e.settings.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func as(name string) context.Context {
	return tenant.WithContext(context.Background(), tenant.ID(name))
}

func TestQuotaMaxSandboxes(t *testing.T) {
	e := newTestEnv(t, nil)
	e.set(t, "a", func(s *tenant.Settings) { s.MaxSandboxes = tenant.Of(2) })
	var ids []string
	for range 2 {
		sb, err := e.m.Create(as("a"), CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	// Paused sandboxes still count.
	if err := e.m.Pause(as("a"), ids[0], true); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.Create(as("a"), CreateRequest{})
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("third create: %v, want ErrResourceExhausted", err)
	}
	if msg, ok := errdefs.Public(err); !ok || msg == "" {
		t.Fatalf("quota error has no user-facing message: %v", err)
	}
	if got := e.be.Len(); got != 2 {
		t.Fatalf("backend holds %d, want 2: a refused create left something", got)
	}
	// Another tenant is not affected.
	if _, err := e.m.Create(as("b"), CreateRequest{}); err != nil {
		t.Fatalf("tenant b: %v", err)
	}
	// A killed sandbox frees its slot.
	if err := e.m.Kill(as("a"), ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(as("a"), CreateRequest{}); err != nil {
		t.Fatalf("after kill: %v", err)
	}
}

func TestQuotaIsAtomic(t *testing.T) {
	e := newTestEnv(t, nil)
	e.set(t, "a", func(s *tenant.Settings) { s.MaxSandboxes = tenant.Of(3) })
	if ok, refused := createConcurrently(t, e, "a", 12); ok != 3 || refused != 9 {
		t.Fatalf("%d created, %d refused; want 3 and 9", ok, refused)
	}
}

// createConcurrently makes n creates for tenant at once and counts those
// that succeeded and those refused by the quota; any other error fails t.
func createConcurrently(t *testing.T, e *testEnv, tenant string, n int) (ok, refused int32) {
	t.Helper()
	var okN, refusedN atomic.Int32
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, err := e.m.Create(as(tenant), CreateRequest{})
			switch {
			case err == nil:
				okN.Add(1)
			case errors.Is(err, errdefs.ErrResourceExhausted):
				refusedN.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	return okN.Load(), refusedN.Load()
}

func TestQuotaMaxMemory(t *testing.T) {
	e := newTestEnv(t, nil)
	e.set(t, "a", func(s *tenant.Settings) { s.MaxMemoryMB = tenant.Of(1000) })
	if _, err := e.m.Create(as("a"), CreateRequest{MemoryMB: 600}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(as("a"), CreateRequest{MemoryMB: 600}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("over memory quota: %v, want ErrResourceExhausted", err)
	}
	if _, err := e.m.Create(as("a"), CreateRequest{MemoryMB: 400}); err != nil {
		t.Fatalf("within memory quota: %v", err)
	}
}

func TestSettingsPickedUp(t *testing.T) {
	e := newTestEnv(t, nil)
	e.set(t, "a", func(s *tenant.Settings) { s.MaxSandboxes = tenant.Of(1) })
	if _, err := e.m.Create(as("a"), CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(as("a"), CreateRequest{}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("want quota refusal, got %v", err)
	}
	// As `sandboxd tenants set a --max-sandboxes default` from another
	// process, then the server's poll.
	e.set(t, "a", func(s *tenant.Settings) { s.MaxSandboxes = tenant.Value[int]{} })
	if _, err := e.m.Create(as("a"), CreateRequest{}); err != nil {
		t.Fatalf("after clearing the quota: %v", err)
	}
	if got := e.settings.Get("a").MaxSandboxes; got != 0 {
		t.Fatalf("effective max sandboxes %d, want 0 (server default: none)", got)
	}
}

func TestHostGuard(t *testing.T) {
	avail := atomic.Int64{}
	avail.Store(4096)
	e := newTestEnv(t, func(c *Config) {
		c.HostReserveMB = 512
		c.MemAvailable = func() (int, error) { return int(avail.Load()), nil }
	})
	if _, err := e.m.Create(as("a"), CreateRequest{MemoryMB: 512}); err != nil {
		t.Fatal(err)
	}
	avail.Store(900) // 900 - 512 reserved < 512 asked
	_, err := e.m.Create(as("a"), CreateRequest{MemoryMB: 512})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("short host: %v, want ErrUnavailable", err)
	}
	if _, err := e.m.Create(as("b"), CreateRequest{MemoryMB: 256}); err != nil {
		t.Fatalf("a small sandbox still fits: %v", err)
	}
}

func TestHostBudget(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.HostMemoryMB = 1024 })
	for _, name := range []string{"a", "b"} {
		if _, err := e.m.Create(as(name), CreateRequest{MemoryMB: 512}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.m.Create(as("a"), CreateRequest{MemoryMB: 512}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("over the host budget: %v, want ErrUnavailable", err)
	}
}

func TestParseMemAvailable(t *testing.T) {
	raw := []byte("MemTotal:       16303452 kB\nMemFree:         1234 kB\nMemAvailable:    8151726 kB\n")
	got, err := parseMeminfo(raw, "MemAvailable")
	if err != nil || got != 7960 {
		t.Fatalf("parse = %d, %v; want 7960", got, err)
	}
	if _, err := parseMeminfo([]byte("MemTotal: 1 kB\n"), "MemAvailable"); err == nil {
		t.Fatal("no MemAvailable: want an error")
	}
	if n, err := MemAvailableMB(); err != nil || n <= 0 {
		t.Fatalf("MemAvailableMB on this host = %d, %v", n, err)
	}
}

func TestCachedMB(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reads, value, fail := 0, 100, false
		get := cachedMB(time.Second, func() (int, error) {
			reads++
			if fail {
				return 0, errors.New("no meminfo")
			}
			return value, nil
		})
		steps := []struct {
			name      string
			sleep     time.Duration
			value     int
			fail      bool
			want      int
			wantErr   bool
			wantReads int
		}{
			{"first call reads", 0, 100, false, 100, false, 1},
			{"within the second: the value read", 500 * time.Millisecond, 200, false, 100, false, 1},
			{"a second on: read again", 600 * time.Millisecond, 200, false, 200, false, 2},
			{"a failed read is reported", 1100 * time.Millisecond, 300, true, 0, true, 3},
			{"and not kept: the next call reads", 0, 300, false, 300, false, 4},
		}
		for _, st := range steps {
			time.Sleep(st.sleep)
			value, fail = st.value, st.fail
			got, err := get()
			if got != st.want || (err != nil) != st.wantErr || reads != st.wantReads {
				t.Errorf("%s: got %d, %v after %d reads; want %d, error %v after %d",
					st.name, got, err, reads, st.want, st.wantErr, st.wantReads)
			}
		}
	})
}

// poolEnv runs warm pools over the test env's manager, as serve wires them.
func (e *testEnv) startPools(t *testing.T) *pool.Pools {
	t.Helper()
	p := pool.New(pool.Config{
		Backend: e.m.backend, Health: e.m.EnvdHealth, Admission: e.m.Admission(), MemberMB: e.m.Admission().MemberMB,
		NewID: NewID, NewToken: NewToken, Log: slog.New(slog.DiscardHandler),
		Tick: 20 * time.Millisecond,
	})
	e.m.UsePool(p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// waitFor runs in a synctest bubble: it lets the bubble settle, then
// advances the fake clock in small steps until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	synctest.Wait()
	for i := 0; !cond(); i++ {
		if i == 1000 {
			t.Fatalf("%s: not after %v of fake time", what, 1000*10*time.Millisecond)
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
	}
}

func ready(p *pool.Pools, t tenant.ID) int {
	n := 0
	for _, s := range p.Stats() {
		if s.Key.Tenant == t {
			n += s.Ready
		}
	}
	return n
}

func TestCreateFromPool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newTestEnv(t, nil)
		e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(2) })
		p := e.startPools(t)
		waitFor(t, "2 warm members", func() bool { return ready(p, "a") == 2 })
		warm := map[string]bool{}
		for _, id := range e.be.IDs() {
			warm[id] = true
		}

		// What an SDK's Sandbox.create(envs=..., secure=True) asks for.
		sb, err := e.m.Create(as("a"), CreateRequest{
			AllowInternet: true, Secure: true, EnvVars: map[string]string{"FOO": "bar"}, Metadata: map[string]string{"user": "u1"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if !warm[sb.ID] {
			t.Fatalf("sandbox %s was not one of the warm members %v", sb.ID, warm)
		}
		if v, _ := e.served.Load("base"); v != "pool" {
			t.Fatalf("served_from = %v, want pool", v)
		}
		// Per-user data reached envd through /init.
		inits := e.be.Inits(sb.ID)
		if len(inits) != 1 {
			t.Fatalf("/init calls = %d, want 1", len(inits))
		}
		env, _ := inits[0]["envVars"].(map[string]any)
		if env["FOO"] != "bar" || inits[0]["accessToken"] != sb.EnvdAccessToken || sb.EnvdAccessToken == "" {
			t.Fatalf("/init body %v, sandbox token %q", inits[0], sb.EnvdAccessToken)
		}
		// The backend's tunnel token is the sandbox's envd token.
		if got := e.be.Get(sb.ID).Spec.AccessToken; got != sb.EnvdAccessToken {
			t.Fatalf("backend token %q != envd token %q", got, sb.EnvdAccessToken)
		}
		got, err := e.m.Get(as("a"), sb.ID)
		if err != nil || got.State != store.StateRunning || got.Metadata["user"] != "u1" {
			t.Fatalf("stored sandbox %+v, %v", got, err)
		}
		// Refill: two warm again, plus the claimed one.
		waitFor(t, "refill", func() bool { return ready(p, "a") == 2 && e.be.Len() == 3 })

		// Another shape misses and is cold.
		sb2, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true, MemoryMB: 1024})
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := e.served.Load("base"); v != "cold" || warm[sb2.ID] {
			t.Fatalf("other shape: served_from %v, id %s", v, sb2.ID)
		}
		// Killing a claimed sandbox destroys it; it never goes back.
		if err := e.m.Kill(as("a"), sb.ID); err != nil {
			t.Fatal(err)
		}
		if e.be.Get(sb.ID) != nil {
			t.Fatal("killed sandbox still in the backend")
		}
		for range 2 {
			sb3, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true})
			if err != nil {
				t.Fatal(err)
			}
			if sb3.ID == sb.ID {
				t.Fatal("a killed sandbox's id was handed out again")
			}
		}
		c := p.Counts()
		if len(c) != 1 || c[0].Hits != 3 || c[0].Misses != 1 {
			t.Fatalf("counts %+v, want 3 hits 1 miss", c)
		}
	})
}

func TestPoolRespectsQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newTestEnv(t, nil)
		e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(5); s.MaxSandboxes = tenant.Of(3) })
		p := e.startPools(t)
		waitFor(t, "members", func() bool { return ready(p, "a") == 3 })
		time.Sleep(time.Second) // many ticks: still no more than the quota
		synctest.Wait()
		if got := ready(p, "a"); got != 3 {
			t.Fatalf("%d members, want 3 (max sandboxes)", got)
		}
		if _, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true}); err != nil {
			t.Fatal(err)
		}
		// One live sandbox + members stay within 3.
		waitFor(t, "pool shrinks its room", func() bool { return ready(p, "a") == 2 })
	})
}

// flakyBackend is the fake backend with a say over Dial (a member's envd
// made unreachable), a hold on the pool's creates and a count of Destroy
// calls per sandbox.
type flakyBackend struct {
	*sandboxtest.Backend
	mu       sync.Mutex
	destroys map[string]int
	dials    map[string]int
	// dial, when set, may fail a Dial before the fake does it.
	dial func(ctx context.Context, id string) error
	// poolHeld, when set, holds the pool's creates (those without a
	// tenant's Group: the pool's members are no tenant's until claimed)
	// until it is closed or their ctx ends.
	poolHeld chan struct{}
}

func (b *flakyBackend) Create(ctx context.Context, spec runtime.Spec) (*runtime.Sandbox, error) {
	b.mu.Lock()
	held := b.poolHeld
	b.mu.Unlock()
	if held != nil && spec.Group == "" {
		select {
		case <-held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return b.Backend.Create(ctx, spec)
}

func (b *flakyBackend) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	b.mu.Lock()
	dial := b.dial
	if b.dials == nil {
		b.dials = map[string]int{}
	}
	b.dials[id]++
	b.mu.Unlock()
	if dial != nil {
		if err := dial(ctx, id); err != nil {
			return nil, err
		}
	}
	return b.Backend.Dial(ctx, id, port)
}

func (b *flakyBackend) Destroy(ctx context.Context, id string) error {
	b.mu.Lock()
	b.destroys[id]++
	b.mu.Unlock()
	return b.Backend.Destroy(ctx, id)
}

func (b *flakyBackend) destroyed(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.destroys[id]
}

func (b *flakyBackend) dialled(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dials[id]
}

// A claimed member whose envd is gone is followed by another claim, which
// a second warm member serves: a cluster member that died takes its
// spares with it, and the members elsewhere answer at once.
func TestClaimFailedInitClaimsAnother(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fb *flakyBackend
		e := newTestEnv(t, func(c *Config) {
			fb = &flakyBackend{Backend: c.Backend.(*sandboxtest.Backend), destroys: map[string]int{}}
			c.Backend = fb
		})
		e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(2) })
		p := e.startPools(t)
		waitFor(t, "two members", func() bool { return ready(p, "a") == 2 })
		ids := e.be.IDs()
		// The first member claimed is the one whose envd is gone.
		var failed string
		fb.mu.Lock()
		fb.dial = func(_ context.Context, id string) error {
			if failed == "" && slices.Contains(ids, id) {
				failed = id
			}
			if id == failed {
				return runtime.ErrPaused
			}
			return nil
		}
		fb.mu.Unlock()
		sb, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true, Secure: true})
		synctest.Wait() // the failed member's destroy runs in the background
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := e.served.Load("base"); v != "pool" {
			t.Fatalf("served_from = %v, want pool (the other member)", v)
		}
		if !slices.Contains(ids, sb.ID) || sb.ID == failed || fb.destroyed(failed) != 1 {
			t.Fatalf("sandbox %s (members %v, %s failed and destroyed %d times)", sb.ID, ids, failed, fb.destroyed(failed))
		}
	})
}

// A claimed member whose envd is gone (its /init fails) is destroyed, once,
// and the create goes on cold, under an id and token of its own: the
// caller gets a sandbox, not an error. The quota (one sandbox) proves the
// first attempt gave everything back before the second was admitted. A
// cold create that fails too, and a create whose caller went away, end in
// an error; none leaves a row, a pending count or a lock. The pool's
// refills are held while the create runs: one ready in time would be
// claimed instead of the cold create (TestClaimFailedInitClaimsAnother),
// and whether it is ready in time is the scheduler's choice.
func TestClaimFailedInitFallsBackCold(t *testing.T) {
	for _, tc := range []struct {
		name string
		// kill makes the member's /init fail; cancel is the create's.
		kill          func(e *testEnv, fb *flakyBackend, member string, cancel context.CancelFunc)
		wantErr       bool
		wantFallbacks int
	}{
		{
			name: "member's envd gone",
			kill: func(e *testEnv, _ *flakyBackend, member string, _ context.CancelFunc) {
				_ = e.be.Pause(context.Background(), member, runtime.PauseMemory) // Dial: ErrPaused
			},
			wantFallbacks: 1,
		},
		{
			name: "cold create fails too",
			kill: func(e *testEnv, _ *flakyBackend, _ string, _ context.CancelFunc) {
				e.be.FailInit.Store(true) // the member's /init, and the cold create's probe
			},
			wantErr: true, wantFallbacks: 1,
		},
		{
			name: "caller went away",
			kill: func(_ *testEnv, fb *flakyBackend, member string, cancel context.CancelFunc) {
				fb.mu.Lock()
				defer fb.mu.Unlock()
				fb.dial = func(ctx context.Context, id string) error {
					if id != member {
						return nil
					}
					cancel()
					return ctx.Err()
				}
			},
			wantErr: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var fb *flakyBackend
				var fallbacks atomic.Int64
				e := newTestEnv(t, func(c *Config) {
					fb = &flakyBackend{Backend: c.Backend.(*sandboxtest.Backend), destroys: map[string]int{}}
					c.Backend = fb
					c.OnClaimFallback = func(template, servedFrom string) {
						if template == "base" && servedFrom == "pool" {
							fallbacks.Add(1)
						}
					}
				})
				e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(1); s.MaxSandboxes = tenant.Of(1) })
				p := e.startPools(t)
				waitFor(t, "a member", func() bool { return ready(p, "a") == 1 })
				member := e.be.IDs()[0]
				memberToken := e.be.Get(member).Spec.AccessToken
				ctx, cancel := context.WithCancel(as("a"))
				t.Cleanup(cancel)
				tc.kill(e, fb, member, cancel)
				held := make(chan struct{})
				fb.mu.Lock()
				fb.poolHeld = held
				fb.mu.Unlock()

				sb, err := e.m.Create(ctx, CreateRequest{AllowInternet: true, Secure: true, EnvVars: map[string]string{"FOO": "bar"}})
				close(held)
				synctest.Wait() // the failed member's destroy runs in the background
				if gotErr := err != nil; gotErr != tc.wantErr {
					t.Fatalf("create: %+v, %v; want an error: %v", sb, err, tc.wantErr)
				}
				if got := fallbacks.Load(); got != int64(tc.wantFallbacks) {
					t.Errorf("fallbacks counted = %d, want %d", got, tc.wantFallbacks)
				}
				if got := fb.destroyed(member); got != 1 || e.be.Get(member) != nil {
					t.Errorf("member %s destroyed %d times (still there: %v), want once", member, got, e.be.Get(member) != nil)
				}
				if _, err := e.st.GetSandboxAny(context.Background(), member); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("row of the failed member: %v", err)
				}
				live, err := e.st.ListLive(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if tc.wantErr {
					if len(live) != 0 {
						t.Errorf("live rows after the failed create: %v", live)
					}
				} else {
					if sb.ID == member || sb.EnvdAccessToken == "" || sb.EnvdAccessToken == memberToken {
						t.Errorf("sandbox %s token %q: want an id and token other than the member's", sb.ID, sb.EnvdAccessToken)
					}
					if v, _ := e.served.Load("base"); v != "cold" {
						t.Errorf("served_from = %v, want cold", v)
					}
					if len(live) != 1 || live[0].ID != sb.ID || live[0].State != store.StateRunning {
						t.Errorf("live rows %v, want only %s running", live, sb.ID)
					}
					inits := e.be.Inits(sb.ID)
					if len(inits) != 1 || inits[0]["accessToken"] != sb.EnvdAccessToken {
						t.Errorf("/init of the cold sandbox: %v, want its own token", inits)
					}
					if got := e.be.Get(sb.ID).Spec.AccessToken; got != sb.EnvdAccessToken {
						t.Errorf("backend token %q != envd token %q", got, sb.EnvdAccessToken)
					}
				}
				ts := e.m.adm.tenant("a")
				ts.mu.Lock()
				pending, pendingMB := ts.pending, ts.pendingMB
				ts.mu.Unlock()
				if pending != 0 || pendingMB != 0 || e.m.adm.pendingMB.Load() != 0 {
					t.Errorf("pending after the create: %d (%d MiB), host %d MiB; want none", pending, pendingMB, e.m.adm.pendingMB.Load())
				}
				if n := e.m.locks.len(); n != 0 {
					t.Errorf("%d sandbox locks held after the create", n)
				}
			})
		})
	}
}

func TestReconcileDestroysLeftoverMembers(t *testing.T) {
	e := newTestEnv(t, nil)
	e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(2) })
	// A previous process's pool: backend sandboxes without rows.
	for _, id := range []string{"old1", "old2"} {
		if _, err := e.be.Create(context.Background(), sandboxSpec(id)); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := e.m.Create(as("a"), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ids := e.be.IDs(); len(ids) != 1 || ids[0] != sb.ID {
		t.Fatalf("after reconcile backend holds %v, want only %s", ids, sb.ID)
	}
}

func sandboxSpec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Template: "base", CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024}
}

// A cold create whose /init envd refuses leaves no sandbox and no row:
// refused as the backend's readiness probe, the backend's create fails and
// undoes itself; refused after a backend without that probe created the
// sandbox, the manager destroys it.
func TestColdCreateFailedInitRevertsEverything(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		noProbe                   bool
		wantCreates, wantDestroys int64
	}{
		{"init as the probe", false, 0, 0},
		{"init after the create", true, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newTestEnv(t, nil)
				e.be.FailInit.Store(true)
				e.be.NoInitProbe.Store(tc.noProbe)
				if _, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true}); err == nil {
					t.Fatal("create with a failing /init succeeded")
				}
				if got := len(e.be.IDs()); got != 0 {
					t.Fatalf("%d sandboxes left on the backend; want 0", got)
				}
				if c, d := e.be.Creates.Load(), e.be.Destroys.Load(); c != tc.wantCreates || d != tc.wantDestroys {
					t.Fatalf("backend creates=%d destroys=%d; want %d and %d", c, d, tc.wantCreates, tc.wantDestroys)
				}
				live, err := e.st.ListLive(context.Background())
				if err != nil || len(live) != 0 {
					t.Fatalf("live rows after the failed create: %v, %v", live, err)
				}
			})
		})
	}
}

// A create with volumes is never a warm member (members have no mounts):
// it is cold even with members of its shape ready, and the backend gets
// the mounts in the spec.
func TestCreateWithVolumesIsCold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newTestEnv(t, nil)
		e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(1) })
		p := e.startPools(t)
		waitFor(t, "a warm member", func() bool { return ready(p, "a") == 1 })
		mounts := []runtime.Mount{{Volume: "v1", Path: "/mnt/data"}}
		sb, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true, Volumes: []store.SandboxVolume{{VolumeID: "v1", Name: "data", Path: "/mnt/data"}}})
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := e.served.Load("base"); v != "cold" {
			t.Fatalf("served_from = %v, want cold", v)
		}
		if got := e.be.Get(sb.ID).Spec.Mounts; !slices.Equal(got, mounts) {
			t.Errorf("backend spec mounts = %v; want %v", got, mounts)
		}
		if ready(p, "a") != 1 {
			t.Errorf("the warm member was taken")
		}
		if v, err := e.m.GetView(as("a"), sb.ID); err != nil || len(v.VolumeMounts) != 1 || v.VolumeMounts[0].Name != "data" {
			t.Errorf("GetView = %+v, %v; want the volume mount", v.VolumeMounts, err)
		}
	})
}

// localChannel is flakyBackend with a channel to envd that
// runtime.LocalEnvdChannel says fails at once.
type localChannel struct{ *flakyBackend }

func (localChannel) LocalEnvdChannel() bool { return true }

// On a backend whose envd channel is local, a claim's /init goes over the
// connection the member's health check left: no dial on the claim's way,
// and none kept after it. A kill drops the sandbox's connection.
func TestClaimReusesHealthCheckConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var lc localChannel
		e := newTestEnv(t, func(c *Config) {
			lc = localChannel{&flakyBackend{Backend: c.Backend.(*sandboxtest.Backend), destroys: map[string]int{}}}
			c.Backend = lc
		})
		e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(1) })
		p := e.startPools(t)
		waitFor(t, "a member", func() bool { return ready(p, "a") == 1 })
		member := e.be.IDs()[0]
		before := lc.dialled(member)
		if before == 0 {
			t.Fatalf("member %s: no dial for its health check", member)
		}
		sb, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true, Secure: true, EnvVars: map[string]string{"FOO": "bar"}})
		if err != nil {
			t.Fatal(err)
		}
		if sb.ID != member {
			t.Fatalf("created %s, want the member %s", sb.ID, member)
		}
		if got := lc.dialled(member); got != before {
			t.Errorf("dials of the claimed member: %d after the claim, %d before; want none on the claim's way", got, before)
		}
		inits := e.be.Inits(member)
		if len(inits) != 1 || inits[0]["accessToken"] != sb.EnvdAccessToken {
			t.Fatalf("/init of the claimed member: %v, want one with its token", inits)
		}
		// The claim kept no connection for the running sandbox: a health
		// check dials, and keeps its own.
		for i := range 2 {
			if err := e.m.EnvdHealth(context.Background(), sb.ID); err != nil {
				t.Fatal(err)
			}
			if got := lc.dialled(member); got != before+1 {
				t.Errorf("dials after health check %d of the running sandbox: %d, want %d", i+1, got, before+1)
			}
		}
		if err := e.m.Kill(as("a"), sb.ID); err != nil {
			t.Fatal(err)
		}
		// Its connection went with it: a health check dials, and the
		// backend refuses.
		killed := lc.dialled(member)
		if err := e.m.EnvdHealth(context.Background(), sb.ID); err == nil {
			t.Errorf("health check of the killed sandbox succeeded")
		}
		if got := lc.dialled(member); got != killed+1 {
			t.Errorf("dials by a health check after the kill: %d, want 1 (a new one)", got-killed)
		}
	})
}
