package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox/sandboxtest"
	"github.com/sandboxd/sandboxd/store"
)

// hangingResume is the fake backend whose Resume does its work (a sandbox
// paused to disk restarts, with a fresh envd) and then never returns to
// its caller: the Manager is stuck exactly where a sandboxd SIGKILLed right
// after the backend's Resume would have died.
type hangingResume struct {
	*sandboxtest.Backend
	once    sync.Once
	resumed chan struct{}
}

func (h *hangingResume) Resume(ctx context.Context, id string) (bool, error) {
	restarted, err := h.Backend.Resume(ctx, id)
	h.once.Do(func() { close(h.resumed) })
	<-ctx.Done()
	return restarted, errors.Join(err, ctx.Err())
}

// lastInitOK checks that the last /init of id carried sb's token, env vars
// and the default user.
func lastInitOK(t *testing.T, be *sandboxtest.Backend, sb *store.Sandbox, want int) {
	t.Helper()
	inits := be.Inits(sb.ID)
	if len(inits) != want {
		t.Fatalf("/init calls = %d; want %d", len(inits), want)
	}
	last := inits[len(inits)-1]
	env, _ := last["envVars"].(map[string]any)
	if env["K"] != "v" || last["accessToken"] != sb.EnvdAccessToken || last["defaultUser"] != "user" {
		t.Errorf("last /init = %v; want the create's env vars, token and default user", last)
	}
}

// TestReconcileReinitsInterruptedResume: sandboxd dies after the backend
// restarted a sandbox paused to disk and before its envd got /init. The
// row says resuming, so the restarted sandboxd's Reconcile gives envd its
// /init (same token, env vars, user), or destroys the sandbox if envd
// refuses; it never marks it running with an open envd.
func TestReconcileReinitsInterruptedResume(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failInit  bool
		wantState store.State
	}{
		{"init ok", false, store.StateRunning},
		{"init fails", true, store.StateKilled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hb *hangingResume
			e := newTestEnv(t, func(c *Config) {
				hb = &hangingResume{Backend: c.Backend.(*sandboxtest.Backend), resumed: make(chan struct{})}
				c.Backend = hb
			})
			sb, err := e.m.Create(as("a"), CreateRequest{Secure: true, EnvVars: map[string]string{"K": "v"}})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.m.Pause(as("a"), sb.ID, false); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(as("a"))
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _, _ = e.m.Connect(ctx, sb.ID, 0) // the "dead" sandboxd
			}()
			t.Cleanup(func() { cancel(); <-done })
			<-hb.resumed
			if st := e.state(t, sb.ID).State; st != store.StateResuming {
				t.Fatalf("row while the backend resumes: %s; want resuming", st)
			}

			// sandboxd starts again on the same store and backend.
			e.be.FailInit.Store(tc.failInit)
			m2 := New(Config{Store: e.st, Backend: e.be, BackendName: "fake", Log: slog.New(slog.DiscardHandler)})
			if err := m2.Reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
			if st := e.state(t, sb.ID).State; st != tc.wantState {
				t.Fatalf("after Reconcile: %s; want %s", st, tc.wantState)
			}
			if tc.failInit {
				if e.be.Get(sb.ID) != nil {
					t.Error("the sandbox whose envd refused /init still exists")
				}
				return
			}
			lastInitOK(t, e.be, sb, 2)
			conn, err := m2.DialSandbox(context.Background(), sb.ID, runtime.EnvdPort)
			if err != nil {
				t.Fatalf("DialSandbox after Reconcile = %v", err)
			}
			conn.Close()
		})
	}
}

// TestRestartedInitFails: whenever a sandbox was started afresh and its
// envd refuses /init, the sandbox is destroyed and its row killed, never
// left running with an envd that takes anyone's token: (b) a pause to disk
// that restarted it; (c) a resume whose /init failed and whose pause back
// to disk restarted it once more.
func TestRestartedInitFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(e *testEnv, id string) error
	}{
		{"pause restarted", func(e *testEnv, id string) error {
			e.be.RestartOnDiskPause.Store(true)
			e.be.FailInit.Store(true)
			return e.m.Pause(as("a"), id, false)
		}},
		{"resume, then the pause back restarted", func(e *testEnv, id string) error {
			if err := e.m.Pause(as("a"), id, false); err != nil {
				return err
			}
			e.be.RestartOnDiskPause.Store(true)
			e.be.FailInit.Store(true)
			_, _, err := e.m.Connect(as("a"), id, 0)
			if !errors.Is(err, errdefs.ErrUnavailable) {
				return errors.Join(errors.New("want ErrUnavailable"), err)
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, nil)
			sb, err := e.m.Create(as("a"), CreateRequest{Secure: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.run(e, sb.ID); err == nil {
				t.Fatal("the operation succeeded; want its error")
			} else {
				t.Log(err)
			}
			if st := e.state(t, sb.ID).State; st != store.StateKilled {
				t.Errorf("row: %s; want killed", st)
			}
			if e.be.Get(sb.ID) != nil {
				t.Error("the sandbox with an uninitialised envd still exists")
			}
			if _, err := e.m.DialSandbox(context.Background(), sb.ID, runtime.EnvdPort); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("DialSandbox = %v; want ErrNotFound", err)
			}
		})
	}
}

// TestUnsettledRows: a row left pausing or resuming (a store write that
// failed half way) is not routed to by the proxy, and a Connect settles
// it: the backend finds the sandbox running (Resume's false, nil), and its
// envd gets /init all the same.
func TestUnsettledRows(t *testing.T) {
	for _, state := range []store.State{store.StatePausing, store.StateResuming} {
		t.Run(string(state), func(t *testing.T) {
			e := newTestEnv(t, nil)
			sb, err := e.m.Create(as("a"), CreateRequest{Secure: true, EnvVars: map[string]string{"K": "v"}})
			if err != nil {
				t.Fatal(err)
			}
			sb.State = state
			if err := e.st.UpdateSandbox(context.Background(), sb); err != nil {
				t.Fatal(err)
			}
			if _, err := e.m.DialSandbox(context.Background(), sb.ID, runtime.EnvdPort); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("DialSandbox of a %s row = %v; want ErrNotFound", state, err)
			}
			if _, _, err := e.m.Connect(as("a"), sb.ID, 0); err != nil {
				t.Fatalf("Connect = %v", err)
			}
			if st := e.state(t, sb.ID).State; st != store.StateRunning {
				t.Errorf("after Connect: %s; want running", st)
			}
			lastInitOK(t, e.be, sb, 2)
			conn, err := e.m.DialSandbox(context.Background(), sb.ID, runtime.EnvdPort)
			if err != nil {
				t.Fatalf("DialSandbox after Connect = %v", err)
			}
			conn.Close()
		})
	}
}

// TestTimeoutPauseFails: a sandbox whose pause at its timeout fails is
// never left running past its end time (where every sweep would fail
// again): a failed pause to disk falls back to a pause in memory, and a
// failed pause in memory to a kill.
func TestTimeoutPauseFails(t *testing.T) {
	for _, tc := range []struct {
		name                                string
		on                                  store.OnTimeout
		restartOnDisk, failMemory, failInit bool
		wantState                           store.State
		wantBackendGone                     bool
	}{
		{"disk restarted: memory", store.OnTimeoutPauseDisk, true, false, false, store.StatePaused, false},
		{"disk restarted, memory fails: kill", store.OnTimeoutPauseDisk, true, true, false, store.StateKilled, true},
		{"disk restarted, init fails: kill", store.OnTimeoutPauseDisk, true, false, true, store.StateKilled, true},
		{"memory fails: kill", store.OnTimeoutPause, false, true, false, store.StateKilled, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newTestEnv(t, nil)
				sb, err := e.m.Create(as("a"), CreateRequest{Secure: true, Timeout: time.Minute, Lifecycle: store.Lifecycle{OnTimeout: tc.on}})
				if err != nil {
					t.Fatal(err)
				}
				e.be.RestartOnDiskPause.Store(tc.restartOnDisk)
				e.be.FailMemoryPause.Store(tc.failMemory)
				e.be.FailInit.Store(tc.failInit)
				time.Sleep(61 * time.Second)
				e.m.Sweep(context.Background())
				if st := e.state(t, sb.ID).State; st != tc.wantState {
					t.Fatalf("after the timeout: %s; want %s", st, tc.wantState)
				}
				if gone := e.be.Get(sb.ID) == nil; gone != tc.wantBackendGone {
					t.Errorf("sandbox gone from the backend = %v; want %v", gone, tc.wantBackendGone)
				}
				if sbx := e.be.Get(sb.ID); sbx != nil && sbx.State != runtime.StatePaused {
					t.Errorf("backend state %s; want paused", sbx.State)
				}
				if left, err := e.st.ListExpired(context.Background(), time.Now()); err != nil || len(left) != 0 {
					t.Errorf("expired sandboxes after the sweep: %v, %v; want none", left, err)
				}
			})
		})
	}
}

// TestHostBudgetDiskPaused: the host memory budget leaves out sandboxes
// paused to disk (they hold no memory) but not those paused in memory; a
// resume from disk must fit the budget again, like a create (503 +
// Retry-After otherwise), and stays paused on disk when it does not.
func TestHostBudgetDiskPaused(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.HostMemoryMB = 1024 }) // two sandboxes of 512 MiB
	create := func() (*store.Sandbox, error) { return e.m.Create(as("a"), CreateRequest{}) }
	a, err := create()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := create(); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		do   func() error
		want error // nil: succeeds
	}{
		{"third create: over budget", func() error { _, err := create(); return err }, errdefs.ErrUnavailable},
		{"pause A in memory", func() error { return e.m.Pause(as("a"), a.ID, true) }, nil},
		{"create with A in memory: over budget", func() error { _, err := create(); return err }, errdefs.ErrUnavailable},
		{"resume A", func() error { _, _, err := e.m.Connect(as("a"), a.ID, 0); return err }, nil},
		{"pause A to disk", func() error { return e.m.Pause(as("a"), a.ID, false) }, nil},
		{"create with A on disk: fits", func() error { _, err := create(); return err }, nil},
		{"resume A: over budget", func() error { _, _, err := e.m.Connect(as("a"), a.ID, 0); return err }, errdefs.ErrUnavailable},
	}
	for _, s := range steps {
		if err := s.do(); (s.want == nil) != (err == nil) || (s.want != nil && !errors.Is(err, s.want)) {
			t.Fatalf("%s: %v; want %v", s.name, err, s.want)
		}
	}
	if st := e.state(t, a.ID).State; st != store.StatePaused || !e.be.PausedToDisk(a.ID) {
		t.Fatalf("A after the refused resume: %s, on disk %v; want paused on disk", st, e.be.PausedToDisk(a.ID))
	}
	// Make room: A resumes and counts again.
	live, _, err := e.m.List(as("a"), store.ListFilter{States: []store.State{store.StateRunning}})
	if err != nil || len(live) == 0 {
		t.Fatalf("List = %v, %v", live, err)
	}
	if err := e.m.Kill(as("a"), live[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, resumed, err := e.m.Connect(as("a"), a.ID, 0); err != nil || !resumed {
		t.Fatalf("resume A with room: %v, %v; want resumed", resumed, err)
	}
	if _, err := create(); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("create with A running again = %v; want ErrUnavailable", err)
	}
}

// flipOnDial is the fake backend whose Dial, once armed, lets flip run
// between the dial and the Manager's next step: a pause to disk that starts
// (and restarts the sandbox) just after the proxy read the row as running.
type flipOnDial struct {
	*sandboxtest.Backend
	flip atomic.Pointer[func()]
}

func (f *flipOnDial) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	c, err := f.Backend.Dial(ctx, id, port)
	if fn := f.flip.Swap(nil); fn != nil {
		(*fn)()
	}
	return c, err
}

// TestDialRechecksRow: a connection dialled while the row turned
// "pausing" (its envd may be a fresh one without /init) is not handed to
// the proxy.
func TestDialRechecksRow(t *testing.T) {
	var fb *flipOnDial
	e := newTestEnv(t, func(c *Config) {
		fb = &flipOnDial{Backend: c.Backend.(*sandboxtest.Backend)}
		c.Backend = fb
	})
	sb, err := e.m.Create(as("a"), CreateRequest{Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	flip := func() {
		row := e.state(t, sb.ID)
		row.State = store.StatePausing
		if err := e.st.UpdateSandbox(context.Background(), &row); err != nil {
			t.Error(err)
		}
	}
	fb.flip.Store(&flip)
	if conn, err := e.m.DialSandbox(context.Background(), sb.ID, runtime.EnvdPort); !errors.Is(err, errdefs.ErrNotFound) {
		if conn != nil {
			conn.Close()
		}
		t.Fatalf("DialSandbox while the row turned pausing = %v; want ErrNotFound", err)
	}
}

// TestHostBudgetDiskPausedAfterRestart: a restarted sandboxd learns from
// the backend which sandboxes are paused to disk and leaves them out of
// the host budget, as the sandboxd that paused them did.
func TestHostBudgetDiskPausedAfterRestart(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.HostMemoryMB = 1024 }) // two sandboxes of 512 MiB
	a, err := e.m.Create(as("a"), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(as("a"), CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Pause(as("a"), a.ID, false); err != nil {
		t.Fatal(err)
	}
	m2 := New(Config{Store: e.st, Backend: e.be, BackendName: "fake", Log: slog.New(slog.DiscardHandler), Settings: e.settings, HostMemoryMB: 1024})
	if err := m2.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Create(as("a"), CreateRequest{}); err != nil {
		t.Fatalf("create after a restart, with A on disk = %v; want it to fit", err)
	}
	if _, _, err := m2.Connect(as("a"), a.ID, 0); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("resume A with the budget full = %v; want ErrUnavailable", err)
	}
}

// TestKillingIsGone: while a kill is in progress (the row says killing),
// the API sees the sandbox as gone, as lists do: Get and Kill answer
// NotFound, so that "gone from the list" and "getInfo: not found" agree.
func TestKillingIsGone(t *testing.T) {
	e := newTestEnv(t, nil)
	sb, err := e.m.Create(as("a"), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	row := e.state(t, sb.ID)
	row.State = store.StateKilling
	if err := e.st.UpdateSandbox(context.Background(), &row); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Get(as("a"), sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(killing) = %v; want ErrNotFound", err)
	}
	if err := e.m.Kill(as("a"), sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Kill(killing) = %v; want ErrNotFound", err)
	}
	live, _, err := e.m.List(as("a"), store.ListFilter{States: []store.State{store.StateRunning, store.StatePaused}})
	if err != nil || len(live) != 0 {
		t.Errorf("List = %v, %v; want nothing", live, err)
	}
}
