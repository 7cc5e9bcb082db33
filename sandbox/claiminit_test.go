package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox/sandboxtest"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// deferEnv is a test env whose claims defer envd's /init, over a backend
// whose Dial hook the test may set, with one warm member of tenant a.
func deferEnv(t *testing.T, mod func(*Config)) (*testEnv, *flakyBackend, string) {
	t.Helper()
	var fb *flakyBackend
	e := newTestEnv(t, func(c *Config) {
		fb = &flakyBackend{Backend: c.Backend.(*sandboxtest.Backend), destroys: map[string]int{}}
		c.Backend = fb
		c.DeferClaimInit = true
		if mod != nil {
			mod(c)
		}
	})
	e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(1) })
	p := e.startPools(t)
	waitFor(t, "a member", func() bool { return ready(p, "a") == 1 })
	return e, fb, e.be.IDs()[0]
}

func deferredCreate(t *testing.T, e *testEnv) *store.Sandbox {
	t.Helper()
	sb, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true, Secure: true, EnvVars: map[string]string{"K": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := e.served.Load("base"); v != "pool" {
		t.Fatalf("served_from = %v, want pool", v)
	}
	return sb
}

func dialOK(t *testing.T, m *Manager, id string) {
	t.Helper()
	conn, err := m.DialSandbox(context.Background(), id, runtime.EnvdPort)
	if err != nil {
		t.Fatalf("DialSandbox(%s) = %v", id, err)
	}
	conn.Close()
}

// A claim answers while the member's envd is still to get /init (its
// /init is held in the backend's Dial); a request to the sandbox waits for
// that /init, and reaches envd only after it; later requests send none.
func TestClaimAnswersBeforeEnvdInit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, fb, member := deferEnv(t, nil)
		// The member's next dial is the background /init's: held until
		// the gate opens. Any other dial goes through at once.
		gate := make(chan struct{})
		var held atomic.Bool
		fb.mu.Lock()
		fb.dial = func(ctx context.Context, id string) error {
			if id != member || held.Swap(true) {
				return nil
			}
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		fb.mu.Unlock()

		sb := deferredCreate(t, e)
		if sb.ID != member {
			t.Fatalf("created %s, want the member %s", sb.ID, member)
		}
		synctest.Wait()
		if n := len(e.be.Inits(sb.ID)); n != 0 || !e.m.uninit.pending(sb.ID) {
			t.Fatalf("after the create's answer: %d /init, pending %v; want its /init held", n, e.m.uninit.pending(sb.ID))
		}
		dialled := make(chan error, 1)
		go func() {
			conn, err := e.m.DialSandbox(context.Background(), sb.ID, runtime.EnvdPort)
			if err == nil {
				conn.Close()
			}
			dialled <- err
		}()
		synctest.Wait()
		select {
		case err := <-dialled:
			t.Fatalf("DialSandbox returned (%v) before envd had its /init", err)
		default:
		}
		close(gate)
		if err := <-dialled; err != nil {
			t.Fatalf("DialSandbox = %v", err)
		}
		lastInitOK(t, e.be, sb, 1)
		dialOK(t, e.m, sb.ID)
		lastInitOK(t, e.be, sb, 1)
		if err := e.m.Kill(as("a"), sb.ID); err != nil {
			t.Fatal(err)
		}
		if n := e.m.uninit.len(); n != 0 {
			t.Errorf("%d sandboxes still awaiting /init", n)
		}
	})
}

// A deferred /init that envd refuses leaves the sandbox awaiting it: no
// connection is handed out, and the next request tries the /init again.
func TestDeferredInitRefusedHoldsRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _, _ := deferEnv(t, nil)
		e.be.FailInit.Store(true)
		sb := deferredCreate(t, e)
		synctest.Wait() // the background /init, refused
		if !e.m.uninit.pending(sb.ID) {
			t.Fatal("a sandbox whose /init was refused does not await one")
		}
		if conn, err := e.m.DialSandbox(context.Background(), sb.ID, runtime.EnvdPort); err == nil {
			conn.Close()
			t.Fatal("DialSandbox handed out a connection to an envd without its /init")
		}
		e.be.FailInit.Store(false)
		dialOK(t, e.m, sb.ID)
		lastInitOK(t, e.be, sb, 1)
		if e.m.uninit.pending(sb.ID) {
			t.Error("still awaiting /init after it succeeded")
		}
	})
}

// A member the backend says is not running is not handed out: it is
// destroyed and the create goes on cold, counted as a claim fallback.
func TestDeferredClaimOfExitedMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fallbacks atomic.Int64
		e, fb, member := deferEnv(t, func(c *Config) {
			c.OnClaimFallback = func(string, string) { fallbacks.Add(1) }
		})
		fb.mu.Lock()
		fb.poolHeld = make(chan struct{}) // no refill to claim instead
		fb.mu.Unlock()
		e.be.Exit(member)
		sb, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true, Secure: true, EnvVars: map[string]string{"K": "v"}})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if v, _ := e.served.Load("base"); v != "cold" || sb.ID == member {
			t.Errorf("sandbox %s served from %v; want a cold one, not the exited member %s", sb.ID, v, member)
		}
		if fb.destroyed(member) != 1 || fallbacks.Load() != 1 {
			t.Errorf("exited member destroyed %d times, fallbacks %d; want 1 and 1", fb.destroyed(member), fallbacks.Load())
		}
		lastInitOK(t, e.be, sb, 1) // the cold create's, as its probe
		if e.m.uninit.pending(sb.ID) {
			t.Error("a cold sandbox awaits a deferred /init")
		}
	})
}

// After a restart every live sandbox's first request sends /init again:
// the crash may have come between a claim and its deferred /init, and
// envd takes the same token, env vars and user a second time.
func TestReconcileDefersReinit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _, _ := deferEnv(t, nil)
		sb := deferredCreate(t, e)
		synctest.Wait()
		lastInitOK(t, e.be, sb, 1)

		m2 := New(Config{Store: e.st, Backend: e.be, BackendName: "fake", Log: slog.New(slog.DiscardHandler), DeferClaimInit: true})
		t.Cleanup(m2.Close)
		if err := m2.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !m2.uninit.pending(sb.ID) {
			t.Fatal("after Reconcile the sandbox does not await /init")
		}
		lastInitOK(t, e.be, sb, 1)
		dialOK(t, m2, sb.ID)
		lastInitOK(t, e.be, sb, 2)
		dialOK(t, m2, sb.ID)
		lastInitOK(t, e.be, sb, 2)
	})
}

// ensure runs one init at a time for all its callers, who share its
// result; a failure leaves the id pending for the next caller, a success
// or a forget ends it.
func TestUninitialisedEnsure(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		wantPending bool
	}{
		{"init succeeds", nil, false},
		{"init fails", errors.New("refused"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var u uninitialised
				if err := u.ensure(context.Background(), "x", func() error { panic("init of an id not pending") }); err != nil {
					t.Fatal(err)
				}
				u.add("x")
				var calls atomic.Int64
				release := make(chan struct{})
				init := func() error { calls.Add(1); <-release; return tc.err }
				errs := make(chan error, 5)
				for range 5 {
					go func() { errs <- u.ensure(context.Background(), "x", init) }()
				}
				synctest.Wait()
				close(release)
				for range 5 {
					if err := <-errs; !errors.Is(err, tc.err) {
						t.Errorf("ensure = %v, want %v", err, tc.err)
					}
				}
				if calls.Load() != 1 || u.pending("x") != tc.wantPending {
					t.Fatalf("%d inits, pending %v; want 1, %v", calls.Load(), u.pending("x"), tc.wantPending)
				}
				if tc.wantPending {
					_ = u.ensure(context.Background(), "x", init)
					u.forget("x")
				}
				if calls.Load() != 1+int64(btoi(tc.wantPending)) || u.pending("x") {
					t.Errorf("after a retry and forget: %d inits, pending %v", calls.Load(), u.pending("x"))
				}
			})
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
