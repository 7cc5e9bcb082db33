package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Pool is what the Admitter needs of the warm pools (package pool).
type Pool interface {
	// Claim takes a ready member of key, or reports a miss; it never waits.
	// background: the tenant has other creates in progress (it may not
	// take a spare pool's reserve).
	Claim(key pool.Key, background bool) (*pool.Member, bool)
	// Ready is closed the next time any member becomes ready.
	Ready() <-chan struct{}
	// Take takes a ready member of key after a missed Claim (a miss that
	// waited for a cold-create slot and got a refill first).
	Take(key pool.Key, background bool) (*pool.Member, bool)
	// ReservedMB is the memory of all members, for the host budget.
	ReservedMB() int
	// Refill wakes the refiller once a claimed member was handed over.
	Refill()
}

// Admitter decides whether a sandbox may come into being, and from where:
// the tenant's quota, the host's memory (MemAvailable and the budget), a
// warm member of the create's pool, or else a fair cold-create slot (see
// the package doc, "Cold create admission"). It owns the bookkeeping those
// decisions need: what each tenant has admitted without a row yet, the
// memory of claimed members, and which sandboxes hold no memory (paused to
// disk).
//
// Its contract with the lifecycle is Admit → Ticket, then Commit once the
// sandbox runs, and Release always; with the pools, AdmitMember, Seeds and
// MinWarm (pool.Admission). What
// decides between tenants lives here and in coldGate, so a different
// policy (a host-wide spare pool, work-conserving shares) replaces these
// two types and leaves Manager.Create alone.
type Admitter struct {
	store    *store.Store
	settings *Settings // nil: no quotas, no min_warm
	log      *slog.Logger

	hostMemoryMB, hostReserveMB int
	memAvailable                func() (int, error)
	memTotal                    func() (int, error)
	// diskInMemory: a sandbox's disk is a tmpfs (the local backend), so
	// its pages are RAM and its size counts with its memory everywhere
	// memory is counted (chargeMB).
	diskInMemory bool

	// lock takes a sandbox's lifecycle lock (the Manager's): a ticket holds
	// it from before its row is visible until Release.
	lock func(id string) (unlock func())
	// defaultKey is tenant t's default pool (template "base", default
	// resources, internet allowed: an SDK's plain Sandbox.create()).
	defaultKey func(t tenant.ID) pool.Key
	// slowStart reports whether template has a start command to run
	// before its sandboxes are ready.
	slowStart func(template string) bool

	// spare: the host-wide spare pools (spare.go); nil: none.
	spare *spares

	tenants sync.Map   // tenant id -> *tenantState
	hostMu  sync.Mutex // host budget check + insert, when hostMemoryMB > 0
	pool    Pool       // nil: every create is cold
	gate    *coldGate  // nil: cold creates are not bounded
	// pendingMB is the memory of claimed members whose rows are not in
	// yet, for the host budget.
	pendingMB atomic.Int64
	// diskPaused holds the ids of sandboxes paused to disk (by this
	// process, or found so by Reconcile in the backend's List): they hold
	// no memory, so the host budget leaves them out until a resume admits
	// them again.
	diskPaused sync.Map // sandbox id -> struct{}
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
	// inflight counts the tenant's tickets not yet released, and
	// concurrentAt is when it last had two: a create of a tenant with
	// others in progress, or that had some within concurrentMemory, is in
	// the background of its tenant's flood (it may not take a spare pool's
	// reserve).
	inflight     int
	concurrentAt time.Time
}

// concurrentMemory is how long a tenant that had concurrent creates counts
// as flooding: its clients' destroys and think time leave gaps where one
// of its creates runs alone, and that one is not a lone user's.
const concurrentMemory = time.Second

// enterLocked counts a create of the tenant in and reports whether it is
// in the background of others; ts.mu is held.
func (ts *tenantState) enterLocked(now time.Time) (background bool) {
	ts.inflight++
	if ts.inflight > 1 {
		ts.concurrentAt = now
	}
	return ts.inflight > 1 || (!ts.concurrentAt.IsZero() && now.Sub(ts.concurrentAt) < concurrentMemory)
}

func (a *Admitter) tenant(t tenant.ID) *tenantState {
	v, _ := a.tenants.LoadOrStore(t, &tenantState{})
	return v.(*tenantState)
}

// UsePool makes creates claim warm members from p first. Call it before
// serving.
func (a *Admitter) UsePool(p Pool) { a.pool = p }

// AdmitRequest is one create asking for admission.
type AdmitRequest struct {
	// Sandbox is the row to be: its tenant and memory are what is
	// admitted. A warm member's id (and, for a secure sandbox, its access
	// token) replaces the minted ones.
	Sandbox *store.Sandbox
	// Key is the pool the create claims from.
	Key pool.Key
	// Cold: the create needs a sandbox of its own, never a warm member:
	// it mounts volumes, or it is a fork (a copy of another sandbox's
	// files made by the backend's create).
	Cold bool
}

// Ticket is one admitted create. It holds the sandbox's lock, its share
// of the quota and host budget, and for a cold create its slot and its row
// (as "creating"). The create ends it with Commit (the sandbox runs) and
// always with Release, which gives back whatever was not committed.
// A Ticket belongs to one goroutine.
type Ticket struct {
	a     *Admitter
	sb    *store.Sandbox
	ts    *tenantState
	quota bool // the tenant had a quota at admission
	// cleanupCtx outlives the request: a cancelled create still cleans up.
	cleanupCtx context.Context

	member *pool.Member
	waited time.Duration
	// entered: it counts in ts.inflight (tenantState.enterLocked).
	entered bool
	slot    *gateWaiter // the cold-create slot held; nil when none or released
	// pending: the claimed member counts in ts and pendingMB until its row
	// is in.
	pending bool
	// rowIn: Admit inserted the cold create's row, which Release deletes
	// unless committed.
	rowIn     bool
	committed bool
	refilled  bool // Release told the pool to replace the member
	unlock    func()
}

// Member is the warm member claimed, nil for a cold create.
func (tk *Ticket) Member() *pool.Member { return tk.member }

// Waited is how long the create waited for a slot or a refill.
func (tk *Ticket) Waited() time.Duration { return tk.waited }

// ServedFrom says where the sandbox comes from: "pool" (the tenant's warm
// pool), "spare" (the host-wide spare pool) or "cold".
func (tk *Ticket) ServedFrom() string {
	if tk.member != nil {
		if tk.member.Key.IsSpare() {
			return "spare"
		}
		return "pool"
	}
	return "cold"
}

// Background says the cold create is one of a flood of its tenant's:
// when its slot was granted, the tenant held another or had more creates
// waiting (runtime.Spec.Background). A lone create, and one that claims,
// is not.
func (tk *Ticket) Background() bool { return tk.slot != nil && tk.slot.background }

// ReleaseSlot gives the cold-create slot back: it bounds the backend's
// work, not the rest of the create. Safe to call more than once.
func (tk *Ticket) ReleaseSlot() {
	if tk.slot != nil {
		tk.a.gate.leave(tk.slot)
		tk.slot = nil
	}
}

// Commit records the sandbox as running: a cold create's row is updated,
// a member's row goes in (in one write, quota-safe: only then does it stop
// counting as pending). The row's state is the caller's.
func (tk *Ticket) Commit(ctx context.Context) error {
	if tk.member == nil {
		if err := tk.a.store.UpdateSandbox(ctx, tk.sb); err != nil {
			return fmt.Errorf("create sandbox: %w", err)
		}
		tk.committed = true
		return nil
	}
	// With a quota, the insert happens under the tenant's lock, so the
	// quota never sees the row and its pending count both, or neither.
	if tk.quota {
		tk.ts.mu.Lock()
		defer tk.ts.mu.Unlock()
	}
	err := tk.a.store.InsertSandbox(ctx, tk.sb)
	if !tk.quota {
		tk.ts.mu.Lock()
		defer tk.ts.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	tk.unpendLocked()
	tk.committed = true
	return nil
}

// Release ends the ticket: the slot, and unless committed the pending
// counts and the cold create's row, then the sandbox's lock. Call it once
// the create's own undos (the backend's sandbox) have run.
func (tk *Ticket) Release() {
	tk.ReleaseSlot()
	if tk.entered {
		tk.entered = false
		tk.ts.mu.Lock()
		tk.ts.inflight--
		tk.ts.mu.Unlock()
	}
	if tk.member != nil && !tk.refilled {
		tk.refilled = true
		tk.a.pool.Refill() // its claim left that to the end of the create
	}
	if !tk.committed {
		if tk.pending {
			tk.ts.mu.Lock()
			tk.unpendLocked()
			tk.ts.mu.Unlock()
		}
		if tk.rowIn {
			if err := tk.a.store.DeleteSandbox(tk.cleanupCtx, tk.sb.ID); err != nil {
				tk.a.log.Error("revert create: delete row", "sandbox_id", tk.sb.ID, "err", err)
			}
			tk.rowIn = false
		}
	}
	if tk.unlock != nil {
		tk.unlock()
		tk.unlock = nil
	}
}

// pend counts a claimed member until its row is in: for the tenant's
// quota, and for the host budget (it left the pool's reserve when it was
// claimed). ts.mu is held.
func (tk *Ticket) pendLocked() {
	tk.pending = true
	tk.ts.pending++
	tk.ts.pendingMB += tk.a.sandboxMB(tk.sb)
	tk.a.pendingMB.Add(int64(tk.a.sandboxMB(tk.sb)))
}

// unpendLocked undoes pendLocked, once. ts.mu is held.
func (tk *Ticket) unpendLocked() {
	if !tk.pending {
		return
	}
	tk.pending = false
	tk.ts.pending--
	tk.ts.pendingMB -= tk.a.sandboxMB(tk.sb)
	tk.a.pendingMB.Add(-int64(tk.a.sandboxMB(tk.sb)))
}

// Admit checks the tenant's quota, then claims a warm member or waits for
// whichever comes first: a cold-create slot or a refill of the pool.
//
// A cold create's row goes in here, as "creating", before the backend is
// asked: if sandboxd dies meanwhile, Reconcile finds the row and destroys
// whatever the backend made of it. A member's row goes in only at Commit,
// once its envd took /init, in one write: the member already exists, and
// Reconcile destroys backend sandboxes without a row; this keeps a pool
// hit at one store write.
//
// For a tenant with a quota, the check and the insert (or the pending
// count standing in for the row until Commit) happen under the tenant's
// lock, so two concurrent creates cannot both pass the last free slot. The
// wait never holds it.
func (a *Admitter) Admit(ctx context.Context, req AdmitRequest) (_ *Ticket, err error) {
	sb := req.Sandbox
	eff := a.settings.Get(sb.Tenant)
	tk := &Ticket{
		a: a, sb: sb, ts: a.tenant(sb.Tenant),
		quota:      eff.MaxSandboxes > 0 || eff.MaxMemoryMB > 0,
		cleanupCtx: context.WithoutCancel(ctx),
	}
	r := revert.New()
	defer r.Fail()
	r.Add(tk.Release)

	ts := tk.ts
	ts.mu.Lock()
	locked := true
	unlockTenant := func() {
		if locked {
			locked = false
			ts.mu.Unlock()
		}
	}
	defer unlockTenant()
	charge := a.sandboxMB(sb)
	if err := a.checkQuota(ctx, sb.Tenant, charge, ts); err != nil {
		return nil, err
	}
	// background: the tenant has other creates in progress, so this one
	// may not take a spare pool's reserve.
	background := ts.enterLocked(time.Now())
	tk.entered = true
	if a.pool != nil && !req.Cold {
		tk.member, _ = a.pool.Claim(req.Key, background)
	}
	if tk.member == nil && a.gate != nil {
		if err := a.checkHost(ctx, charge); err != nil {
			return nil, err // short of memory: say so now, not after the wait
		}
		ts.pending++
		ts.pendingMB += charge
		unlockTenant()
		t0 := time.Now()
		tk.member, tk.slot, err = a.awaitCold(ctx, sb.Tenant, req.Key, req.Cold, background)
		tk.waited = time.Since(t0)
		ts.mu.Lock()
		locked = true
		ts.pending--
		ts.pendingMB -= charge
		if err != nil {
			return nil, fmt.Errorf("create sandbox: waiting for a cold-create slot: %w", err)
		}
	}
	if mb := tk.member; mb != nil {
		// The member's id becomes the sandbox's, and its access token
		// (already known to the backend's tunnel) the envd token.
		sb.ID = mb.ID
		if sb.Secure {
			sb.EnvdAccessToken = mb.AccessToken
		}
		tk.pendLocked()
		tk.unlock = a.lock(sb.ID)
		r.Success()
		return tk, nil
	}
	if !tk.quota {
		unlockTenant()
	}
	if err := a.insertCold(ctx, tk); err != nil {
		return nil, err
	}
	r.Success()
	return tk, nil
}

// insertCold passes a cold create through the host guard and inserts its
// row, under the sandbox's lock.
func (a *Admitter) insertCold(ctx context.Context, tk *Ticket) error {
	if a.hostMemoryMB > 0 {
		// The budget sums every tenant's sandboxes: hold it across the
		// check and the insert.
		a.hostMu.Lock()
		defer a.hostMu.Unlock()
	}
	// A warm member's memory is already committed; only a cold create adds
	// to the host's load.
	if err := a.checkHost(ctx, a.sandboxMB(tk.sb)); err != nil {
		return err
	}
	tk.unlock = a.lock(tk.sb.ID)
	if err := a.store.InsertSandbox(ctx, tk.sb); err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	tk.rowIn = true
	return nil
}

// awaitCold waits for whichever comes first: a cold-create slot of the
// gate (w, held until released with gate.leave) or a member of key that a
// pool refill made ready.
func (a *Admitter) awaitCold(ctx context.Context, t tenant.ID, key pool.Key, cold, background bool) (*pool.Member, *gateWaiter, error) {
	w := a.gate.enter(t)
	if w == nil {
		return nil, nil, errdefs.New(errdefs.ErrRateLimited, fmt.Sprintf(
			"the host's create queue is full (%d cold creates in flight, this tenant's share of the %d that may wait is taken); retry later",
			a.gate.slots, a.gate.queueMax))
	}
	for {
		select {
		case <-w.granted:
			return nil, w, nil
		default:
		}
		var ready <-chan struct{}
		if a.pool != nil && !cold {
			ready = a.pool.Ready() // before Take: a member readied in between wakes us
			if mb, ok := a.pool.Take(key, background); ok {
				a.gate.leave(w)
				return mb, nil, nil
			}
		}
		select {
		case <-w.granted:
			return nil, w, nil
		case <-ready:
		case <-ctx.Done():
			a.gate.leave(w)
			return nil, nil, ctx.Err()
		}
	}
}

// Seeds returns the default pool of every tenant whose min_warm is above
// zero (template "base", default resources, internet allowed: what an SDK's
// plain Sandbox.create() asks for), and the spare pools the operator gave a
// floor whose templates are ready.
func (a *Admitter) Seeds() []pool.Key {
	var keys []pool.Key
	if a.spare != nil {
		a.spare.refresh(context.Background())
		keys = a.spare.seeds()
	}
	if a.settings == nil {
		return keys
	}
	for _, t := range a.settings.Tenants() {
		if a.settings.Get(t).MinWarm > 0 {
			keys = append(keys, a.defaultKey(t))
		}
	}
	return keys
}

// MinWarm is the min_warm of pool key: its tenant's setting, or a spare
// pool's floor; and at least one for a built template with a start command
// (in the spare pool when one serves the template).
func (a *Admitter) MinWarm(key pool.Key) int {
	n := 0
	if key.IsSpare() {
		n = a.spare.floor(key)
	} else {
		n = a.settings.Get(key.Tenant).MinWarm
		if _, spared := a.SpareKey(key); spared {
			return n
		}
	}
	if a.slowStart != nil && a.slowStart(key.Template) {
		// What a warm member hides is the template's start command:
		// keep one of a template in use even without min_warm.
		n = max(n, 1)
	}
	return n
}

// AdmitMember says whether the pool may create one more member of key, when
// key's tenant already has members warm members of memoryMB in total: live
// sandboxes plus members stay within the tenant's quota, and the host guard
// holds.
func (a *Admitter) AdmitMember(ctx context.Context, key pool.Key, members, memoryMB int) error {
	if key.IsSpare() {
		// A spare member is in no tenant's quota until claimed (the claim
		// passes the quota like any create); it counts in the host's.
		return a.checkHost(ctx, a.MemberMB(key))
	}
	// Under the tenant's lock: a claim and its row land together, so the
	// count never misses a sandbox whose member was just claimed.
	ts := a.tenant(key.Tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	eff := a.settings.Get(key.Tenant)
	if eff.MaxSandboxes > 0 {
		n, err := a.store.CountLive(ctx, key.Tenant)
		if err != nil {
			return err
		}
		n += ts.pending // claimed members and waiting creates without a row yet
		if n+members+1 > eff.MaxSandboxes {
			return fmt.Errorf("tenant quota: %d live + %d warm of max %d sandboxes", n, members, eff.MaxSandboxes)
		}
	}
	if eff.MaxMemoryMB > 0 {
		mem, err := a.tenantMB(ctx, key.Tenant)
		if err != nil {
			return err
		}
		mem += ts.pendingMB
		if mem+memoryMB+a.MemberMB(key) > eff.MaxMemoryMB {
			return fmt.Errorf("tenant quota: %d MiB live + %d MiB warm of max %d MiB", mem, memoryMB, eff.MaxMemoryMB)
		}
	}
	return a.checkHost(ctx, a.MemberMB(key))
}

// AdmitResume is the host guard for sandbox sb coming back from disk: it
// passes the same host checks as a create (ErrUnavailable: 503 +
// Retry-After), and from then on counts in the host budget. Its tenant's
// quota counted it all along (paused sandboxes count).
func (a *Admitter) AdmitResume(ctx context.Context, sb *store.Sandbox) error {
	if a.hostMemoryMB > 0 {
		a.hostMu.Lock()
		defer a.hostMu.Unlock()
	}
	id := sb.ID
	if err := a.checkHost(ctx, a.sandboxMB(sb)); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	a.diskPaused.Delete(id)
	return nil
}

// pausedToDisk records that id holds no memory until a resume admits it.
func (a *Admitter) pausedToDisk(id string) { a.diskPaused.Store(id, struct{}{}) }

// onDisk reports whether id is paused to disk.
func (a *Admitter) onDisk(id string) bool {
	_, ok := a.diskPaused.Load(id)
	return ok
}

// forget drops what the Admitter knows of a sandbox that is gone.
func (a *Admitter) forget(id string) { a.diskPaused.Delete(id) }

// checkQuota refuses a create that would take tenant t over its live
// sandbox count or memory quota (ErrResourceExhausted: 429). ts.mu is held.
func (a *Admitter) checkQuota(ctx context.Context, t tenant.ID, memoryMB int, ts *tenantState) error {
	eff := a.settings.Get(t)
	if eff.MaxSandboxes > 0 {
		n, err := a.store.CountLive(ctx, t)
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
		mem, err := a.tenantMB(ctx, t)
		if err != nil {
			return err
		}
		mem += ts.pendingMB
		if mem+memoryMB > eff.MaxMemoryMB {
			return errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf(
				"memory quota reached: %d MiB live + %d MiB asked exceeds the quota of %d MiB%s", mem, memoryMB, eff.MaxMemoryMB, a.diskNote()))
		}
	}
	return nil
}

// Room says whether tenant sb.Tenant's quotas leave room for one more
// sandbox of sb's size (ErrResourceExhausted when not), admitting nothing.
func (a *Admitter) Room(ctx context.Context, sb *store.Sandbox) error {
	ts := a.tenant(sb.Tenant)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return a.checkQuota(ctx, sb.Tenant, a.sandboxMB(sb), ts)
}

// checkHost is the host capacity guard (ErrUnavailable: 503 + Retry-After).
// Two independent checks:
//   - MemAvailable (from /proc/meminfo) minus the host reserve must cover
//     the new sandbox's memory limit. It follows real use, so idle
//     sandboxes with generous limits do not block creates; it refuses once
//     the host is actually short.
//   - With a host memory budget, the memory limits of every live sandbox
//     plus warm members plus this one must fit it: no overcommit at all.
//     Sandboxes paused in memory count; those paused to disk hold none and
//     do not, until a resume admits them (AdmitResume).
func (a *Admitter) checkHost(ctx context.Context, memoryMB int) error {
	if a.hostReserveMB > 0 {
		avail, err := a.memAvailable()
		if err != nil {
			a.log.Warn("host guard: read MemAvailable", "err", err)
		} else if avail-a.hostReserveMB < memoryMB {
			return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf(
				"host is short of memory: %d MiB available, %d MiB reserved, %d MiB asked%s; retry later",
				avail, a.hostReserveMB, memoryMB, a.diskNote()))
		}
	}
	if a.hostMemoryMB > 0 {
		used, err := a.committedMB(ctx)
		if err != nil {
			return err
		}
		if used+memoryMB > a.hostMemoryMB {
			return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf(
				"host memory budget reached: %d MiB committed + %d MiB asked exceeds %d MiB%s; retry later",
				used, memoryMB, a.hostMemoryMB, a.diskNote()))
		}
	}
	return nil
}

// committedMB is what the host budget counts as taken: the memory of every
// live sandbox (but those paused to disk), of the warm members, and of the
// creates admitted but not yet in the store.
func (a *Admitter) committedMB(ctx context.Context) (int, error) {
	live, err := a.store.ListLive(ctx)
	if err != nil {
		return 0, err
	}
	used := 0
	for _, sb := range live {
		if a.onDisk(sb.ID) && sb.State == store.StatePaused {
			continue // its memory was given back
		}
		used += a.sandboxMB(&sb)
	}
	if a.pool != nil {
		used += a.pool.ReservedMB()
	}
	return used + int(a.pendingMB.Load()), nil
}

// HostMemory is the host's memory as admission sees it, in MiB.
type HostMemory struct {
	// Committed is what the budget counts as taken (committedMB).
	Committed int
	// Budget is the host budget (--host-memory-mb); 0: none.
	Budget int
	// Available is the kernel's MemAvailable; -1 when unread.
	Available int
	// Reserve is what creates must leave of Available (--host-reserve-mb).
	Reserve int
}

// HostMemory reports the host's memory as admission sees it, for the
// metrics.
func (m *Manager) HostMemory(ctx context.Context) (HostMemory, error) {
	a := m.adm
	used, err := a.committedMB(ctx)
	if err != nil {
		return HostMemory{}, err
	}
	h := HostMemory{Committed: used, Budget: a.hostMemoryMB, Available: -1, Reserve: a.hostReserveMB}
	if a.memAvailable != nil {
		if avail, err := a.memAvailable(); err == nil {
			h.Available = avail
		}
	}
	return h, nil
}

// chargeMB is what a sandbox of memoryMB and diskMB takes of the host's
// RAM, and so of every memory budget: its memory limit, plus its disk when
// the disk is a tmpfs (its pages are RAM, charged to the sandbox's cgroup).
func (a *Admitter) chargeMB(memoryMB, diskMB int) int {
	if a.diskInMemory {
		return memoryMB + diskMB
	}
	return memoryMB
}

func (a *Admitter) sandboxMB(sb *store.Sandbox) int { return a.chargeMB(sb.MemoryMB, sb.DiskMB) }

// MemberMB is what a sandbox (or warm member) of key takes of the host's
// memory: pool.Config.MemberMB.
func (a *Admitter) MemberMB(k pool.Key) int { return a.chargeMB(k.MemoryMB, k.DiskMB) }

// diskNote tells a refused client why its disk counts as memory.
func (a *Admitter) diskNote() string {
	if a.diskInMemory {
		return " (memory and disk: a sandbox's disk lives in RAM)"
	}
	return ""
}

// tenantMB is the charge (chargeMB) of tenant t's live sandboxes, paused
// and in-progress states included.
func (a *Admitter) tenantMB(ctx context.Context, t tenant.ID) (int, error) {
	return a.store.SumMemoryMB(ctx, t, a.diskInMemory)
}

// checkFits refuses (ErrInvalidArgument: 400) a create of key that no
// amount of waiting could admit: its charge alone is above the tenant's
// memory quota, the host's memory budget, or the host's RAM less the
// reserve. Those would otherwise answer 429 or 503, which clients retry
// forever.
func (a *Admitter) checkFits(key pool.Key) error {
	charge := a.MemberMB(key)
	asked := fmt.Sprintf("%d MiB memory", key.MemoryMB)
	if a.diskInMemory {
		asked = fmt.Sprintf("%d MiB memory + %d MiB disk (a sandbox's disk lives in RAM)", key.MemoryMB, key.DiskMB)
	}
	refuse := func(limit string, mb int) error {
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(
			"sandbox too large: %s exceeds %s of %d MiB", asked, limit, mb))
	}
	if q := a.settings.Get(key.Tenant).MaxMemoryMB; q > 0 && charge > q {
		return refuse("the tenant's memory quota", q)
	}
	if a.hostMemoryMB > 0 && charge > a.hostMemoryMB {
		return refuse("the host's sandbox memory budget", a.hostMemoryMB)
	}
	total, err := a.memTotal()
	if err != nil {
		a.log.Warn("host guard: read MemTotal", "err", err)
		return nil
	}
	if room := total - a.hostReserveMB; charge > room {
		return refuse("the host's memory (MemTotal less the reserve)", room)
	}
	return nil
}
