package sandbox

import (
	"context"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox/sandboxtest"
)

// orderBackend records, at each Destroy, whether the sandbox's stop hooks
// had already run.
type orderBackend struct {
	*sandboxtest.Backend
	mu            sync.Mutex
	hooked        map[string]bool
	hookedAtStart map[string]bool // at Destroy's start
}

func (b *orderBackend) Destroy(ctx context.Context, id string) error {
	b.mu.Lock()
	b.hookedAtStart[id] = b.hooked[id]
	b.mu.Unlock()
	return b.Backend.Destroy(ctx, id)
}

var _ runtime.Backend = (*orderBackend)(nil)

// A kill drops the connections into the sandbox (the proxy's pool, through
// OnStop) before its destroy, which takes a while under load: a pooled
// connection must not reach the dying envd once the sandbox is no longer
// listed.
func TestKillDropsConnectionsBeforeTheDestroy(t *testing.T) {
	var ob *orderBackend
	e := newTestEnv(t, func(c *Config) {
		ob = &orderBackend{Backend: c.Backend.(*sandboxtest.Backend), hooked: map[string]bool{}, hookedAtStart: map[string]bool{}}
		c.Backend = ob
	})
	e.m.OnStop(func(id string) {
		ob.mu.Lock()
		ob.hooked[id] = true
		ob.mu.Unlock()
	})
	sb, err := e.m.Create(as("a"), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Kill(as("a"), sb.ID); err != nil {
		t.Fatal(err)
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	at, destroyed := ob.hookedAtStart[sb.ID]
	if !destroyed {
		t.Fatal("the kill did not destroy the sandbox")
	}
	if !at {
		t.Error("the stop hooks ran only after the destroy; want them before it, once the sandbox is killing")
	}
}
