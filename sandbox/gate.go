package sandbox

import (
	"container/heap"
	"slices"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

// coldGate bounds the cold creates in flight (see the package doc, "Cold
// create admission"), work-conserving: a tenant alone on the host may hold
// every slot; once another tenant is active (holds a slot, waits for one,
// or asked within shareWindow), each holds at most all slots but one, so
// the other's create finds a slot free or waits for at most one create.
// While another tenant's lone create runs (granted as its tenant's only
// one, not in the background, and still its only one), a tenant with more
// than one create (holding a slot or waiting) starts none: the flood's
// creates already started finish beside the lone one, niced, and its next
// wait for the lone create's time, which is all the fairness goal lets a
// flood cost another tenant. For at most loneHoldMax: lone creates of many
// tenants, one after another, never stop a flood, which then goes on one
// slot at a time.
// Waiters queue per tenant; a freed slot goes to the waiting tenant below
// its cap that holds the fewest slots, the one served longest ago among
// equals (then the one known longest), and within a tenant to its oldest
// waiter.
//
// The queue is what exceeds the host's capacity: with queueMax above zero,
// a tenant's waiters are bounded by its fair share of it (queueMax divided
// among the tenants waiting), and a create beyond that is refused (429 with
// Retry-After) instead of waiting unboundedly.
type coldGate struct {
	mu          sync.Mutex
	slots, free int
	queueMax    int           // 0: unbounded
	shareWindow time.Duration // how long a tenant counts as active after asking
	now         func() time.Time
	// tenants are the active ones: each asked within shareWindow, holds a
	// slot or waits for one. A record per tenant, and a heap of those
	// waiting, so that a create's pass through the gate costs the same
	// with a thousand tenants flooding it as with two (BenchmarkColdGate).
	tenants map[tenant.ID]*gateTenant
	queued  gateHeap      // tenants with waiters, the next to be served first
	asks    []gateAsk     // every enter within shareWindow, oldest first
	loners  []*gateTenant // tenants holding slots granted alone: at most slots
	seq     uint64        // grants so far
	records uint64        // tenant records made so far
}

// gateTenant is one active tenant's part of the gate.
type gateTenant struct {
	id     tenant.ID
	held   int           // slots held
	lone   int           // of those, granted alone (gateWaiter.background false)
	queue  []*gateWaiter // oldest first
	served uint64        // grant sequence of its last slot; 0 while idle
	asked  time.Time     // its last enter
	order  uint64        // when its record was made: first among equals
	index  int           // in coldGate.queued; -1 when not waiting
}

func (t *gateTenant) idle() bool { return t.held == 0 && len(t.queue) == 0 }

// gateAsk is one enter, so that a tenant idle past the window is forgotten
// without scanning every tenant.
type gateAsk struct {
	t  *gateTenant
	at time.Time
}

type gateWaiter struct {
	t       *gateTenant
	since   time.Time     // when it entered
	granted chan struct{} // closed when the waiter holds a slot
	// background: at its grant, its tenant held another slot or had
	// waiters behind it, so it is one of a flood (runtime.Spec.Background).
	// Set before granted is closed.
	background bool
}

// defaultShareWindow: a tenant that asked for a slot this recently keeps
// a slot free of any other tenant's, so its sequential creates during
// another's flood never wait for the flood.
const defaultShareWindow = 2 * time.Second

// loneHoldMax is the longest a flood's oldest waiter is held back by other
// tenants' lone creates: several creates' time (a cold create takes about
// 10 ms on the local backend), and short of any client's patience.
const loneHoldMax = 100 * time.Millisecond

func newColdGate(slots, queueMax int) *coldGate {
	return &coldGate{
		slots: slots, free: slots, queueMax: max(queueMax, 0),
		shareWindow: defaultShareWindow, now: time.Now,
		tenants: map[tenant.ID]*gateTenant{},
	}
}

// loneRunning reports whether a tenant other than t runs a lone create:
// it holds one slot, granted alone, and waits for no other.
func (g *coldGate) loneRunning(t *gateTenant) bool {
	for _, u := range g.loners {
		if u != t && u.held == 1 && len(u.queue) == 0 {
			return true
		}
	}
	return false
}

// capLocked is the most slots tenant t may hold now: all of them while it
// is alone, all but one (at least one) once another tenant is active, and
// while it floods (holds a slot or waits) and another tenant's lone create
// runs, none, or one once its oldest waiter has waited loneHoldMax.
// t is active (in g.tenants) and the idle are forgotten (forgetLocked).
func (g *coldGate) capLocked(t *gateTenant, now time.Time) int {
	if !t.idle() && g.loneRunning(t) {
		if len(t.queue) > 0 && now.Sub(t.queue[0].since) >= loneHoldMax {
			return 1
		}
		return 0
	}
	if len(g.tenants) > 1 {
		return max(g.slots-1, 1)
	}
	return g.slots
}

// forgetLocked drops the tenants idle past the window: g.tenants then
// holds the active ones only. Each enter is looked at once.
func (g *coldGate) forgetLocked(now time.Time) {
	n := 0
	for _, a := range g.asks {
		if now.Sub(a.at) < g.shareWindow {
			break
		}
		n++
		if a.t.asked.Equal(a.at) { // its last enter
			g.dropIfIdleLocked(a.t, now)
		}
	}
	clear(g.asks[:n]) // let dropped records go
	g.asks = g.asks[n:]
}

// dropIfIdleLocked forgets t if it is idle and asked longer ago than the
// window; an idle tenant's turn is forgotten either way.
func (g *coldGate) dropIfIdleLocked(t *gateTenant, now time.Time) {
	if !t.idle() {
		return
	}
	t.served = 0 // its turn order matters only while it creates or waits
	if now.Sub(t.asked) >= g.shareWindow && g.tenants[t.id] == t {
		delete(g.tenants, t.id)
	}
}

// enter returns a waiter for a slot of tenant id; its granted channel is
// already closed when a slot was free. Every waiter ends with leave: after
// a grant (the slot is then released) or instead of one. It returns nil
// when the tenant's share of the bounded queue is full: the create is
// refused.
func (g *coldGate) enter(id tenant.ID) *gateWaiter {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	g.forgetLocked(now)
	t := g.tenants[id]
	if t == nil {
		g.records++
		t = &gateTenant{id: id, order: g.records, index: -1}
		g.tenants[id] = t
	}
	t.asked = now
	g.asks = append(g.asks, gateAsk{t, now})
	w := &gateWaiter{t: t, since: now, granted: make(chan struct{})}
	// A tenant with waiters is at its cap, or no slot is free: it queues
	// behind them.
	if g.free > 0 && len(t.queue) == 0 && t.held < g.capLocked(t, now) {
		g.grantLocked(w)
		g.handOnLocked(now) // as below
		return w
	}
	if g.queueMax > 0 && len(t.queue) >= g.shareLocked(t) {
		g.handOnLocked(now) // as in leave
		return nil
	}
	t.queue = append(t.queue, w)
	if t.index < 0 {
		heap.Push(&g.queued, t)
	}
	// A tenant with a second create no longer runs a lone one that holds
	// floods back: a slot kept free for that may now be theirs.
	g.handOnLocked(now)
	return w
}

// shareLocked is how many waiters tenant t may have: queueMax split evenly
// among the tenants waiting (t among them), at least one.
func (g *coldGate) shareLocked(t *gateTenant) int {
	n := len(g.queued)
	if t.index < 0 {
		n++
	}
	return max(g.queueMax/n, 1)
}

// leave releases w's slot if it got one, or takes it out of the queue.
func (g *coldGate) leave(w *gateWaiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, now := w.t, g.now()
	select {
	case <-w.granted:
		if !w.background {
			if t.lone--; t.lone == 0 {
				g.loners = slices.DeleteFunc(g.loners, func(u *gateTenant) bool { return u == t })
			}
		}
		t.held--
		if t.index >= 0 {
			heap.Fix(&g.queued, t.index)
		}
		g.dropIfIdleLocked(t, now)
		g.free++
		g.handOnLocked(now)
		return
	default:
	}
	if i := slices.Index(t.queue, w); i >= 0 {
		t.queue = slices.Delete(t.queue, i, i+1)
	}
	if len(t.queue) == 0 && t.index >= 0 {
		heap.Remove(&g.queued, t.index)
	}
	g.dropIfIdleLocked(t, now)
	// Caps change with time (another tenant forgotten): every call hands
	// on what they now allow.
	g.handOnLocked(now)
}

func (g *coldGate) grantLocked(w *gateWaiter) {
	t := w.t
	w.background = t.held > 0 || len(t.queue) > 0
	if !w.background {
		if t.lone++; t.lone == 1 {
			g.loners = append(g.loners, t)
		}
	}
	g.free--
	t.held++
	g.seq++
	t.served = g.seq
	close(w.granted)
}

// handOnLocked gives free slots to waiters of tenants below their cap:
// the tenant holding the fewest slots, served longest ago among equals,
// and within a tenant its oldest waiter.
func (g *coldGate) handOnLocked(now time.Time) {
	g.forgetLocked(now)
	for g.free > 0 && len(g.queued) > 0 {
		var next *gateTenant
		if g.loneRunning(nil) {
			// Each waiting tenant's cap is 0 or 1 by its oldest waiter's
			// age: the heap's order does not say who may have one.
			for _, t := range g.queued {
				if t.held < g.capLocked(t, now) && (next == nil || g.queued.before(t, next)) {
					next = t
				}
			}
		} else if top := g.queued[0]; top.held < g.capLocked(top, now) {
			// Every waiting tenant has the same cap, and the top holds
			// the fewest slots.
			next = top
		}
		if next == nil {
			return
		}
		w := next.queue[0]
		next.queue[0] = nil
		next.queue = next.queue[1:]
		g.grantLocked(w)
		if len(next.queue) == 0 {
			heap.Remove(&g.queued, next.index)
		} else {
			heap.Fix(&g.queued, next.index)
		}
	}
}

// gateHeap orders the waiting tenants, the next to be served first
// (container/heap).
type gateHeap []*gateTenant

func (h gateHeap) before(a, b *gateTenant) bool {
	if a.held != b.held {
		return a.held < b.held
	}
	if a.served != b.served {
		return a.served < b.served
	}
	return a.order < b.order
}

func (h gateHeap) Len() int           { return len(h) }
func (h gateHeap) Less(i, j int) bool { return h.before(h[i], h[j]) }
func (h gateHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *gateHeap) Push(x any) {
	t := x.(*gateTenant)
	t.index = len(*h)
	*h = append(*h, t)
}

func (h *gateHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}

// waiting reports how many creates wait for a slot (metrics, tests).
func (g *coldGate) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, t := range g.queued {
		n += len(t.queue)
	}
	return n
}
