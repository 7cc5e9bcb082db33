package sandbox

import (
	"sync"
	"testing"
)

// TestLockMapDoesNotGrow: the per-sandbox lock map holds only ids in use,
// however many sandboxes came and went.
func TestLockMapDoesNotGrow(t *testing.T) {
	e := newTestEnv(t, nil)
	ctx := as("a")
	for i := range 10000 {
		sb, err := e.m.Create(ctx, CreateRequest{})
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if err := e.m.Kill(ctx, sb.ID); err != nil {
			t.Fatalf("kill %d: %v", i, err)
		}
		if n := e.m.locks.len(); n != 0 {
			t.Fatalf("after %d create/kill cycles the lock map holds %d ids; want 0", i+1, n)
		}
	}
}

// TestIDLocksSerialise: holders of one id exclude each other, and the
// entry goes once the last waiter is done.
func TestIDLocksSerialise(t *testing.T) {
	var l idLocks
	var wg sync.WaitGroup
	inside := 0
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock := l.lock("x")
			defer unlock()
			if inside++; inside != 1 {
				t.Errorf("%d holders of one id at once", inside)
			}
			inside--
		}()
	}
	other := l.lock("y") // another id is independent
	other()
	wg.Wait()
	if n := l.len(); n != 0 {
		t.Fatalf("lock map holds %d ids after every unlock; want 0", n)
	}
}
