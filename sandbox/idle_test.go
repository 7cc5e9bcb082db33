package sandbox

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
)

func (e *testEnv) state(t *testing.T, id string) store.Sandbox {
	t.Helper()
	sb, err := e.st.GetSandboxAny(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestSweepIdle: a sandbox with an idle TTL is killed (idle_kill) once it
// has seen no activity for that long; touches (in the store or only in
// memory, within TouchInterval) postpone it; sandboxes without an idle TTL
// (E2B's) and paused ones are left alone.
func TestSweepIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newTestEnv(t, nil)
		ctx := as("a")
		start := time.Now()
		idle, err := e.m.Create(ctx, CreateRequest{IdleTTL: time.Minute, Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if !idle.LastActiveAt.Equal(start.UTC()) || idle.IdleTTL != time.Minute {
			t.Fatalf("created: last active %v, idle TTL %v; want %v, 1m", idle.LastActiveAt, idle.IdleTTL, start)
		}
		e2b, err := e.m.Create(ctx, CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		paused, err := e.m.Create(ctx, CreateRequest{IdleTTL: time.Minute, Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.m.Pause(ctx, paused.ID, true); err != nil {
			t.Fatal(err)
		}
		busy, err := e.m.Create(ctx, CreateRequest{IdleTTL: time.Minute, Timeout: 2 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		done := e.m.Active(context.Background(), busy.ID) // a long exec, say
		gen := e.state(t, idle.ID).Generation

		time.Sleep(30 * time.Second)
		// Activity through the data plane: the dial touches, and it is written.
		conn, err := e.m.DialSandbox(context.Background(), idle.ID, runtime.EnvdPort)
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if got := e.state(t, idle.ID); !got.LastActiveAt.Equal(start.Add(30*time.Second).UTC()) || got.Generation != gen {
			t.Fatalf("after dial at +30s: last active %v, generation %d; want %v, %d",
				got.LastActiveAt.Sub(start), got.Generation, 30*time.Second, gen)
		}
		time.Sleep(3 * time.Second)
		e.m.Touch(context.Background(), idle.ID) // +33s: within TouchInterval, kept in memory only
		if got := e.state(t, idle.ID); !got.LastActiveAt.Equal(start.Add(30 * time.Second).UTC()) {
			t.Fatalf("touch within %v wrote last active %v", TouchInterval, got.LastActiveAt.Sub(start))
		}
		e.m.Touch(context.Background(), e2b.ID) // no idle TTL: nothing written
		if got := e.state(t, e2b.ID); !got.LastActiveAt.IsZero() {
			t.Fatalf("E2B sandbox touched: last active %v", got.LastActiveAt)
		}

		time.Sleep(58 * time.Second) // +91s: the store says idle since +90s, memory says +93s
		e.m.Sweep(context.Background())
		if st := e.state(t, idle.ID).State; st != store.StateRunning {
			t.Fatalf("at +91s (last activity +33s, TTL 1m): %s, want running", st)
		}
		time.Sleep(3 * time.Second) // +94s
		e.m.Sweep(context.Background())
		if st := e.state(t, idle.ID).State; st != store.StateKilled {
			t.Fatalf("at +94s: %s, want killed", st)
		}
		if e.be.Get(idle.ID) != nil {
			t.Fatalf("idle-killed sandbox still in the backend")
		}
		if st := e.state(t, e2b.ID).State; st != store.StateRunning {
			t.Fatalf("E2B sandbox (no idle TTL): %s, want running", st)
		}
		if st := e.state(t, paused.ID).State; st != store.StatePaused {
			t.Fatalf("paused sandbox: %s, want paused", st)
		}
		if st := e.state(t, busy.ID).State; st != store.StateRunning {
			t.Fatalf("sandbox with a request in flight: %s, want running", st)
		}
		done() // +94s: its idle time starts now
		time.Sleep(59 * time.Second)
		e.m.Sweep(context.Background())
		if st := e.state(t, busy.ID).State; st != store.StateRunning {
			t.Fatalf("59s after its request ended: %s, want running", st)
		}
		time.Sleep(2 * time.Second) // +155s
		e.m.Sweep(context.Background())
		if st := e.state(t, busy.ID).State; st != store.StateKilled {
			t.Fatalf("61s after its request ended: %s, want killed", st)
		}

		// A resume starts the idle time over.
		time.Sleep(time.Hour - 156*time.Second) // just before the end time
		if _, _, err := e.m.Connect(ctx, paused.ID, time.Hour); err != nil {
			t.Fatal(err)
		}
		e.m.Sweep(context.Background())
		if st := e.state(t, paused.ID).State; st != store.StateRunning {
			t.Fatalf("resumed sandbox: %s, want running", st)
		}
		time.Sleep(time.Minute)
		e.m.Sweep(context.Background())
		if st := e.state(t, paused.ID).State; st != store.StateKilled {
			t.Fatalf("resumed sandbox idle for 1m: %s, want killed", st)
		}
	})
}

func TestSandboxTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newTestEnv(t, nil)
		sb, err := e.m.Create(as("b"), CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if tn, err := e.m.SandboxTenant(context.Background(), sb.ID); err != nil || tn != "b" {
			t.Fatalf("SandboxTenant() = %q, %v; want b", tn, err)
		}
		if err := e.m.Kill(as("b"), sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := e.m.SandboxTenant(context.Background(), sb.ID); err == nil {
			t.Fatal("SandboxTenant(killed) = nil error")
		}
		if _, err := e.m.SandboxTenant(context.Background(), "nope"); err == nil {
			t.Fatal("SandboxTenant(missing) = nil error")
		}
	})
}
