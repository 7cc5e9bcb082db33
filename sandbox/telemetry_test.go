package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
)

// The metrics history and the logs over the Manager's lifecycle, on the
// fake backend.
func TestMetricsAndLogsLifecycle(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.MetricsHistory = 3 })
	t.Cleanup(e.m.Close)
	ctx := context.Background()
	sb, err := e.m.Create(as("a"), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID

	// No sample yet: one measured on the spot, and kept.
	got, err := e.m.Metrics(as("a"), id, time.Time{}, time.Time{})
	if err != nil || len(got) != 1 {
		t.Fatalf("Metrics of a new sandbox = %d samples, %v; want 1", len(got), err)
	}
	// The passes a second apart (the history keeps no two samples closer
	// than minSampleGap).
	var passes atomic.Int64
	start := time.Now()
	e.m.now = func() time.Time { return start.Add(time.Duration(passes.Load()) * time.Second) }
	for range 4 {
		passes.Add(1)
		e.m.SampleAll(ctx)
	}
	all, _ := e.m.Metrics(as("a"), id, time.Time{}, time.Time{})
	if len(all) != 3 {
		t.Errorf("after 4 passes with a history of 3: %d samples; want 3", len(all))
	}
	if got, _ := e.m.Metrics(as("a"), id, time.Time{}, all[0].At.Add(-time.Hour)); len(got) != 0 {
		t.Errorf("a window an hour before: %d samples; want none", len(got))
	}
	if _, err := e.m.Metrics(as("a"), id, all[0].At, all[0].At.Add(-time.Second)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("start after end: %v; want ErrInvalidArgument", err)
	}
	if _, err := e.m.Metrics(as("b"), id, time.Time{}, time.Time{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's metrics: %v; want ErrNotFound", err)
	}
	if _, _, err := e.m.LatestMetrics(as("b"), id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's latest metrics: %v; want ErrNotFound", err)
	}
	latest, ok, err := e.m.LatestMetrics(as("a"), id)
	if err != nil || !ok || !latest.At.Equal(all[len(all)-1].At) {
		t.Errorf("LatestMetrics = %v, %v, %v; want the newest sample at %v", latest.At, ok, err, all[len(all)-1].At)
	}

	// Paused: not sampled, and no sample on the spot either.
	if err := e.m.Pause(as("a"), id, true); err != nil {
		t.Fatal(err)
	}
	last := all[len(all)-1].At
	e.m.SampleAll(ctx)
	if got, _ := e.m.Metrics(as("a"), id, last.Add(time.Nanosecond), time.Time{}); len(got) != 0 {
		t.Errorf("samples after the pause: %d; want none", len(got))
	}
	if _, err := e.m.Resume(as("a"), id, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.m.SetTimeout(as("a"), id, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Kill(as("a"), id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Metrics(as("a"), id, time.Time{}, time.Time{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("metrics after the kill: %v; want ErrNotFound", err)
	}
	if _, ok := e.m.history.latest(id); ok {
		t.Error("the history of a killed sandbox is kept")
	}

	// The log: every lifecycle event in order, still there after the kill
	// for its tenant, for no other.
	entries, err := e.m.Logs(as("a"), id, LogQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, en := range entries {
		actions = append(actions, en.Fields["action"])
	}
	want := []string{"create", "pause", "resume", "set_timeout", "kill"}
	if len(actions) != len(want) {
		t.Fatalf("log actions = %v; want %v", actions, want)
	}
	for i := range want {
		if actions[i] != want[i] {
			t.Errorf("log actions = %v; want %v", actions, want)
			break
		}
	}
	if _, err := e.m.Logs(as("b"), id, LogQuery{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's logs: %v; want ErrNotFound", err)
	}
	// Purged with the killed rows.
	e.m.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	e.m.Sweep(ctx)
	if _, err := e.m.Logs(as("a"), id, LogQuery{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("logs after the retention: %v; want ErrNotFound", err)
	}
	if _, ok := e.m.logs.query(id, LogQuery{}); ok {
		t.Error("the log outlived the retention")
	}
}

func TestFailedCreateLeavesNoLog(t *testing.T) {
	e := newTestEnv(t, nil)
	boom := errors.New("boom")
	e.be.FailCreate.Store(&boom)
	if _, err := e.m.Create(as("a"), CreateRequest{}); err == nil {
		t.Fatal("create succeeded with a failing backend")
	}
	e.m.logs.mu.Lock()
	n := len(e.m.logs.logs)
	e.m.logs.mu.Unlock()
	if n != 0 {
		t.Errorf("%d logs after a failed create; want none", n)
	}
}
