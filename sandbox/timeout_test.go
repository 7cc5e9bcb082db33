package sandbox

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/store"
)

// TestSetTimeoutNow: a timeout of zero or less expires the sandbox at once,
// as in E2B: the woken sweeper runs its on-timeout action without waiting
// for its tick (an hour here, and the fake clock does not move). A positive
// timeout only moves the end time.
func TestSetTimeoutNow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		on      store.OnTimeout
		want    store.State
	}{
		{"zero kills", 0, store.OnTimeoutKill, store.StateKilled},
		{"negative is zero", -5 * time.Second, store.OnTimeoutKill, store.StateKilled},
		{"zero auto-pauses", 0, store.OnTimeoutPause, store.StatePaused},
		{"positive only moves the end", 10 * time.Second, store.OnTimeoutKill, store.StateRunning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newTestEnv(t, nil)
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); e.m.Run(ctx, time.Hour) }()
				t.Cleanup(func() { cancel(); <-done })
				sb, err := e.m.Create(as("a"), CreateRequest{Timeout: time.Minute, Lifecycle: store.Lifecycle{OnTimeout: tc.on}})
				if err != nil {
					t.Fatal(err)
				}
				if err := e.m.SetTimeout(as("a"), sb.ID, tc.timeout); err != nil {
					t.Fatalf("SetTimeout(%v): %v", tc.timeout, err)
				}
				synctest.Wait()
				got := e.state(t, sb.ID)
				if got.State != tc.want {
					t.Errorf("state after SetTimeout(%v) = %s; want %s", tc.timeout, got.State, tc.want)
				}
				if want := time.Now().Add(max(tc.timeout, 0)); !got.EndAt.Equal(want) {
					t.Errorf("end = %v; want %v", got.EndAt, want)
				}
			})
		})
	}
}
