package template

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store/storetest"
)

// removeRecorder is a layer store that records removals; collecting
// layers needs nothing else of it.
type removeRecorder struct {
	runtime.Layered
	mu      sync.Mutex
	removed []string
}

func (r *removeRecorder) RemoveLayer(_ context.Context, key string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removed = append(r.removed, key)
	return nil
}

func (r *removeRecorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.removed)
}

// A collection asked for while a build holds the layers (a template's
// delete) runs when the last build lets go, not a CollectEvery later; one
// asked for while nothing holds them runs at once.
func TestCollectLayersAfterBuilds(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.Open(t)
	rec := &removeRecorder{}
	s := &Service{cfg: Config{Store: st, Layered: rec}, log: slog.New(slog.DiscardHandler), stopCtx: ctx}
	if err := st.QueueLayerRemovals(ctx, []string{"l1"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	release1, release2 := s.holdLayers(), s.holdLayers() // two builds run
	s.collectLayers(ctx)
	release1()
	if got := rec.got(); len(got) != 0 {
		t.Fatalf("removed %v while a build holds the layers", got)
	}
	release2()
	if got := rec.got(); !slices.Equal(got, []string{"l1"}) {
		t.Fatalf("after the last build: removed %v, want [l1]", got)
	}
	if err := st.QueueLayerRemovals(ctx, []string{"l2"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	s.collectLayers(ctx)
	if got := rec.got(); !slices.Equal(got, []string{"l1", "l2"}) {
		t.Fatalf("removed %v, want [l1 l2]", got)
	}
}

// blockingRemover is a layer store whose removals wait until let is
// closed, after saying on started that one began.
type blockingRemover struct {
	runtime.Layered
	started, let chan struct{}
}

func (r *blockingRemover) RemoveLayer(ctx context.Context, _ string) error {
	r.started <- struct{}{}
	select {
	case <-r.let:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A build that lets go of the layers after a collection was asked for
// frees its build slot first: the collection it then runs does not hold
// the next build back.
func TestCollectionAfterBuildFreesSlot(t *testing.T) {
	ctx := t.Context()
	st, _ := storetest.Open(t)
	rm := &blockingRemover{started: make(chan struct{}, 1), let: make(chan struct{})}
	s := &Service{cfg: Config{Store: st, Layered: rm}, log: slog.New(slog.DiscardHandler), stopCtx: ctx, slots: make(chan struct{}, 1)}
	if err := st.QueueLayerRemovals(ctx, []string{"l1"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	s.slots <- struct{}{} // the build's slot
	release := s.holdLayersInSlot()
	s.collectLayers(ctx) // asked for during the build: runs at release
	done := make(chan struct{})
	go func() { defer close(done); release() }()
	<-rm.started // the collection runs, its removal waits
	select {
	case s.slots <- struct{}{}: // the next build's slot
	case <-time.After(10 * time.Second):
		t.Fatal("the build slot is still held while the collection runs")
	}
	close(rm.let)
	<-done
}
