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
