package sandbox

import (
	"sync"

	"github.com/sandboxd/sandboxd/tenant"
)

// coldGate bounds the cold creates in flight (see the package doc, "Cold
// create admission"). A slot is free or held by one create of a tenant, and
// one tenant holds at most perTenant slots (all but one, when there are
// two or more): a create of another tenant then always finds a slot free
// instead of waiting for one. Waiters queue per tenant; a freed slot goes
// to the waiting tenant below its cap that holds the fewest slots, the one
// served longest ago among equals, and within a tenant to its oldest
// waiter.
type coldGate struct {
	mu        sync.Mutex
	free      int
	perTenant int
	held      map[tenant.ID]int
	queues    map[tenant.ID][]*gateWaiter
	served    map[tenant.ID]uint64 // grant sequence of each tenant's last slot
	seq       uint64
}

type gateWaiter struct {
	t       tenant.ID
	granted chan struct{} // closed when the waiter holds a slot
}

func newColdGate(slots int) *coldGate {
	return &coldGate{
		free:      slots,
		perTenant: max(slots-1, 1),
		held:      map[tenant.ID]int{},
		queues:    map[tenant.ID][]*gateWaiter{},
		served:    map[tenant.ID]uint64{},
	}
}

// enter returns a waiter for a slot of tenant t; its granted channel is
// already closed when a slot was free. Every waiter ends with leave: after
// a grant (the slot is then released) or instead of one.
func (g *coldGate) enter(t tenant.ID) *gateWaiter {
	w := &gateWaiter{t: t, granted: make(chan struct{})}
	g.mu.Lock()
	defer g.mu.Unlock()
	// A tenant with waiters is at its cap, or no slot is free: it queues
	// behind them.
	if g.free > 0 && g.held[t] < g.perTenant && len(g.queues[t]) == 0 {
		g.grantLocked(w)
		return w
	}
	g.queues[t] = append(g.queues[t], w)
	return w
}

// leave releases w's slot if it got one, or takes it out of the queue.
func (g *coldGate) leave(w *gateWaiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-w.granted:
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
	g.free--
	g.held[w.t]++
	g.seq++
	g.served[w.t] = g.seq
	close(w.granted)
}

// handOnLocked gives free slots to waiters of tenants below their cap.
func (g *coldGate) handOnLocked() {
	for g.free > 0 {
		var next tenant.ID
		found := false
		for t := range g.queues {
			if g.held[t] >= g.perTenant {
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
