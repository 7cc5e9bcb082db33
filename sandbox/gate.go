package sandbox

import (
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
// equals, and within a tenant to its oldest waiter.
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
	held        map[tenant.ID]int
	queues      map[tenant.ID][]*gateWaiter
	served      map[tenant.ID]uint64    // grant sequence of each tenant's last slot
	asked       map[tenant.ID]time.Time // each tenant's last enter, within shareWindow
	lone        map[tenant.ID]int       // slots held by creates granted alone (gateWaiter.background false)
	seq         uint64
}

type gateWaiter struct {
	t       tenant.ID
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
		held:   map[tenant.ID]int{},
		queues: map[tenant.ID][]*gateWaiter{},
		served: map[tenant.ID]uint64{},
		asked:  map[tenant.ID]time.Time{},
		lone:   map[tenant.ID]int{},
	}
}

// capLocked is the most slots tenant t may hold now: all of them while it
// is alone, all but one (at least one) once another tenant is active, and
// while it floods (holds a slot or waits) and another tenant's lone create
// runs, none, or one once its oldest waiter has waited loneHoldMax.
func (g *coldGate) capLocked(t tenant.ID, now time.Time) int {
	if q := g.queues[t]; g.held[t] > 0 || len(q) > 0 {
		for u := range g.lone {
			if u != t && g.held[u] == 1 && len(g.queues[u]) == 0 {
				if len(q) > 0 && now.Sub(q[0].since) >= loneHoldMax {
					return 1
				}
				return 0
			}
		}
	}
	for u, at := range g.asked {
		if u == t {
			continue
		}
		if g.held[u] > 0 || len(g.queues[u]) > 0 || now.Sub(at) < g.shareWindow {
			return max(g.slots-1, 1)
		}
	}
	return g.slots
}

// enter returns a waiter for a slot of tenant t; its granted channel is
// already closed when a slot was free. Every waiter ends with leave: after
// a grant (the slot is then released) or instead of one. It returns nil
// when t's share of the bounded queue is full: the create is refused.
func (g *coldGate) enter(t tenant.ID) *gateWaiter {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	w := &gateWaiter{t: t, since: now, granted: make(chan struct{})}
	for u, at := range g.asked {
		// Forget tenants idle past the window: the map follows active ones.
		if now.Sub(at) >= g.shareWindow && g.held[u] == 0 && len(g.queues[u]) == 0 {
			delete(g.asked, u)
		}
	}
	g.asked[t] = now
	// A tenant with waiters is at its cap, or no slot is free: it queues
	// behind them.
	if g.free > 0 && g.held[t] < g.capLocked(t, now) && len(g.queues[t]) == 0 {
		g.grantLocked(w)
		g.handOnLocked() // as below
		return w
	}
	if g.queueMax > 0 && len(g.queues[t]) >= g.shareLocked(t) {
		return nil
	}
	g.queues[t] = append(g.queues[t], w)
	// A tenant with a second create no longer runs a lone one that holds
	// floods back: a slot kept free for that may now be theirs.
	g.handOnLocked()
	return w
}

// shareLocked is how many waiters tenant t may have: queueMax split evenly
// among the tenants waiting (t among them), at least one.
func (g *coldGate) shareLocked(t tenant.ID) int {
	n := len(g.queues)
	if _, ok := g.queues[t]; !ok {
		n++
	}
	return max(g.queueMax/n, 1)
}

// leave releases w's slot if it got one, or takes it out of the queue.
func (g *coldGate) leave(w *gateWaiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-w.granted:
		if !w.background {
			if g.lone[w.t]--; g.lone[w.t] == 0 {
				delete(g.lone, w.t)
			}
		}
		g.held[w.t]--
		if g.held[w.t] == 0 {
			delete(g.held, w.t)
			if len(g.queues[w.t]) == 0 {
				// Its turn order matters only while it creates or waits.
				delete(g.served, w.t)
			}
		}
		g.free++
		g.handOnLocked()
		return
	default:
	}
	q := g.queues[w.t]
	for i, x := range q {
		if x == w {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(g.queues, w.t)
		if g.held[w.t] == 0 {
			delete(g.served, w.t)
		}
	} else {
		g.queues[w.t] = q
	}
}

func (g *coldGate) grantLocked(w *gateWaiter) {
	w.background = g.held[w.t] > 0 || len(g.queues[w.t]) > 0
	if !w.background {
		g.lone[w.t]++
	}
	g.free--
	g.held[w.t]++
	g.seq++
	g.served[w.t] = g.seq
	close(w.granted)
}

// handOnLocked gives free slots to waiters of tenants below their cap.
func (g *coldGate) handOnLocked() {
	now := g.now()
	for g.free > 0 {
		var next tenant.ID
		found := false
		for t := range g.queues {
			if g.held[t] >= g.capLocked(t, now) {
				continue
			}
			if !found || g.held[t] < g.held[next] || g.held[t] == g.held[next] && g.served[t] < g.served[next] {
				next, found = t, true
			}
		}
		if !found {
			return
		}
		q := g.queues[next]
		w := q[0]
		if len(q) == 1 {
			delete(g.queues, next)
		} else {
			g.queues[next] = q[1:]
		}
		g.grantLocked(w)
	}
}

// waiting reports how many creates wait for a slot (metrics, tests).
func (g *coldGate) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, q := range g.queues {
		n += len(q)
	}
	return n
}
