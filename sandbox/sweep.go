package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
)

// Run sweeps until ctx ends: every interval, and when woken by an end time
// set to now, it enforces end times and purges old killed rows. It returns
// when ctx is done.
func (m *Manager) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Sweep(ctx)
		case <-m.wake:
			m.Sweep(ctx)
		}
	}
}

// wakeSweeper has Run sweep now; a wake already pending covers this one.
func (m *Manager) wakeSweeper() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Sweep acts once on every sandbox whose end time has passed: pause or kill,
// as its lifecycle says. It acts on the (id, generation) it read, so a
// sandbox whose timeout was extended meanwhile is left alone.
func (m *Manager) Sweep(ctx context.Context) {
	now := m.now()
	expired, err := m.store.ListExpired(ctx, now)
	if err != nil {
		m.log.Error("sweep: list expired", "err", err)
		return
	}
	for _, e := range expired {
		m.expire(ctx, e)
	}
	idle, err := m.store.ListIdle(ctx, now)
	if err != nil {
		m.log.Error("sweep: list idle", "err", err)
	}
	for _, e := range idle {
		m.idleKill(ctx, e, now)
	}
	// Every tenth sweep, retry kills whose backend destroy failed: their rows
	// stay "killing" until the backend lets go.
	if m.sweeps.Add(1)%10 == 0 {
		m.retryKills(ctx)
	}
	if _, err := m.store.PurgeKilled(ctx, now.Add(-m.cfg.KilledRetention)); err != nil {
		m.log.Error("sweep: purge killed", "err", err)
	}
	m.logs.purge(now.Add(-m.cfg.KilledRetention))
}

func (m *Manager) expire(ctx context.Context, seen store.Sandbox) {
	unlock := m.lock(seen.ID)
	defer unlock()
	sb, err := m.store.GetSandboxAny(ctx, seen.ID)
	if err != nil || sb.Generation != seen.Generation || sb.State != store.StateRunning {
		return // changed since we looked: its new owner decides
	}
	switch sb.Lifecycle.OnTimeout {
	case store.OnTimeoutPause, store.OnTimeoutPauseDisk:
		memory := sb.Lifecycle.OnTimeout == store.OnTimeoutPause
		err = m.pause(ctx, &sb, "timeout_pause", memory)
		// A failed pause leaves it running past its end time, and the next
		// sweep would try (and fail) again, forever. Step down instead: to
		// a pause in memory, then to a kill.
		if err != nil && !memory && sb.State == store.StateRunning {
			err = m.pause(ctx, &sb, "timeout_pause", true)
		}
		if err != nil && sb.State == store.StateRunning {
			err = m.kill(ctx, &sb, "timeout_kill", "cause", "pause failed: "+err.Error())
		}
	default:
		err = m.kill(ctx, &sb, "timeout_kill")
	}
	if err != nil {
		m.log.Error("sweep: expire", "sandbox_id", sb.ID, "tenant", string(sb.Tenant), "err", err)
	}
}

// idleKill kills a running sandbox whose idle TTL ran out. Touches do not
// bump the generation, so idleness is checked again on a fresh read, with
// the activity Touch kept in memory since its last write.
func (m *Manager) idleKill(ctx context.Context, seen store.Sandbox, now time.Time) {
	unlock := m.lock(seen.ID)
	defer unlock()
	sb, err := m.store.GetSandboxAny(ctx, seen.ID)
	if err != nil || sb.Generation != seen.Generation || sb.State != store.StateRunning || sb.IdleTTL <= 0 {
		return // changed since we looked: its new owner decides
	}
	last := m.lastActive(&sb, now)
	if last.Add(sb.IdleTTL).After(now) {
		return // active again
	}
	if err := m.kill(ctx, &sb, "idle_kill"); err != nil {
		m.log.Error("sweep: idle kill", "sandbox_id", sb.ID, "tenant", string(sb.Tenant), "err", err)
		return
	}
	m.log.Info("sandbox idle", "sandbox_id", sb.ID, "tenant", string(sb.Tenant),
		"idle_ttl_s", int(sb.IdleTTL.Seconds()), "last_active_at", last)
}

// Reconcile makes the store and the backend agree after a start (or a
// crash): the backend cleans up what dead sandboxes left; sandboxes the
// backend holds without a live store row, or whose create or kill was
// interrupted, are destroyed; rows whose sandbox vanished are marked killed;
// interrupted pauses and resumes are settled to what the backend says: a
// sandbox found running gets its envd's /init again (with the token it
// already has, which envd accepts), or is destroyed if that fails.
func (m *Manager) Reconcile(ctx context.Context) error {
	if r, ok := m.backend.(runtime.Reconciler); ok {
		if err := r.Reconcile(ctx); err != nil {
			return err
		}
	}
	held, err := m.backend.List(ctx)
	if err != nil {
		return err
	}
	live, err := m.store.ListLive(ctx)
	if err != nil {
		return err
	}
	rows := make(map[string]*store.Sandbox, len(live))
	for i := range live {
		rows[live[i].ID] = &live[i]
		// Adopted after a restart: the log starts afresh (it is in memory).
		m.logs.open(live[i].ID)
		if m.deferInitAtClaim() && live[i].State != store.StateKilled {
			// A crash may have come between a claim and its deferred
			// /init: each sandbox's first request sends it (again).
			m.uninit.add(live[i].ID)
		}
	}
	inBackend := make(map[string]runtime.State, len(held))
	onDisk := map[string]bool{}
	for _, h := range held {
		inBackend[h.ID] = h.State
		if h.OnDisk {
			onDisk[h.ID] = true
			// Holds no memory: out of the host budget until resumed.
			m.adm.pausedToDisk(h.ID)
		}
		row := rows[h.ID]
		if row == nil || row.State == store.StateCreating || row.State == store.StateKilling {
			// Not ours any more, or a create/kill a crash interrupted.
			if err := m.backend.Destroy(ctx, h.ID); err != nil {
				m.log.Error("reconcile: destroy orphan", "sandbox_id", h.ID, "err", err)
			}
			delete(inBackend, h.ID)
			if row != nil {
				m.markKilled(ctx, row, "reconcile_orphan")
			} else {
				m.log.Info("sandbox reconcile_orphan", "audit", true, "sandbox_id", h.ID, "result", "ok")
			}
		}
	}
	for _, row := range rows {
		if row.State == store.StateKilled {
			continue
		}
		state, ok := inBackend[row.ID]
		switch {
		case !ok:
			m.markKilled(ctx, row, "reconcile_vanished")
		case state == runtime.StatePaused && row.State == store.StateRunning && !onDisk[row.ID]:
			// Frozen while the row says running: a snapshot, fork or
			// pause a crash cut short (none of them answered), whose
			// freeze nobody will lift. It runs on.
			_, err := m.backend.Resume(ctx, row.ID)
			m.audit(ctx, "reconcile_thawed", row, err)
			if err == nil {
				inBackend[row.ID] = runtime.StateRunning
			} else {
				row.State = store.StatePaused
				m.update(ctx, row, "reconcile_paused")
			}
		case state == runtime.StatePaused && row.State != store.StatePaused:
			row.State = store.StatePaused
			m.update(ctx, row, "reconcile_paused")
		case state == runtime.StateRunning && row.State != store.StateRunning:
			// A pause to disk or a resume a crash interrupted: its envd may
			// be a new process that never had its /init.
			m.reinit(ctx, row)
		}
	}
	m.reapplyPolicies(ctx, rows, inBackend)
	for _, row := range rows {
		if row.State == store.StateRunning {
			m.attachStart(row.ID, row.Template, row.EnvdAccessToken)
		}
	}
	m.log.Info("reconciled", "backend_sandboxes", len(inBackend), "store_rows", len(rows))
	return nil
}

// reinit settles a row left "pausing" or "resuming" whose sandbox runs:
// envd gets its /init (again, if it had it) and the row says running, or,
// if envd refuses, the sandbox is destroyed rather than left open.
func (m *Manager) reinit(ctx context.Context, row *store.Sandbox) {
	if err := m.initEnvd(ctx, row); err != nil {
		m.destroyUninitialised(ctx, row, fmt.Errorf("reconcile: init envd: %w", err))
		return
	}
	row.State = store.StateRunning
	m.update(ctx, row, "reconcile_running")
}

func (m *Manager) markKilled(ctx context.Context, row *store.Sandbox, reason string) {
	if row.State == store.StateKilled {
		return
	}
	row.State = store.StateKilled
	row.EndAt = m.now().UTC()
	m.update(ctx, row, reason)
	m.ended(row.ID)
}

func (m *Manager) update(ctx context.Context, row *store.Sandbox, reason string) {
	err := m.store.UpdateSandbox(ctx, row)
	if errors.Is(err, errdefs.ErrConflict) {
		return
	}
	m.audit(ctx, reason, row, err)
}

func (m *Manager) retryKills(ctx context.Context) {
	live, err := m.store.ListLive(ctx)
	if err != nil {
		m.log.Error("sweep: list live", "err", err)
		return
	}
	for _, row := range live {
		if row.State != store.StateKilling {
			continue
		}
		func() {
			unlock := m.lock(row.ID)
			defer unlock()
			sb, err := m.store.GetSandboxAny(ctx, row.ID)
			if err != nil || sb.State != store.StateKilling {
				return
			}
			if err := m.kill(ctx, &sb, "kill_retry"); err != nil {
				m.log.Error("sweep: retry kill", "sandbox_id", sb.ID, "err", err)
			}
		}()
	}
}
