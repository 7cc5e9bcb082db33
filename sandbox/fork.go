package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// MaxForks is the most sandboxes one fork request starts (E2B's limit).
const MaxForks = 100

// ForkResult is one fork of a Fork: the new sandbox, or why it did not
// start. Each fork succeeds or fails on its own, as E2B's do.
type ForkResult struct {
	Sandbox View
	Err     error
}

// Fork starts count new sandboxes, each with a copy of what running sandbox
// id of the tenant in ctx changed in its filesystem (its processes are
// not copied: each fork starts afresh, and a template's start command runs
// again), its template, resources, environment, metadata, lifecycle and
// network settings (E2B's rules), and timeout (0: the default) of its own.
// The source runs on, its timeout untouched; it is frozen only while each
// copy is taken. A paused source is ErrConflict (E2B: resume it first).
func (m *Manager) Fork(ctx context.Context, id string, timeout time.Duration, count int) ([]ForkResult, error) {
	t, ok := tenant.FromContext(ctx)
	if !ok {
		return nil, errdefs.New(errdefs.ErrUnauthenticated, "no tenant")
	}
	switch {
	case count < 1:
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "count must be at least 1")
	case count > MaxForks:
		return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("count cannot be greater than %d", MaxForks))
	}
	if limit := m.adm.settings.Get(t).MaxSandboxes; limit > 0 && count >= limit {
		// The source holds one of the tenant's sandboxes: more forks than
		// that could never all start.
		return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(
			"count must be lower than the maximum number of concurrent sandboxes (%d)", limit))
	}
	timeout, err := m.clampTimeout(timeout)
	if err != nil {
		return nil, err
	}
	src, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := RunningFor(src, "forked"); err != nil {
		return nil, err
	}
	// A tenant at its quota could start none of the forks: the request is
	// refused as a create over quota is (429), not answered 201 with every
	// fork failed. Admission checks again per fork, atomically.
	if err := m.adm.Room(ctx, src); err != nil {
		return nil, err
	}
	req := CreateRequest{
		Template: src.Template, Secure: src.Secure, AllowInternet: src.AllowInternetAccess,
		Metadata: src.Metadata, EnvVars: src.EnvVars, Lifecycle: src.Lifecycle, IdleTTL: src.IdleTTL,
	}
	if len(src.Network) > 0 {
		n := Network(src)
		n.TrafficAccessToken = "" // each fork gets its own (newRow)
		req.Network = &n
	}
	// The forks mount the source's volumes, shared as any volume is.
	vols, err := m.store.SandboxVolumes(ctx, src.ID)
	if err != nil {
		return nil, err
	}
	key := pool.Key{
		Tenant: t, Template: src.Template, CPUCount: src.CPUCount, MemoryMB: src.MemoryMB, DiskMB: src.DiskMB,
		AllowInternet: src.AllowInternetAccess,
	}
	out := make([]ForkResult, count)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			start := m.now()
			sb, err := m.newRow(key, req, start, timeout)
			if err == nil {
				sb.Alias = src.Alias
				err = m.create(ctx, sb, key, start, createExtra{forkOf: src.ID, mounts: mounts(vols)})
			}
			if err != nil {
				m.audit(ctx, "fork", sb, err, "fork_of", src.ID)
				out[i].Err = err
				return
			}
			m.recordVolumes(ctx, sb, vols)
			out[i].Sandbox = viewOf(sb)
		})
	}
	wg.Wait()
	return out, nil
}

// RunningFor refuses (ErrConflict, E2B's 409) to act on a sandbox that is
// not running: what is "forked" or "snapshotted".
func RunningFor(sb *store.Sandbox, what string) error {
	switch sb.State {
	case store.StateRunning:
		return nil
	case store.StatePaused:
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("sandbox %q is paused and cannot be %s; resume it first", sb.ID, what))
	}
	return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("sandbox %q cannot be %s while %s", sb.ID, what, sb.State))
}

// Checkpoint saves what running sandbox id of the tenant in ctx changed in
// its filesystem as the backend's layer key (runtime.Layered.Commit: the
// sandbox is frozen while it is copied, and runs on), under the sandbox's
// lock so that no pause or kill cuts it short. It returns the sandbox as it
// was checkpointed.
func (m *Manager) Checkpoint(ctx context.Context, id, key string) (*store.Sandbox, error) {
	l, ok := m.backend.(runtime.Layered)
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotImplemented, "this backend cannot snapshot sandboxes")
	}
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := RunningFor(sb, "snapshotted"); err != nil {
		return nil, err
	}
	t0 := m.now()
	err = l.Commit(ctx, id, key)
	m.audit(ctx, "snapshot", sb, err, "layer", key, "took_ms", m.now().Sub(t0).Milliseconds())
	if err != nil {
		if errors.Is(err, runtime.ErrNotFound) || errors.Is(err, runtime.ErrNotRunning) {
			return nil, notFound(id, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("snapshot sandbox %s: %w", id, backendErr(err))
	}
	return sb, nil
}
