package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/store"
)

// A claimed warm member is handed over before its envd has had /init (when
// the backend is a runtime.LivenessChecker and Config.DeferClaimInit is
// on): the claim asks the backend whether the member runs, which wakes
// nothing, and sends /init in the background once the row says running.
// Under a flood of creates that keep the CPUs busy, a woken envd waits for
// a CPU; the create's answer no longer waits for it, and the /init runs
// while the answer travels to the client and its first request comes back.
//
// Every path into a sandbox's envd on behalf of a caller goes through
// DialSandbox, which holds each connection back until the /init succeeded
// (waiting for the one in flight, or sending it again after a failure): no
// request reaches an envd that has not had its access token. The set is in
// memory: after a restart Reconcile puts every live sandbox in it, and the
// first request re-sends /init (envd takes the same token, env vars and
// user again), since a crash may have come between a claim and its /init.

// uninitialised is the set of sandboxes whose envd awaits its /init, each
// with the attempt in flight, if any.
type uninitialised struct {
	mu sync.Mutex
	m  map[string]*initAttempt // nil: pending, no attempt running
}

// initAttempt is one /init in flight; waiters read err once done closes.
type initAttempt struct {
	done chan struct{}
	err  error
}

func (u *uninitialised) add(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[string]*initAttempt{}
	}
	if _, ok := u.m[id]; !ok {
		u.m[id] = nil
	}
}

// forget drops id: its envd had its /init, or it is gone.
func (u *uninitialised) forget(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.m, id)
}

func (u *uninitialised) pending(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.m[id]
	return ok
}

func (u *uninitialised) len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.m)
}

// ensure runs init for id if id is pending, once for all callers at a
// time: the others wait for that attempt and share its result. A failed
// attempt leaves id pending, for the next caller to try again.
func (u *uninitialised) ensure(ctx context.Context, id string, init func() error) error {
	u.mu.Lock()
	a, ok := u.m[id]
	switch {
	case !ok:
		u.mu.Unlock()
		return nil
	case a != nil:
		u.mu.Unlock()
		select {
		case <-a.done:
			return a.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	a = &initAttempt{done: make(chan struct{})}
	u.m[id] = a
	u.mu.Unlock()

	a.err = init()
	u.mu.Lock()
	if cur, ok := u.m[id]; ok && cur == a {
		if a.err == nil {
			delete(u.m, id)
		} else {
			u.m[id] = nil
		}
	}
	u.mu.Unlock()
	close(a.done)
	return a.err
}

// initDeferred sends sb's deferred /init if it still awaits one: in the
// background after its claim (by "claim"), and before DialSandbox hands
// out a connection into it (by "dial"). The /init is not the caller's to
// cancel: waiters share it, and a caller that went away must not leave
// the next one a half-sent /init to repeat.
func (m *Manager) initDeferred(ctx context.Context, sb *store.Sandbox, by string) error {
	return m.uninit.ensure(ctx, sb.ID, func() error {
		t0 := m.now()
		err := m.initEnvd(context.WithoutCancel(ctx), sb)
		level := slog.LevelDebug
		if err != nil {
			level = slog.LevelWarn
		}
		m.log.Log(ctx, level, "deferred envd /init", "sandbox_id", sb.ID, "tenant", string(sb.Tenant), "by", by,
			"took_ms", m.now().Sub(t0).Milliseconds(), "err", err)
		if m.cfg.OnDeferredInit != nil {
			m.cfg.OnDeferredInit(by, err)
		}
		return err
	})
}

// deferInitAtClaim reports whether a claimed member's /init waits for the
// first request (see uninitialised).
func (m *Manager) deferInitAtClaim() bool { return m.liveness != nil }

// claimedAlive is the claim's check of a member whose /init is deferred:
// the backend's word that it runs, without a request to its envd.
func (m *Manager) claimedAlive(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return m.liveness.Alive(ctx, id)
}
