package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Pool is what the Manager needs of the warm pools (package pool).
type Pool interface {
	// Claim takes a ready member of key, or reports a miss; it never waits.
	Claim(key pool.Key) (*pool.Member, bool)
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
	resp, err := m.envdDo(ctx, id, http.MethodGet, "/health", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("envd /health: %s", resp.Status)
	}
	return nil
}

// AdmitMember says whether the pool may create one more member of key, when
// key's tenant already has members warm members of memoryMB in total: live
// sandboxes plus members stay within the tenant's quota, and the host guard
// holds.
func (m *Manager) AdmitMember(ctx context.Context, key pool.Key, members, memoryMB int) error {
	// Under the tenant's lock: a claim and its row land together, so the
	// count never misses a sandbox whose member was just claimed.
	unlock := m.lockTenant(key.Tenant)
	defer unlock()
	eff := m.cfg.Settings.Get(key.Tenant)
	if eff.MaxSandboxes > 0 {
		n, err := m.store.CountLive(ctx, key.Tenant)
		if err != nil {
			return err
		}
		if n+members+1 > eff.MaxSandboxes {
			return fmt.Errorf("tenant quota: %d live + %d warm of max %d sandboxes", n, members, eff.MaxSandboxes)
		}
	}
	if eff.MaxMemoryMB > 0 {
		mem, err := m.store.SumMemoryMB(ctx, key.Tenant)
		if err != nil {
			return err
		}
		if mem+memoryMB+key.MemoryMB > eff.MaxMemoryMB {
			return fmt.Errorf("tenant quota: %d MiB live + %d MiB warm of max %d MiB", mem, memoryMB, eff.MaxMemoryMB)
		}
	}
	return m.checkHost(ctx, key.MemoryMB)
}

func (m *Manager) lockTenant(t tenant.ID) func() {
	v, _ := m.tenantLocks.LoadOrStore(t, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// admit checks the tenant's quotas, claims a warm member (or checks the
// host guard for a cold create), takes the sandbox's lock and inserts its
// row as "creating", all under the tenant's lock. It registers the undos of
// what it made in *undo; unlock releases the sandbox's lock.
func (m *Manager) admit(ctx context.Context, sb *store.Sandbox, req CreateRequest, undo *[]func(context.Context)) (member *pool.Member, unlock func(), err error) {
	unlockTenant := m.lockTenant(sb.Tenant)
	defer unlockTenant()
	if err := m.checkQuota(ctx, sb.Tenant, sb.MemoryMB); err != nil {
		return nil, nil, err
	}
	if m.pool != nil {
		member, _ = m.pool.Claim(m.PoolKey(sb.Tenant, req))
	}
	if member != nil {
		// The member's id becomes the sandbox's, and its access token
		// (already known to the backend's tunnel) the envd token.
		sb.ID = member.ID
		if sb.Secure {
			sb.EnvdAccessToken = member.AccessToken
		}
		*undo = append(*undo, func(ctx context.Context) {
			if derr := m.backend.Destroy(ctx, sb.ID); derr != nil {
				m.log.Error("revert create: destroy warm member", "sandbox_id", sb.ID, "err", derr)
			}
		})
	}
	if m.cfg.HostMemoryMB > 0 {
		// The budget sums every tenant's sandboxes: hold it across the
		// check and the insert.
		m.hostMu.Lock()
		defer m.hostMu.Unlock()
	}
	if member == nil {
		// A warm member's memory is already committed; only a cold create
		// adds to the host's load.
		if err := m.checkHost(ctx, sb.MemoryMB); err != nil {
			return nil, nil, err
		}
	}
	unlock = m.lock(sb.ID)
	// The row goes in first, as "creating": if sandboxd dies before the
	// backend call returns, Reconcile finds the row and destroys whatever
	// the backend made of it.
	if err := m.store.InsertSandbox(ctx, sb); err != nil {
		unlock()
		return nil, nil, fmt.Errorf("create sandbox: %w", err)
	}
	*undo = append(*undo, func(ctx context.Context) {
		if derr := m.store.DeleteSandbox(ctx, sb.ID); derr != nil {
			m.log.Error("revert create: delete row", "sandbox_id", sb.ID, "err", derr)
		}
	})
	return member, unlock, nil
}

// checkQuota refuses a create that would take tenant t over its live
// sandbox count or memory quota (ErrResourceExhausted: 429).
func (m *Manager) checkQuota(ctx context.Context, t tenant.ID, memoryMB int) error {
	eff := m.cfg.Settings.Get(t)
	if eff.MaxSandboxes > 0 {
		n, err := m.store.CountLive(ctx, t)
		if err != nil {
			return err
		}
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
//   - With HostMemoryMB set, the memory limits of every live sandboxes plus
//     warm members plus this one must fit that budget: no overcommit at all.
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
			used += sb.MemoryMB
		}
		if m.pool != nil {
			used += m.pool.ReservedMB()
		}
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
