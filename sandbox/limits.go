package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Pool is what the Manager needs of the warm pools (package pool).
type Pool interface {
	// Claim takes a ready member of key, or reports a miss; it never waits.
	Claim(key pool.Key) (*pool.Member, bool)
	// Ready is closed the next time any member becomes ready.
	Ready() <-chan struct{}
	// Take takes a ready member of key after a missed Claim (a miss that
	// waited for a cold-create slot and got a refill first).
	Take(key pool.Key) (*pool.Member, bool)
	// ReservedMB is the memory of all members, for the host budget.
	ReservedMB() int
}

// UsePool makes creates claim warm members from p first. Call it before
// serving.
func (m *Manager) UsePool(p Pool) { m.pool = p }

// PoolKey is the pool a create request of tenant t would claim from.
func (m *Manager) PoolKey(t tenant.ID, req CreateRequest) pool.Key {
	tmpl := req.Template
	if tmpl == "" {
		tmpl = "base"
	}
	def := m.TemplateResources(tmpl)
	return pool.Key{
		Tenant: t, Template: tmpl,
		CPUCount:      cmpOr(req.CPUCount, def.CPUCount),
		MemoryMB:      cmpOr(req.MemoryMB, def.MemoryMB),
		DiskMB:        cmpOr(req.DiskMB, def.DiskSizeMB),
		AllowInternet: req.AllowInternet,
	}
}

// PoolSeeds returns the default pool of every tenant whose min_warm is above
// zero: template "base", default resources, internet allowed (what an SDK's
// plain Sandbox.create() asks for).
func (m *Manager) PoolSeeds() []pool.Key {
	if m.cfg.Settings == nil {
		return nil
	}
	var keys []pool.Key
	for _, t := range m.cfg.Settings.Tenants() {
		if m.cfg.Settings.Get(t).MinWarm > 0 {
			keys = append(keys, m.PoolKey(t, CreateRequest{AllowInternet: true}))
		}
	}
	return keys
}

// MinWarm is tenant t's min_warm.
func (m *Manager) MinWarm(t tenant.ID) int { return m.cfg.Settings.Get(t).MinWarm }

// EnvdHealth asks a sandbox's envd for /health over the backend's channel.
func (m *Manager) EnvdHealth(ctx context.Context, id string) error {
	status, msg, err := m.envdAsk(ctx, id, http.MethodGet, "/health", nil)
	if err != nil {
		return err
	}
	return envdconn.Answered("/health", status, msg)
}

// AdmitMember says whether the pool may create one more member of key, when
// key's tenant already has members warm members of memoryMB in total: live
// sandboxes plus members stay within the tenant's quota, and the host guard
// holds.
func (m *Manager) AdmitMember(ctx context.Context, key pool.Key, members, memoryMB int) error {
	// Under the tenant's lock: a claim and its row land together, so the
	// count never misses a sandbox whose member was just claimed.
	ts := m.tenant(key.Tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	eff := m.cfg.Settings.Get(key.Tenant)
	if eff.MaxSandboxes > 0 {
		n, err := m.store.CountLive(ctx, key.Tenant)
		if err != nil {
			return err
		}
		n += ts.pending // claimed members and waiting creates without a row yet
		if n+members+1 > eff.MaxSandboxes {
			return fmt.Errorf("tenant quota: %d live + %d warm of max %d sandboxes", n, members, eff.MaxSandboxes)
		}
	}
	if eff.MaxMemoryMB > 0 {
		mem, err := m.store.SumMemoryMB(ctx, key.Tenant)
		if err != nil {
			return err
		}
		mem += ts.pendingMB
		if mem+memoryMB+key.MemoryMB > eff.MaxMemoryMB {
			return fmt.Errorf("tenant quota: %d MiB live + %d MiB warm of max %d MiB", mem, memoryMB, eff.MaxMemoryMB)
		}
	}
	return m.checkHost(ctx, key.MemoryMB)
}

// tenantState is a tenant's create bookkeeping. mu serialises a quota
// check with the insert of the row it admits (only for a tenant with a
// quota: without one there is nothing to keep atomic), and with the pool's
// AdmitMember. pending and pendingMB are the creates the quota admitted that
// have no row yet (waiting for a cold-create slot, or a claimed member
// being initialised): the quota counts them here.
type tenantState struct {
	mu                 sync.Mutex
	pending, pendingMB int
}

func (m *Manager) tenant(t tenant.ID) *tenantState {
	v, _ := m.tenants.LoadOrStore(t, &tenantState{})
	return v.(*tenantState)
}

// admission is what admit decided for one create.
type admission struct {
	// member is the warm member claimed (at once, or a refill while
	// waiting); nil for a cold create.
	member *pool.Member
	// waited is how long the create waited for a slot or a refill.
	waited time.Duration
	// release gives the cold-create slot back (a no-op without one).
	release func()
	// commit inserts the row of a claimed member, as running (quota-safe,
	// and only then); nil for a cold create, whose row admit inserted.
	commit func(ctx context.Context) error
}

// admit checks the tenant's quota, then claims a warm member or waits for
// whichever comes first: a cold-create slot or a refill of the pool.
//
// A cold create's row goes in here, as "creating", before the backend is
// asked: if sandboxd dies meanwhile, Reconcile finds the row and destroys
// whatever the backend made of it. A member's row goes in only once its
// envd took /init (commit), in one write: the member already exists, and
// Reconcile destroys backend sandboxes without a row; this keeps a pool
// hit at one store write.
//
// For a tenant with a quota, the check and the insert (or the pending
// count standing in for the row until commit) happen under the tenant's
// lock, so two concurrent creates cannot both pass the last free slot. The
// wait never holds it. admit registers its undos in *undo and takes the
// sandbox's lock (unlock releases it).
func (m *Manager) admit(ctx context.Context, sb *store.Sandbox, req CreateRequest, undo *[]func(context.Context)) (adm admission, unlock func(), err error) {
	ts := m.tenant(sb.Tenant)
	eff := m.cfg.Settings.Get(sb.Tenant)
	quota := eff.MaxSandboxes > 0 || eff.MaxMemoryMB > 0
	key := m.PoolKey(sb.Tenant, req)
	adm.release = func() {}

	ts.mu.Lock()
	locked := true
	unlockTenant := func() {
		if locked {
			locked = false
			ts.mu.Unlock()
		}
	}
	defer unlockTenant()
	if err := m.checkQuota(ctx, sb.Tenant, sb.MemoryMB, ts); err != nil {
		return adm, nil, err
	}
	if m.pool != nil {
		adm.member, _ = m.pool.Claim(key)
	}
	if adm.member == nil && m.gate != nil {
		if err := m.checkHost(ctx, sb.MemoryMB); err != nil {
			return adm, nil, err // short of memory: say so now, not after the wait
		}
		ts.pending++
		ts.pendingMB += sb.MemoryMB
		unlockTenant()
		t0 := m.now()
		var w *gateWaiter
		adm.member, w, err = m.awaitCold(ctx, sb.Tenant, key)
		adm.waited = m.now().Sub(t0)
		ts.mu.Lock()
		locked = true
		ts.pending--
		ts.pendingMB -= sb.MemoryMB
		if err != nil {
			return adm, nil, fmt.Errorf("create sandbox: waiting for a cold-create slot: %w", err)
		}
		if w != nil {
			var once sync.Once
			adm.release = func() { once.Do(func() { m.gate.leave(w) }) }
			defer func() {
				if err != nil {
					adm.release()
				}
			}()
		}
	}

	if mb := adm.member; mb != nil {
		// The member's id becomes the sandbox's, and its access token
		// (already known to the backend's tunnel) the envd token.
		sb.ID = mb.ID
		if sb.Secure {
			sb.EnvdAccessToken = mb.AccessToken
		}
		*undo = append(*undo, func(ctx context.Context) {
			if derr := m.backend.Destroy(ctx, sb.ID); derr != nil {
				m.log.Error("revert create: destroy warm member", "sandbox_id", sb.ID, "err", derr)
			}
		})
		// Until its row is in, the member counts as pending: for the
		// tenant's quota, and for the host budget (it left the pool's
		// reserve when it was claimed).
		ts.pending++
		ts.pendingMB += sb.MemoryMB
		m.pendingMB.Add(int64(sb.MemoryMB))
		var once sync.Once
		unpend := func() {
			once.Do(func() {
				ts.pending--
				ts.pendingMB -= sb.MemoryMB
				m.pendingMB.Add(-int64(sb.MemoryMB))
			})
		}
		*undo = append(*undo, func(context.Context) {
			ts.mu.Lock()
			defer ts.mu.Unlock()
			unpend()
		})
		adm.commit = func(ctx context.Context) error {
			if quota {
				ts.mu.Lock()
				defer ts.mu.Unlock()
			}
			err := m.store.InsertSandbox(ctx, sb)
			if !quota {
				ts.mu.Lock()
				defer ts.mu.Unlock()
			}
			if err != nil {
				return fmt.Errorf("create sandbox: %w", err)
			}
			unpend()
			*undo = append(*undo, func(ctx context.Context) {
				if derr := m.store.DeleteSandbox(ctx, sb.ID); derr != nil {
					m.log.Error("revert create: delete row", "sandbox_id", sb.ID, "err", derr)
				}
			})
			return nil
		}
		return adm, m.lock(sb.ID), nil
	}

	if !quota {
		unlockTenant()
	}
	if m.cfg.HostMemoryMB > 0 {
		// The budget sums every tenant's sandboxes: hold it across the
		// check and the insert.
		m.hostMu.Lock()
		defer m.hostMu.Unlock()
	}
	// A warm member's memory is already committed; only a cold create adds
	// to the host's load.
	if err := m.checkHost(ctx, sb.MemoryMB); err != nil {
		return adm, nil, err
	}
	unlock = m.lock(sb.ID)
	if err := m.store.InsertSandbox(ctx, sb); err != nil {
		unlock()
		return adm, nil, fmt.Errorf("create sandbox: %w", err)
	}
	*undo = append(*undo, func(ctx context.Context) {
		if derr := m.store.DeleteSandbox(ctx, sb.ID); derr != nil {
			m.log.Error("revert create: delete row", "sandbox_id", sb.ID, "err", derr)
		}
	})
	return adm, unlock, nil
}

// awaitCold waits for whichever comes first: a cold-create slot of the
// gate (w, held until released with gate.leave) or a member of key that a
// pool refill made ready.
func (m *Manager) awaitCold(ctx context.Context, t tenant.ID, key pool.Key) (*pool.Member, *gateWaiter, error) {
	w := m.gate.enter(t)
	for {
		select {
		case <-w.granted:
			return nil, w, nil
		default:
		}
		var ready <-chan struct{}
		if m.pool != nil {
			ready = m.pool.Ready() // before Take: a member readied in between wakes us
			if mb, ok := m.pool.Take(key); ok {
				m.gate.leave(w)
				return mb, nil, nil
			}
		}
		select {
		case <-w.granted:
			return nil, w, nil
		case <-ready:
		case <-ctx.Done():
			m.gate.leave(w)
			return nil, nil, ctx.Err()
		}
	}
}

// checkQuota refuses a create that would take tenant t over its live
// sandbox count or memory quota (ErrResourceExhausted: 429). ts.mu is held.
func (m *Manager) checkQuota(ctx context.Context, t tenant.ID, memoryMB int, ts *tenantState) error {
	eff := m.cfg.Settings.Get(t)
	if eff.MaxSandboxes > 0 {
		n, err := m.store.CountLive(ctx, t)
		if err != nil {
			return err
		}
		n += ts.pending
		if n >= eff.MaxSandboxes {
			return errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf(
				"sandbox quota reached: %d of %d live sandboxes (paused ones count); kill or let some end first",
				n, eff.MaxSandboxes))
		}
	}
	if eff.MaxMemoryMB > 0 {
		mem, err := m.store.SumMemoryMB(ctx, t)
		if err != nil {
			return err
		}
		mem += ts.pendingMB
		if mem+memoryMB > eff.MaxMemoryMB {
			return errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf(
				"memory quota reached: %d MiB live + %d MiB asked exceeds the quota of %d MiB", mem, memoryMB, eff.MaxMemoryMB))
		}
	}
	return nil
}

// checkHost is the host capacity guard (ErrUnavailable: 503 + Retry-After).
// Two independent checks:
//   - MemAvailable (from /proc/meminfo) minus HostReserveMB must cover the
//     new sandbox's memory limit. It follows real use, so idle sandboxes
//     with generous limits do not block creates; it refuses once the host
//     is actually short.
//   - With HostMemoryMB set, the memory limits of every live sandbox plus
//     warm members plus this one must fit that budget: no overcommit at all.
//     Sandboxes paused in memory count; those paused to disk hold none and
//     do not, until a resume admits them (admitResume).
func (m *Manager) checkHost(ctx context.Context, memoryMB int) error {
	if m.cfg.HostReserveMB > 0 {
		avail, err := m.memAvailable()
		if err != nil {
			m.log.Warn("host guard: read MemAvailable", "err", err)
		} else if avail-m.cfg.HostReserveMB < memoryMB {
			return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf(
				"host is short of memory: %d MiB available, %d MiB reserved, %d MiB asked; retry later",
				avail, m.cfg.HostReserveMB, memoryMB))
		}
	}
	if m.cfg.HostMemoryMB > 0 {
		live, err := m.store.ListLive(ctx)
		if err != nil {
			return err
		}
		used := 0
		for _, sb := range live {
			if _, ok := m.diskPaused.Load(sb.ID); ok && sb.State == store.StatePaused {
				continue // its memory was given back
			}
			used += sb.MemoryMB
		}
		if m.pool != nil {
			used += m.pool.ReservedMB()
		}
		used += int(m.pendingMB.Load())
		if used+memoryMB > m.cfg.HostMemoryMB {
			return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf(
				"host memory budget reached: %d MiB committed + %d MiB asked exceeds %d MiB; retry later",
				used, memoryMB, m.cfg.HostMemoryMB))
		}
	}
	return nil
}

func (m *Manager) memAvailable() (int, error) {
	if m.cfg.MemAvailable != nil {
		return m.cfg.MemAvailable()
	}
	return MemAvailableMB()
}

// MemAvailableMB reads MemAvailable from /proc/meminfo, in MiB.
func MemAvailableMB() (int, error) {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return parseMemAvailable(raw)
}

func parseMemAvailable(raw []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.Atoi(string(f[1]))
			if err != nil {
				return 0, fmt.Errorf("meminfo: %w", err)
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("meminfo: no MemAvailable")
}

// NewID mints a sandbox id (for warm pool members, whose id becomes the
// sandbox's on claim).
func NewID() string { return newID() }

// NewToken mints an envd access token.
func NewToken() string { return newToken() }
