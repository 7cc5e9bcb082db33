package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox/sandboxtest"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

func granted(w *gateWaiter) bool {
	select {
	case <-w.granted:
		return true
	default:
		return false
	}
}

func TestColdGate(t *testing.T) {
	for _, c := range []struct {
		name  string
		slots int
		queue int
		run   func(t *testing.T, g *coldGate, clock *time.Time)
	}{
		{"a tenant alone uses every slot, then queues", 3, 0, func(t *testing.T, g *coldGate, _ *time.Time) {
			a1, a2, a3, a4 := g.enter("a"), g.enter("a"), g.enter("a"), g.enter("a")
			if !granted(a1) || !granted(a2) || !granted(a3) || granted(a4) {
				t.Fatalf("granted %v %v %v %v, want the first three", granted(a1), granted(a2), granted(a3), granted(a4))
			}
			// b arrives: it gets the next slot, before a's older waiter,
			// and from then on a holds at most all but one.
			b1 := g.enter("b")
			if granted(b1) {
				t.Fatal("b granted with no slot free")
			}
			g.leave(a1)
			if !granted(b1) || granted(a4) {
				t.Fatal("the freed slot did not go to b, the tenant holding none")
			}
			// While b's lone create runs, a, flooding, holds one slot.
			g.leave(a2)
			if granted(a4) {
				t.Fatal("a granted a second slot while b's lone create runs")
			}
			a5 := g.enter("a")
			g.leave(b1)
			if !granted(a4) {
				t.Fatal("a's waiter not granted a second slot after b's create")
			}
			if granted(a5) {
				t.Fatal("a got a third slot while b is active")
			}
		}},
		{"while another tenant is active, a holds all but one", 3, 0, func(t *testing.T, g *coldGate, clock *time.Time) {
			b1 := g.enter("b")
			g.leave(b1) // b asked a moment ago: it counts as active
			a1, a2, a3 := g.enter("a"), g.enter("a"), g.enter("a")
			if !granted(a1) || !granted(a2) || granted(a3) {
				t.Fatalf("granted %v %v %v, want two of three", granted(a1), granted(a2), granted(a3))
			}
			b2 := g.enter("b")
			if !granted(b2) {
				t.Fatal("b found no free slot while a flooded")
			}
			g.leave(a1)
			if granted(a3) {
				t.Fatal("a's waiter granted a second slot while b's lone create runs")
			}
			g.leave(b2)
			if !granted(a3) {
				t.Fatal("a's oldest waiter was not granted the freed slot")
			}
			// b goes quiet past the window: a may take them all again.
			*clock = clock.Add(defaultShareWindow)
			if a4 := g.enter("a"); !granted(a4) {
				t.Fatal("a not granted every slot with b gone quiet")
			}
		}},
		{"lone creates of other tenants, one after another, never stop a flood", 3, 0, func(t *testing.T, g *coldGate, clock *time.Time) {
			a1, a2, a3 := g.enter("a"), g.enter("a"), g.enter("a")
			b1 := g.enter("b")
			g.leave(a1) // b's lone create gets the slot
			if !granted(b1) {
				t.Fatal("b's lone create not granted")
			}
			a4 := g.enter("a")
			g.leave(a2)
			g.leave(a3)
			if granted(a4) {
				t.Fatal("a started a create beside b's lone one")
			}
			// c's lone create comes while b's runs, and a has waited
			// loneHoldMax: a gets one slot.
			*clock = clock.Add(loneHoldMax)
			c1 := g.enter("c")
			if !granted(c1) || !granted(a4) {
				t.Fatalf("c granted %v, a's waiter %v; want both", granted(c1), granted(a4))
			}
			a5 := g.enter("a")
			g.leave(b1)
			g.leave(a4)
			if granted(a5) {
				t.Fatal("a's next granted at once beside c's lone create")
			}
			g.leave(c1)
			if !granted(a5) {
				t.Fatal("a's next not granted once the lone creates ended")
			}
		}},
		{"two floods: the slot a lone create leaves free is used", 3, 0, func(t *testing.T, g *coldGate, _ *time.Time) {
			a1, b1 := g.enter("a"), g.enter("b")
			// a's second waits beside b's lone create; b's second makes b
			// a flood too, so nothing is lone any more and it takes the
			// third slot.
			a2, b2 := g.enter("a"), g.enter("b")
			if granted(a2) || !granted(b2) {
				t.Fatalf("a's second %v, b's second %v; want b's", granted(a2), granted(b2))
			}
			g.leave(a1)
			if !granted(a2) {
				t.Fatal("a's second not granted the freed slot")
			}
			g.leave(b1)
		}},
		{"a lone create that becomes a flood frees the others' slots", 5, 0, func(t *testing.T, g *coldGate, _ *time.Time) {
			a1, a2, b1 := g.enter("a"), g.enter("a"), g.enter("b")
			a3, a4 := g.enter("a"), g.enter("a") // beside b's lone create: both wait, two slots free
			if granted(a3) || granted(a4) {
				t.Fatal("a granted a third slot beside b's lone create")
			}
			// b's second makes b a flood: it takes a free slot, and a's
			// oldest waiter the other.
			if b2 := g.enter("b"); !granted(b2) {
				t.Fatal("b's second not granted a free slot")
			}
			if !granted(a3) || granted(a4) {
				t.Fatalf("a's third %v, fourth %v; want the third only", granted(a3), granted(a4))
			}
			g.leave(a1)
			g.leave(a2)
			g.leave(b1)
		}},
		{"a tenant alone may queue the whole queue, then gets refused", 1, 4, func(t *testing.T, g *coldGate, _ *time.Time) {
			g.enter("a") // holds the slot
			for i := range 4 {
				if w := g.enter("a"); w == nil {
					t.Fatalf("waiter %d refused within the queue", i)
				}
			}
			if w := g.enter("a"); w != nil {
				t.Fatal("a waiter beyond the queue was queued")
			}
		}},
		{"the queue is shared fairly between tenants waiting", 1, 4, func(t *testing.T, g *coldGate, _ *time.Time) {
			g.enter("a")
			for range 4 {
				g.enter("a")
			}
			// b's share is 4/2 = 2, though a fills the whole queue.
			if b1, b2 := g.enter("b"), g.enter("b"); b1 == nil || b2 == nil {
				t.Fatal("b refused within its share")
			}
			if b3 := g.enter("b"); b3 != nil {
				t.Fatal("b queued beyond its share")
			}
			if a := g.enter("a"); a != nil {
				t.Fatal("a queued beyond its share")
			}
		}},
		{"no queue bound: nothing is refused", 1, 0, func(t *testing.T, g *coldGate, _ *time.Time) {
			for i := range 1000 {
				if g.enter("a") == nil {
					t.Fatalf("enter %d refused without a bound", i)
				}
			}
		}},
		{"one slot: a tenant may take it", 1, 0, func(t *testing.T, g *coldGate, _ *time.Time) {
			if a1 := g.enter("a"); !granted(a1) {
				t.Fatal("the only slot was not granted")
			}
		}},
		{"a freed slot goes to the tenant holding fewer", 2, 0, func(t *testing.T, g *coldGate, _ *time.Time) {
			a1, b1 := g.enter("a"), g.enter("b")
			a2, a3, b2 := g.enter("a"), g.enter("a"), g.enter("b")
			g.leave(b1) // b holds 0, a 1: b2 goes first although a queued before
			if !granted(b2) || granted(a2) {
				t.Fatalf("b granted %v, a's oldest waiter %v; want b first", granted(b2), granted(a2))
			}
			g.leave(a1)
			if granted(a2) {
				t.Fatal("a, flooding, started a create beside b's lone one")
			}
			g.leave(b2)
			if !granted(a2) || granted(a3) {
				t.Fatal("a's waiters are not served oldest first")
			}
		}},
		{"equal holders take turns", 3, 0, func(t *testing.T, g *coldGate, _ *time.Time) {
			a1, b1, c1 := g.enter("a"), g.enter("b"), g.enter("c")
			a2, b2 := g.enter("a"), g.enter("b")
			g.leave(c1) // a and b hold one each; a was served longest ago
			if !granted(a2) || granted(b2) {
				t.Fatal("the tenant served longest ago should go first")
			}
			g.leave(a1)
			if !granted(b2) {
				t.Fatal("b should have had its turn")
			}
			g.leave(b1)
		}},
		{"a waiter that leaves gives up its place", 3, 0, func(t *testing.T, g *coldGate, _ *time.Time) {
			a1, _, b1 := g.enter("a"), g.enter("a"), g.enter("b")
			b2, c1 := g.enter("b"), g.enter("c")
			g.leave(c1) // gave up (its context ended)
			g.leave(a1)
			if !granted(b2) || granted(c1) {
				t.Fatal("the slot went to a waiter that had left")
			}
			if n := g.waiting(); n != 0 {
				t.Fatalf("%d still waiting", n)
			}
			g.leave(b1)
		}},
		{"a flood's creates are background, a lone one is not", 3, 0, func(t *testing.T, g *coldGate, _ *time.Time) {
			// a's first create is alone; its second runs beside the
			// first; the one after waits with another behind it.
			a1, a2, a3, a4 := g.enter("a"), g.enter("a"), g.enter("a"), g.enter("a")
			if a1.background || !a2.background || !a3.background {
				t.Fatalf("background %v %v %v, want false true true", a1.background, a2.background, a3.background)
			}
			// b's create, one at a time, is never background, also when
			// it gets a slot freed by a's flood.
			b1 := g.enter("b")
			g.leave(a1)
			if !granted(b1) || b1.background {
				t.Fatalf("b granted %v, background %v; want a foreground slot", granted(b1), b1.background)
			}
			g.leave(b1)
			g.leave(a2)
			if !granted(a4) || !a4.background {
				t.Fatal("a's waiter granted beside a's other create is not background")
			}
			g.leave(a3)
			g.leave(a4)
			if a5 := g.enter("a"); !granted(a5) || a5.background {
				t.Fatal("a's create after its flood ended, alone now, is background")
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newColdGate(c.slots, c.queue)
			clock := time.Unix(1e9, 0)
			g.now = func() time.Time { return clock }
			c.run(t, g, &clock)
		})
	}
}

// TestColdGateInvariants drives the gate with random enters, leaves and
// clock steps, and checks after each what must always hold: every slot
// is free or held, no slot stays free while a waiting tenant is below its
// cap, the tenants remembered are exactly the active ones, and the queue
// of waiting tenants is in order.
func TestColdGateInvariants(t *testing.T) {
	for _, c := range []struct{ slots, queue, tenants int }{
		{1, 0, 2}, {3, 0, 5}, {3, 6, 8}, {4, 0, 40},
	} {
		t.Run(fmt.Sprintf("slots=%d,queue=%d,tenants=%d", c.slots, c.queue, c.tenants), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.slots), uint64(c.tenants)))
			g := newColdGate(c.slots, c.queue)
			clock := time.Unix(1e9, 0)
			g.now = func() time.Time { return clock }
			var live []*gateWaiter // entered, not left
			for op := range 20000 {
				switch r := rng.IntN(10); {
				case r < 5:
					if w := g.enter(tenant.ID(fmt.Sprint("t", rng.IntN(c.tenants)))); w != nil {
						live = append(live, w)
					}
				case r < 9 && len(live) > 0:
					i := rng.IntN(len(live))
					g.leave(live[i])
					live = slices.Delete(live, i, i+1)
				default:
					// Caps change with time alone (a window or loneHoldMax
					// passes); the gate looks at them on its next call.
					clock = clock.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
					continue
				}
				held, waiting := 0, 0
				for _, w := range live {
					if granted(w) {
						held++
					} else {
						waiting++
					}
				}
				g.mu.Lock()
				now := g.now()
				if g.free+held != c.slots || g.free < 0 {
					t.Fatalf("op %d: %d free and %d held of %d slots", op, g.free, held, c.slots)
				}
				queued := 0
				for i, q := range g.queued {
					queued += len(q.queue)
					if q.index != i || len(q.queue) == 0 {
						t.Fatalf("op %d: %s at %d of the waiting has index %d and %d waiters", op, q.id, i, q.index, len(q.queue))
					}
					if i > 0 && g.queued.before(q, g.queued[(i-1)/2]) {
						t.Fatalf("op %d: %s is before its parent in the waiting tenants' heap", op, q.id)
					}
					if g.free > 0 && q.held < g.capLocked(q, now) {
						t.Fatalf("op %d: a slot is free and %s waits below its cap", op, q.id)
					}
				}
				if queued != waiting {
					t.Fatalf("op %d: the gate queues %d, %d wait", op, queued, waiting)
				}
				for id, r := range g.tenants {
					if r.idle() && now.Sub(r.asked) >= g.shareWindow {
						t.Fatalf("op %d: %s is remembered, idle since %v", op, id, now.Sub(r.asked))
					}
				}
				for _, w := range live {
					if g.tenants[w.t.id] != w.t {
						t.Fatalf("op %d: %s holds or waits, and is not remembered", op, w.t.id)
					}
				}
				g.mu.Unlock()
			}
			for _, w := range live {
				g.leave(w)
			}
			if g.free != c.slots || len(g.queued) != 0 || len(g.loners) != 0 {
				t.Fatalf("after every leave: %d free, %d waiting, %d lone", g.free, len(g.queued), len(g.loners))
			}
		})
	}
}

type sandboxtestBackend = sandboxtest.Backend

// countingBackend records the most Creates that ran at once. A create
// takes fast, but a spec with env var STUCK blocks until its context ends,
// and with hold set a create waits for a value from it instead (fake time
// runs whenever the bubble blocks, so durations cannot order events).
type countingBackend struct {
	*sandboxtestBackend
	fast time.Duration
	hold chan struct{}

	inFlight, most atomic.Int32
}

func (b *countingBackend) Create(ctx context.Context, s runtime.Spec) (*runtime.Sandbox, error) {
	n := b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	for {
		m := b.most.Load()
		if n <= m || b.most.CompareAndSwap(m, n) {
			break
		}
	}
	switch {
	case s.Env["STUCK"] != "":
		<-ctx.Done()
		return nil, ctx.Err()
	case b.hold != nil:
		select {
		case <-b.hold:
			return b.sandboxtestBackend.Create(ctx, s)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	select {
	case <-time.After(b.fast):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.sandboxtestBackend.Create(ctx, s)
}

func newCountingEnv(t *testing.T, coldParallel int) (*testEnv, *countingBackend) {
	t.Helper()
	var cb *countingBackend
	e := newTestEnv(t, func(c *Config) {
		cb = &countingBackend{sandboxtestBackend: c.Backend.(*sandboxtestBackend), fast: time.Second}
		c.Backend = cb
		c.ColdParallel = coldParallel
	})
	return e, cb
}

func TestColdCreatesBounded(t *testing.T) {
	for _, c := range []struct {
		name    string
		tenants []string
		want    int32
	}{
		{"one tenant: every slot (work-conserving)", []string{"a"}, 3},
		{"two tenants: every slot", []string{"a", "b"}, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e, cb := newCountingEnv(t, 3)
				var wg sync.WaitGroup
				for i := range 8 {
					wg.Go(func() {
						if _, err := e.m.Create(as(c.tenants[i%len(c.tenants)]), CreateRequest{}); err != nil {
							t.Error(err)
						}
					})
				}
				wg.Wait()
				if got := cb.most.Load(); got != c.want {
					t.Fatalf("%d backend creates ran at once, want %d", got, c.want)
				}
				if n := e.be.Len(); n != 8 {
					t.Fatalf("%d sandboxes, want 8", n)
				}
			})
		})
	}
}

// TestColdCreateFairness: tenant a queues five creates behind one slot, then
// b asks for one: b's goes next, not after a's backlog.
func TestColdCreateFairness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := newCountingEnv(t, 1)
		var (
			mu    sync.Mutex
			order []string
			wg    sync.WaitGroup
		)
		create := func(who string, i int) {
			if _, err := e.m.Create(as(who), CreateRequest{}); err != nil {
				t.Error(err)
			}
			mu.Lock()
			order = append(order, fmt.Sprintf("%s%d", who, i))
			mu.Unlock()
		}
		for i := range 5 {
			wg.Go(func() { create("a", i) })
		}
		synctest.Wait() // one of a's holds the slot, four wait
		wg.Go(func() { create("b", 0) })
		wg.Wait()
		if i := slices.Index(order, "b0"); i != 1 {
			t.Fatalf("completion order %v: b's create finished at place %d, want 1 (right after the create holding the slot)", order, i)
		}
	})
}

// TestMissTakesRefill: with the only cold-create slot busy, a miss gets the
// member the pool's refill makes, rather than waiting for the slot.
func TestMissTakesRefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, cb, p := oneWarmMember(t)

		stuck := CreateRequest{AllowInternet: true, EnvVars: map[string]string{"STUCK": "1"}}
		hit, err := e.m.Create(as("a"), stuck) // the member: no backend create at all
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(as("a"))
		defer cancel()
		coldDone := make(chan error, 1)
		go func() { _, err := e.m.Create(ctx, stuck); coldDone <- err }() // takes the slot for good
		synctest.Wait()
		type res struct {
			sb  *store.Sandbox
			err error
		}
		waiter := make(chan res, 1)
		go func() { sb, err := e.m.Create(as("a"), stuck); waiter <- res{sb, err} }()
		synctest.Wait()
		select {
		case r := <-waiter:
			t.Fatalf("a miss with the slot busy and no refill ready returned: %+v", r)
		default:
		}
		cb.hold <- struct{}{} // the refill the first create's hand-over started
		r := <-waiter
		got, err := r.sb, r.err
		if err != nil {
			t.Fatal(err)
		}
		if got.ID == hit.ID || e.be.Get(got.ID) == nil {
			t.Fatalf("create got %s, want a new member", got.ID)
		}
		var waited uint64
		for _, c := range p.Counts() {
			waited += c.Waited
		}
		if waited != 1 {
			t.Fatalf("counts %+v: want 1 waited", p.Counts())
		}
		cancel()
		if err := <-coldDone; !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled cold create: %v", err)
		}
	})
}

// oneWarmMember: one cold-create slot, tenant a with min_warm 1 and its
// member ready; the backend's creates wait on cb.hold from then on.
func oneWarmMember(t *testing.T) (*testEnv, *countingBackend, *pool.Pools) {
	t.Helper()
	e, cb := newCountingEnv(t, 1)
	cb.hold = make(chan struct{})
	e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(1) })
	p := e.startPools(t)
	cb.hold <- struct{}{} // the first member
	waitFor(t, "1 warm member", func() bool { return ready(p, "a") == 1 })
	return e, cb, p
}

// TestHitRefillsAtHandOver: a create served by a warm member starts the
// member's replacement when it is done (no tick needed), not at the claim.
func TestHitRefillsAtHandOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, cb, p := oneWarmMember(t)
		if _, err := e.m.Create(as("a"), CreateRequest{AllowInternet: true}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // no fake time passes: the pool's tick cannot fire
		starting := 0
		for _, s := range p.Stats() {
			if s.Key.Tenant == "a" {
				starting += s.Starting
			}
		}
		if starting != 1 {
			t.Fatalf("after the create: %+v, want the replacement starting", p.Stats())
		}
		cb.hold <- struct{}{}
		waitFor(t, "the replacement", func() bool { return ready(p, "a") == 1 })
	})
}

// TestQuotaCountsWaitingCreates: creates waiting for a cold-create slot have
// no row yet, but count against the quota.
func TestQuotaCountsWaitingCreates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := newCountingEnv(t, 1)
		e.set(t, "a", func(s *tenant.Settings) { s.MaxSandboxes = tenant.Of(2) })
		if ok, refused := createConcurrently(t, e, "a", 5); ok != 2 || refused != 3 {
			t.Fatalf("%d created, %d refused; want 2 and 3", ok, refused)
		}
		if n := e.be.Len(); n != 2 {
			t.Fatalf("%d backend sandboxes, want 2", n)
		}
	})
}

// TestCreateQueueFull: past the bounded queue a create is refused at once
// with ErrRateLimited (429 + Retry-After), leaving nothing behind, and the
// creates within it all succeed.
func TestCreateQueueFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cb *countingBackend
		e := newTestEnv(t, func(c *Config) {
			cb = &countingBackend{sandboxtestBackend: c.Backend.(*sandboxtestBackend), fast: time.Second}
			c.Backend = cb
			c.ColdParallel, c.ColdQueue = 1, 3
		})
		var wg sync.WaitGroup
		var ok, limited atomic.Int32
		for range 6 {
			wg.Go(func() {
				_, err := e.m.Create(as("a"), CreateRequest{})
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, errdefs.ErrRateLimited):
					limited.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if ok.Load() != 4 || limited.Load() != 2 {
			t.Fatalf("%d created, %d refused; want 4 (1 slot + 3 queued) and 2", ok.Load(), limited.Load())
		}
		if n := e.be.Len(); n != 4 {
			t.Fatalf("backend holds %d sandboxes, want 4", n)
		}
	})
}

// BenchmarkColdGate is one create's pass through the gate while n tenants
// flood it, each with waiters queued: a slot is freed, the next waiter is
// granted, its tenant queues another. enter and leave scan the tenants
// under the gate's lock, so this is what the gate costs every create
// (and every other create waits for) with hundreds of tenants waiting.
// scans/op counts the passes where the benchmark had to look for the
// grantee among all tenants (its guess, the tenant served longest ago,
// was wrong): near 0 once the grants go round.
func BenchmarkColdGate(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			slots := DefaultColdParallel()
			g := newColdGate(slots, 0)
			clock := time.Unix(1e9, 0)
			g.now = func() time.Time { return clock }
			type queued struct {
				id      tenant.ID
				waiters []*gateWaiter // entered, not left; granted ones first
				granted int
			}
			ts := make([]*queued, n)
			for i := range ts {
				// More waiters than slots: no tenant's queue ever empties,
				// so every grant is a flood's (the lone-create rule idle).
				ts[i] = &queued{id: tenant.ID(fmt.Sprintf("t%d", i))}
				for range slots + 2 {
					ts[i].waiters = append(ts[i].waiters, g.enter(ts[i].id))
				}
			}
			var held, idle []*queued // held in grant order; idle holds none, in leave order
			take := func(q *queued) bool {
				if q.granted < len(q.waiters) && granted(q.waiters[q.granted]) {
					q.granted++
					held = append(held, q)
					return true
				}
				return false
			}
			for _, q := range ts {
				for take(q) {
				}
				if q.granted == 0 {
					idle = append(idle, q)
				}
			}
			scans := 0
			pass := func() {
				// A create takes about 10 ms; many finish in that time.
				clock = clock.Add(100 * time.Microsecond)
				q := held[0]
				held = held[1:]
				g.leave(q.waiters[0])
				q.waiters = q.waiters[1:]
				q.granted--
				if q.granted == 0 {
					idle = append(idle, q)
				}
				q.waiters = append(q.waiters, g.enter(q.id))
				if len(idle) > 0 && take(idle[0]) {
					idle = idle[1:]
					return
				}
				scans++
				for i, r := range idle {
					if take(r) {
						idle = slices.Delete(idle, i, i+1)
						return
					}
				}
				for _, r := range ts {
					if take(r) {
						return
					}
				}
				b.Fatal("a freed slot went to nobody")
			}
			for range 3 * n {
				pass()
			}
			scans = 0
			b.ResetTimer()
			for range b.N {
				pass()
			}
			b.ReportMetric(float64(scans)/float64(b.N), "scans/op")
		})
	}
}
