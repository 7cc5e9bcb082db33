package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// TouchInterval is the default of Config.TouchInterval: the most often
// Touch writes one sandbox's activity to the store; activity in between is
// kept in memory and consulted by the sweeper.
const TouchInterval = 5 * time.Second

// liveInfo is what the Manager caches of a live sandbox for the data plane:
// who owns it, its idle TTL, and its activity. Entries go when the sandbox
// is paused or killed (and come back on the next lookup).
type liveInfo struct {
	id      string
	tenant  tenant.ID
	idleTTL time.Duration
	written atomic.Int64 // Unix ns of the last activity written to the store
	seen    atomic.Int64 // Unix ns of the last activity, written or not
	busy    atomic.Int32 // requests in flight (Active); a busy sandbox is not idle
}

// remember caches sb (read from the store, live) and returns its entry.
func (m *Manager) remember(sb *store.Sandbox) *liveInfo {
	if v, ok := m.live.Load(sb.ID); ok {
		return v.(*liveInfo)
	}
	li := &liveInfo{id: sb.ID, tenant: sb.Tenant, idleTTL: sb.IdleTTL}
	if !sb.LastActiveAt.IsZero() {
		li.written.Store(sb.LastActiveAt.UnixNano())
	}
	v, _ := m.live.LoadOrStore(sb.ID, li)
	return v.(*liveInfo)
}

// liveInfo returns the cached entry of live sandbox id, reading the store
// on a miss. A missing or killed sandbox is ErrNotFound.
func (m *Manager) liveInfo(ctx context.Context, id string) (*liveInfo, error) {
	if v, ok := m.live.Load(id); ok {
		return v.(*liveInfo), nil
	}
	sb, err := m.store.GetSandboxAny(ctx, id)
	if err != nil || !sb.State.Live() {
		return nil, errdefs.ErrNotFound
	}
	return m.remember(&sb), nil
}

// SandboxTenant returns the tenant owning live sandbox id, from a cache, for
// callers that reach a sandbox without an API key (the data-plane proxy's
// rate limit). A missing or killed sandbox is ErrNotFound.
func (m *Manager) SandboxTenant(ctx context.Context, id string) (tenant.ID, error) {
	li, err := m.liveInfo(ctx, id)
	if err != nil {
		return "", err
	}
	return li.tenant, nil
}

// Touch records activity on sandbox id (a data-plane request, a native
// exec, file or websocket call), postponing its idle kill. Sandboxes without
// an idle TTL are not written; the others at most once per TouchInterval.
// Unknown sandboxes are ignored: the caller's own request reports them.
func (m *Manager) Touch(ctx context.Context, id string) {
	li, err := m.liveInfo(ctx, id)
	if err != nil {
		return
	}
	m.touch(ctx, li)
}

// Active marks sandbox id busy until the returned func is called: a
// sandbox with a request in flight (a long exec, a websocket, a streaming
// proxy request) is never idle. It touches at both ends. The func is never
// nil; for an unknown sandbox or one without an idle TTL it does nothing.
func (m *Manager) Active(ctx context.Context, id string) (done func()) {
	li, err := m.liveInfo(ctx, id)
	if err != nil || li.idleTTL <= 0 {
		return func() {}
	}
	li.busy.Add(1)
	m.touch(ctx, li)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			li.busy.Add(-1)
			m.touch(context.WithoutCancel(ctx), li)
		}
	}
}

func (m *Manager) touch(ctx context.Context, li *liveInfo) {
	if li.idleTTL <= 0 {
		return
	}
	now := m.now()
	ns := now.UnixNano()
	for {
		seen := li.seen.Load()
		if seen >= ns || li.seen.CompareAndSwap(seen, ns) {
			break
		}
	}
	last := li.written.Load()
	if ns-last < int64(m.cfg.TouchInterval) || !li.written.CompareAndSwap(last, ns) {
		return
	}
	if err := m.store.TouchSandbox(context.WithoutCancel(ctx), li.id, now.UTC()); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.log.Warn("touch sandbox", "sandbox_id", li.id, "err", err)
	}
}

// lastActive is sb's last activity: the store's, or newer activity that
// Touch kept in memory; its start if none was recorded; now if a request
// is in flight.
func (m *Manager) lastActive(sb *store.Sandbox, now time.Time) time.Time {
	last := sb.LastActiveAt
	if last.IsZero() {
		last = sb.StartedAt
	}
	if v, ok := m.live.Load(sb.ID); ok {
		li := v.(*liveInfo)
		if li.busy.Load() > 0 {
			return now
		}
		if seen := li.seen.Load(); seen > last.UnixNano() {
			last = time.Unix(0, seen).UTC()
		}
	}
	return last
}
