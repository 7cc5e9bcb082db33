package sandbox

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
)

// TestResumeTimeout: a resumed sandbox's end is now plus a fresh timeout,
// never what was left before the pause, so its paused time does not count
// (E2B's behaviour). An auto-resume gives it the timeout its create asked
// for (not the server's default); connect and the legacy resume give it the
// timeout they name, even when shorter than what was left.
func TestResumeTimeout(t *testing.T) {
	autoResume := store.Lifecycle{OnTimeout: store.OnTimeoutPause, AutoResume: true}
	for _, tc := range []struct {
		name    string
		created time.Duration // the create's timeout
		ranFor  time.Duration // before the pause (by hand, or the sweeper's at the timeout)
		wake    func(e *testEnv, id string) error
		want    time.Duration // end - now after the wake
	}{
		{"auto-resume after the timeout's pause", 10 * time.Minute, 10*time.Minute + time.Second, dial, 10 * time.Minute},
		{"auto-resume after a pause with time left", 10 * time.Minute, 2 * time.Minute, dial, 10 * time.Minute},
		{"auto-resume of a long sandbox", 2 * time.Hour, 2*time.Hour + time.Second, dial, 2 * time.Hour},
		{"connect names a shorter timeout", time.Hour, time.Minute, func(e *testEnv, id string) error {
			_, _, err := e.m.Connect(as("a"), id, 30*time.Second)
			return err
		}, 30 * time.Second},
		{"legacy resume", time.Hour, time.Minute, func(e *testEnv, id string) error {
			_, err := e.m.Resume(as("a"), id, 45*time.Second)
			return err
		}, 45 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newTestEnv(t, func(c *Config) { c.MaxTimeout = 24 * time.Hour })
				sb, err := e.m.Create(as("a"), CreateRequest{Timeout: tc.created, Lifecycle: autoResume})
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(tc.ranFor)
				if tc.ranFor > tc.created {
					e.m.Sweep(context.Background())
				} else if err := e.m.Pause(as("a"), sb.ID, true); err != nil {
					t.Fatal(err)
				}
				if st := e.state(t, sb.ID).State; st != store.StatePaused {
					t.Fatalf("state before the wake = %s; want paused", st)
				}
				time.Sleep(3 * time.Hour) // paused: not counted
				if err := tc.wake(e, sb.ID); err != nil {
					t.Fatalf("wake: %v", err)
				}
				got := e.state(t, sb.ID)
				if got.State != store.StateRunning {
					t.Fatalf("state after the wake = %s; want running", got.State)
				}
				if left := got.EndAt.Sub(time.Now()); left != tc.want {
					t.Errorf("end - now after the wake = %v; want %v", left, tc.want)
				}
			})
		})
	}
}

func dial(e *testEnv, id string) error {
	conn, err := e.m.DialSandbox(context.Background(), id, runtime.EnvdPort)
	if err == nil {
		conn.Close()
	}
	return err
}

// TestOwnTimeout: the timeout an auto-resume gives: the stored one, capped
// by the server's maximum, or the server's default for a row from before
// the timeout was stored.
func TestOwnTimeout(t *testing.T) {
	m := New(Config{DefaultTimeout: 5 * time.Minute, MaxTimeout: time.Hour})
	for _, tc := range []struct {
		stored, want time.Duration
	}{
		{0, 5 * time.Minute},
		{20 * time.Minute, 20 * time.Minute},
		{2 * time.Hour, time.Hour},
	} {
		if got := m.ownTimeout(&store.Sandbox{Timeout: tc.stored}); got != tc.want {
			t.Errorf("ownTimeout(stored %v) = %v; want %v", tc.stored, got, tc.want)
		}
	}
}

// TestCreateTimeoutFromHandOver: a sandbox's timeout runs from when its
// create answers, so a slow cold create (here 5 s, longer than the 3 s
// timeout) still hands over a sandbox with its whole timeout ahead, and
// endAt − startedAt is the timeout.
func TestCreateTimeoutFromHandOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newTestEnv(t, nil)
		e.be.CreateDelay = 5 * time.Second
		sb, err := e.m.Create(as("a"), CreateRequest{Timeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got := e.state(t, sb.ID)
		if left := got.EndAt.Sub(time.Now()); left != 3*time.Second {
			t.Errorf("end - now after the create = %v; want 3s", left)
		}
		if ttl := got.EndAt.Sub(got.StartedAt); ttl != 3*time.Second {
			t.Errorf("endAt - startedAt = %v; want 3s", ttl)
		}
		time.Sleep(2 * time.Second)
		e.m.Sweep(context.Background())
		if st := e.state(t, sb.ID).State; st != store.StateRunning {
			t.Fatalf("2 s into a 3 s timeout: %s; want running", st)
		}
		time.Sleep(1500 * time.Millisecond)
		e.m.Sweep(context.Background())
		if st := e.state(t, sb.ID).State; st != store.StateKilled {
			t.Errorf("past its timeout: %s; want killed", st)
		}
	})
}
