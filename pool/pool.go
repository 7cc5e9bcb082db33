// Package pool keeps warm sandboxes: backend sandboxes created ahead of
// demand, one pool per (tenant, template, resource shape), so that a create
// claims a ready sandbox instead of booting one.
//
// Besides the tenants' pools there is a host-wide spare pool per (template,
// shape): a Key whose Tenant is empty. Its members are never-used and
// tenant-neutral (a random id and access token, the template, the shape;
// nothing of any tenant), so handing one to any tenant leaks nothing; all
// that is a tenant's (env, token, user, metadata, timeout, egress policy) is
// applied at claim, as for a tenant's own member. A claim tries the
// tenant's pool (its min_warm reservation) first, then the spare pool, and
// only then misses. With spare pools (Config.Spare), the adaptive part of
// the sizing moves to them: they follow the host-wide claim rate, and a
// tenant's pool of a spare-eligible key keeps min_warm only.
//
// Rules, each against a failure other warm pools are known for:
//   - A member is claimable only once the backend's Create has returned and
//     its envd answered /health (never hand out an unready member).
//   - A member ready for Recheck is checked again (/health) by the refill
//     loop, out of the pool meanwhile so that no claim can take it; one
//     that fails is destroyed and replaced, never handed out (an envd dies
//     while warm: killed, out of memory). Between two checks, the claim's
//     own /init is the check: package sandbox then falls back to a cold
//     create.
//   - A claim removes the member from the pool for good: it becomes the
//     caller's sandbox, which destroys it when it ends (never reuse).
//   - A claim carries no per-user data: the caller hands env vars, access
//     token and default user to envd's /init after the claim, so per-user
//     data never forces a cold start. The member's access token is minted
//     at warm time, so the backend's port tunnel already knows it.
//   - Refill is event-driven: a miss wakes the refiller at once, a hit once
//     the claimer has handed the member over (Refill); a slow tick only
//     trims, forgets and retries after failures.
//   - Members have no store row and no end time, so the TTL sweeper never
//     sees them; sandboxd's start-up Reconcile destroys members a previous
//     process left (backend sandboxes without a row), and Run drains the
//     pool when it ends.
//   - Once two tenants have claimed from a spare pool within spareShared,
//     its last SpareReserve members are for lone creates (a tenant's only
//     create in progress): a claim in the background of its tenant's others
//     misses there instead. A tenant's flood would otherwise take every
//     member the moment it is ready, and another tenant's single create,
//     served warm in a millisecond or two on a quiet host, would wait for a
//     cold start behind the flood, 10–20 times as long. The flood loses
//     nothing it needs: once the pool is down to the reserve it creates
//     cold anyway. A host with one tenant keeps no reserve: its bursts may
//     take every member (work-conserving).
//   - An empty pool is a miss, counted and reported at once: Claim never
//     waits. A caller that cannot start a cold create right away (package
//     sandbox bounds them) may wait on Ready and Take a member that becomes
//     ready meanwhile; such a create is served_from=pool, and the member
//     counts as Waited, not as a hit. Everything else is served_from=cold.
//
// Sizing: target = max(min_warm, round(claim rate × Lead)), where the claim
// rate is an exponentially weighted moving average of claims (hits and
// misses) per second with half-life HalfLife, capped at MaxPerPool and by
// Admission (the tenant's quota and the host's capacity). A pool without claims
// for IdleAfter drops its adaptive part and shrinks to min_warm; a pool that
// is not a tenant's default pool (Seeds) is forgotten after ForgetAfter
// without claims.
package pool

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/tenant"
)

// Key names a pool: members of one key are interchangeable. A Key with an
// empty Tenant is a spare pool, shared by every tenant.
type Key struct {
	Tenant        tenant.ID
	Template      string
	CPUCount      int
	MemoryMB      int
	DiskMB        int
	AllowInternet bool
}

// IsSpare reports whether k is a host-wide spare pool.
func (k Key) IsSpare() bool { return k.Tenant == "" }

// Member is a warm sandbox. After Claim it belongs to the caller.
type Member struct {
	// ID is the backend sandbox's id; it becomes the sandbox id.
	ID string
	// AccessToken is the token the backend was created with (its port
	// tunnel sends it); the caller gives it to envd if the sandbox is
	// secure.
	AccessToken string
	Key         Key
	ReadyAt     time.Time

	// checkedAt is when its envd last answered /health.
	checkedAt time.Time
}

// Admission is what the pools need of sandboxd's admission control
// (package sandbox's Admitter).
type Admission interface {
	// Seeds returns the pools that exist even before their first claim
	// (tenants' default pools when their min_warm is above zero).
	Seeds() []Key
	// MinWarm is tenant t's min_warm setting.
	MinWarm(key Key) int
	// AdmitMember says whether one more member of key may be created, given
	// that the key's tenant already has members members of memoryMB in
	// total across its pools: the tenant's quota and the host's capacity.
	AdmitMember(ctx context.Context, key Key, members, memoryMB int) error
}

// admitAll is the Admission of Pools configured without one.
type admitAll struct{}

func (admitAll) Seeds() []Key                                     { return nil }
func (admitAll) MinWarm(Key) int                                  { return 0 }
func (admitAll) AdmitMember(context.Context, Key, int, int) error { return nil }

// reachabilityReporter is what a backend whose sandboxes can be cut off
// from sandboxd while they live (the Incus backend on a cluster) tells of
// one: false while it cannot be reached. Called with the pools' lock held.
type reachabilityReporter interface {
	Reachable(id string) bool
}

// Config configures Pools.
type Config struct {
	Backend runtime.Backend
	// Health checks a new member's envd (GET /health over the backend's
	// private channel). Required.
	Health func(ctx context.Context, id string) error
	// Prepare, when set, readies a healthy new member of template before
	// it can be claimed (a built template's start command, until ready).
	Prepare func(ctx context.Context, id, template string) error
	// Admission decides which pools exist, how warm they are kept and
	// whether one more member fits. nil: no seeds, no min_warm, every
	// member admitted.
	Admission Admission
	// MemberMB is what one member of key takes of the host's memory, for
	// the quota and the budget (its disk too where that is RAM). nil:
	// key.MemoryMB.
	MemberMB func(key Key) int
	// Spare maps a tenant's key to the spare pool that may serve its
	// claims (the key without its tenant), or reports false for a key no
	// spare pool serves (a tenant's private template). nil: no spare pools.
	Spare func(key Key) (Key, bool)
	// Destroyed, when set, is told of every member the pools destroyed,
	// after the backend's Destroy (sandboxd's Manager drops its kept
	// connection to the member's envd).
	Destroyed func(id string)
	// NewID and NewToken mint member ids and access tokens.
	NewID, NewToken func() string
	Log             *slog.Logger

	// Lead is how many seconds of claims to keep warm beyond min_warm
	// (adaptive sizing); 0 means 5 s, negative disables the adaptive part.
	Lead time.Duration
	// HalfLife of the claim-rate average; default 1 min.
	HalfLife time.Duration
	// IdleAfter without claims a pool shrinks to min_warm; default 5 min.
	IdleAfter time.Duration
	// ForgetAfter without claims a non-seed pool is removed; default 1 h.
	ForgetAfter time.Duration
	// MaxPerPool caps a tenant's pool's target; default 64.
	MaxPerPool int
	// SpareReserve is how many of a shared spare pool's ready members
	// only lone claims may take (Claim's background false); default 2,
	// negative none. It is what another tenant's creates need while one
	// tenant floods: one at hand, one being refilled.
	SpareReserve int
	// MaxSpare caps a spare pool's target, floor and claim rate alike;
	// default MaxPerPool. A spare pool serves every tenant, so the cap
	// meant for one tenant's pool would bound a burst of all of them.
	MaxSpare int
	// Parallel bounds concurrent member creates across all pools; default 2.
	Parallel int
	// Tick is the period of the trimming/retry pass; default 1 s.
	Tick time.Duration
	// Recheck is how long a member stays ready before its envd is checked
	// again (Health); default 30 s, negative disables. The pass runs at
	// least this often, whatever Tick.
	Recheck time.Duration
}

// A recheck's bounds: a healthy envd answers /health at once over the
// backend's channel, so a second means it is gone or wedged; and a few at
// a time, so that a pool full of due members is not all out at once.
const (
	recheckTimeout  = time.Second
	recheckParallel = 4
)

// Stat describes one pool, for metrics.
type Stat struct {
	Key      Key
	Ready    int
	Starting int
	Target   int
}

// Count is the cumulative claims of a (tenant, template), for metrics. The
// Count of a spare pool (empty Tenant) counts the claims that reached it:
// Hits it served, Misses it could not.
type Count struct {
	Tenant   tenant.ID
	Template string
	Hits     uint64
	// Spare counts the tenant's claims the spare pool served (its own pool
	// was empty); they are in neither Hits nor Misses.
	Spare  uint64
	Misses uint64
	// Waited counts members handed out by Take: a miss that waited, and
	// got a refill before it could start a cold create.
	Waited uint64
}

// Pools is every warm pool of a sandboxd. Its methods are safe for
// concurrent use.
type Pools struct {
	cfg Config
	log *slog.Logger
	// reachable reports whether a member's sandbox can be reached now:
	// the backend's word where it has one (a cluster member whose relay
	// stopped answering), else always. Claims skip the others, so that
	// they are served at once by members elsewhere.
	reachable func(id string) bool

	kick chan struct{}
	wg   sync.WaitGroup // member creates and destroys in flight

	// readyCh is closed (and replaced) whenever a member becomes ready, so
	// waiters of any key look again; nil once closed for good.
	readyCh chan struct{}

	mu       sync.Mutex
	pools    map[Key]*pool
	counts   map[countKey]*Count
	starting int // creates in flight, all pools
	checking int // rechecks in flight, all pools
	closed   bool
}

type countKey struct {
	t        tenant.ID
	template string
}

type pool struct {
	key      Key
	ready    []*Member // oldest (ReadyAt) first: claims take the oldest
	starting int
	// checking: members out of ready for a recheck. They count as ready
	// for the sizing, the quota and the memory (they are, until found
	// dead), but no claim can take them.
	checking int
	target   int
	seed     bool
	// creating are the ids of the members being created, for the next
	// create's spread hint.
	creating map[string]bool

	rate      float64   // claims per second, as of rateAt
	rateAt    time.Time //
	lastClaim time.Time
	// A spare pool's last claimer, and when a claim of another tenant
	// followed one's: the pool is shared, and keeps its reserve.
	lastTenant tenant.ID
	sharedAt   time.Time
	created    time.Time

	failures int
	retryAt  time.Time
}

// New returns Pools; call Run to fill them.
func New(cfg Config) *Pools {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Lead == 0 {
		cfg.Lead = 5 * time.Second
	}
	if cfg.HalfLife <= 0 {
		cfg.HalfLife = time.Minute
	}
	if cfg.IdleAfter <= 0 {
		cfg.IdleAfter = 5 * time.Minute
	}
	if cfg.ForgetAfter <= 0 {
		cfg.ForgetAfter = time.Hour
	}
	if cfg.MaxPerPool <= 0 {
		cfg.MaxPerPool = 64
	}
	if cfg.MaxSpare <= 0 {
		cfg.MaxSpare = cfg.MaxPerPool
	}
	if cfg.SpareReserve == 0 {
		cfg.SpareReserve = DefaultSpareReserve
	}
	cfg.SpareReserve = max(cfg.SpareReserve, 0)
	if cfg.Parallel <= 0 {
		cfg.Parallel = 2
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.Recheck == 0 {
		cfg.Recheck = 30 * time.Second
	}
	if cfg.MemberMB == nil {
		cfg.MemberMB = func(k Key) int { return k.MemoryMB }
	}
	reachable := func(string) bool { return true }
	if r, ok := cfg.Backend.(reachabilityReporter); ok {
		reachable = r.Reachable
	}
	if cfg.Admission == nil {
		cfg.Admission = admitAll{}
	}
	return &Pools{
		cfg: cfg, log: cfg.Log, reachable: reachable,
		kick:    make(chan struct{}, 1),
		readyCh: make(chan struct{}),
		pools:   map[Key]*pool{},
		counts:  map[countKey]*Count{},
	}
}

func (p *Pools) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// rateAt decays the claim rate to now.
func (pl *pool) rateNow(now time.Time, halfLife time.Duration) float64 {
	if pl.rateAt.IsZero() {
		return 0
	}
	dt := now.Sub(pl.rateAt)
	if dt <= 0 {
		return pl.rate
	}
	return pl.rate * math.Exp2(-float64(dt)/float64(halfLife))
}

// DefaultSpareReserve is Config.SpareReserve's default.
const DefaultSpareReserve = 2

// spareShared is how long a spare pool that two tenants claimed from keeps
// its reserve: long enough for a tenant that creates every few minutes.
const spareShared = time.Hour

// Claim takes a ready member of key, or else of key's spare pool, or
// reports a miss. It never waits. A miss wakes the refiller at once; after
// a hit the caller calls Refill once it has handed the member over. Either
// way the claim feeds the claim rates of key and of its spare pool.
// background says the claim's tenant has other creates in progress: it may
// not take the spare pool's reserve.
func (p *Pools) Claim(key Key, background bool) (*Member, bool) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, false
	}
	pl := p.claimed(key, now)
	var sp *pool
	if sk, ok := p.spareOf(key); ok {
		sp = p.claimed(sk, now)
	}
	c := p.count(key)
	if m := pl.take(p.reachable); m != nil {
		c.Hits++
		return m, true
	}
	if sp != nil {
		if sp.lastTenant != "" && sp.lastTenant != key.Tenant {
			sp.sharedAt = now
		}
		sp.lastTenant = key.Tenant
		sc := p.count(sp.key)
		if m := p.takeSpare(sp, background, now); m != nil {
			c.Spare++
			sc.Hits++
			return m, true
		}
		sc.Misses++
	}
	c.Misses++
	p.wake()
	return nil, false
}

// Refill wakes the refiller after a claim that got a member, once the
// claimer is done handing it over. A hit does not wake it itself: the
// refill's cold create (tens of milliseconds of CPU) would share a small
// host's CPUs with the rest of the claim (envd's /init, the row), which is
// most of a warm create's time; waiting for the hand-over costs the pool a
// millisecond.
func (p *Pools) Refill() { p.wake() }

// claimed finds (or makes) key's pool and feeds its claim rate; p.mu is
// held.
func (p *Pools) claimed(key Key, now time.Time) *pool {
	pl := p.pools[key]
	if pl == nil {
		pl = &pool{key: key, created: now}
		p.pools[key] = pl
	}
	// Each claim adds 1/τ (τ = half-life / ln 2) to a rate decaying by
	// e^(-t/τ): at a steady λ claims/s the average converges to λ.
	pl.rate = pl.rateNow(now, p.cfg.HalfLife) + math.Ln2/p.cfg.HalfLife.Seconds()
	pl.rateAt = now
	pl.lastClaim = now
	return pl
}

// spareOf is the spare pool serving claims of key, if any.
func (p *Pools) spareOf(key Key) (Key, bool) {
	if p.cfg.Spare == nil || key.IsSpare() {
		return Key{}, false
	}
	return p.cfg.Spare(key)
}

// takeSpare takes a member of spare pool sp, leaving the reserve of a
// shared pool to lone claims; p.mu is held.
func (p *Pools) takeSpare(sp *pool, background bool, now time.Time) *Member {
	if sp == nil {
		return nil
	}
	shared := !sp.sharedAt.IsZero() && now.Sub(sp.sharedAt) < spareShared
	if background && shared && len(sp.ready) <= p.cfg.SpareReserve {
		return nil
	}
	return sp.take(p.reachable)
}

// take takes the oldest ready member that reachable accepts. The others
// stay: a member cut off for a moment is claimable again when it answers,
// and one that is gone for good fails its recheck.
func (pl *pool) take(reachable func(id string) bool) *Member {
	if pl == nil {
		return nil
	}
	for i, m := range pl.ready {
		if !reachable(m.ID) {
			continue
		}
		pl.ready = slices.Delete(pl.ready, i, i+1)
		return m
	}
	return nil
}

// Ready returns a channel that is closed the next time any member becomes
// ready. Get it before a Take that misses, so a member readied in between
// is not missed. After the drain began it never fires.
func (p *Pools) Ready() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readyCh
}

// Take takes a ready member of key (or of its spare pool) for a caller
// whose Claim missed and who waited for a refill. It neither counts a claim
// nor feeds the claim rate (Claim did both); it counts the member as Waited
// and wakes the refiller. background is as for Claim.
func (p *Pools) Take(key Key, background bool) (*Member, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, false
	}
	m := p.pools[key].take(p.reachable)
	if m == nil {
		if sk, ok := p.spareOf(key); ok {
			if m = p.takeSpare(p.pools[sk], background, time.Now()); m != nil {
				p.count(sk).Waited++
			}
		}
	}
	if m == nil {
		return nil, false
	}
	p.count(key).Waited++
	p.wake()
	return m, true
}

func (p *Pools) count(key Key) *Count {
	ck := countKey{key.Tenant, key.Template}
	c := p.counts[ck]
	if c == nil {
		c = &Count{Tenant: key.Tenant, Template: key.Template}
		p.counts[ck] = c
	}
	return c
}

// targetOf computes a pool's target at now; p.mu is held.
func (p *Pools) targetOf(pl *pool, now time.Time) int {
	recent := !pl.lastClaim.IsZero() && now.Sub(pl.lastClaim) < p.cfg.ForgetAfter
	minWarm := 0
	if pl.seed || recent {
		minWarm = p.cfg.Admission.MinWarm(pl.key)
	}
	adaptive := 0
	// With a spare pool serving key's claims, it follows the claim rate
	// host-wide; the tenant's own pool is min_warm, a reservation.
	_, spared := p.spareOf(pl.key)
	if p.cfg.Lead > 0 && !spared && !pl.lastClaim.IsZero() && now.Sub(pl.lastClaim) < p.cfg.IdleAfter {
		adaptive = int(math.Round(pl.rateNow(now, p.cfg.HalfLife) * p.cfg.Lead.Seconds()))
	}
	limit := p.cfg.MaxPerPool
	if pl.key.IsSpare() {
		limit = p.cfg.MaxSpare
	}
	return min(max(minWarm, adaptive), limit)
}

// Run keeps the pools at their targets until ctx ends, then drains them:
// in-flight creates are cancelled and every ready member is destroyed. It
// returns once the drain is done.
func (p *Pools) Run(ctx context.Context) {
	period := p.cfg.Tick
	if p.cfg.Recheck > 0 {
		period = min(period, p.cfg.Recheck)
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		p.reconcile(ctx)
		select {
		case <-ctx.Done():
			p.drain()
			return
		case <-p.kick:
		case <-t.C:
		}
	}
}

type plan struct {
	pl   *pool
	want int // members to start
}

// reconcile runs one pass: seeds, targets, trims, forgets, rechecks and
// starts creates. Only Run calls it, so starts never race each other.
func (p *Pools) reconcile(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	seeds := p.cfg.Admission.Seeds()
	now := time.Now()
	var plans []plan
	var trim []*Member
	p.mu.Lock()
	for _, pl := range p.pools {
		pl.seed = false
	}
	for _, k := range seeds {
		pl := p.pools[k]
		if pl == nil {
			pl = &pool{key: k, created: now}
			p.pools[k] = pl
		}
		pl.seed = true
	}
	for k, pl := range p.pools {
		pl.target = p.targetOf(pl, now)
		have := len(pl.ready) + pl.starting + pl.checking
		switch {
		case have > pl.target && len(pl.ready) > 0:
			n := min(have-pl.target, len(pl.ready))
			// Trim the newest: the oldest are handed out first anyway.
			trim = append(trim, pl.ready[len(pl.ready)-n:]...)
			pl.ready = pl.ready[:len(pl.ready)-n]
		case have < pl.target && !now.Before(pl.retryAt):
			plans = append(plans, plan{pl: pl, want: pl.target - have})
		case have == 0 && pl.target == 0 && !pl.seed && (pl.lastClaim.IsZero() || now.Sub(pl.lastClaim) >= p.cfg.ForgetAfter):
			delete(p.pools, k)
		}
	}
	checks := p.dueLocked(now)
	p.mu.Unlock()

	for _, c := range checks {
		p.wg.Add(1)
		go func() { // exits within recheckTimeout
			defer p.wg.Done()
			p.recheck(ctx, c.pl, c.m)
		}()
	}
	for _, m := range trim {
		if m.Key.IsSpare() {
			// A spare member is host state no tenant owns: its coming and
			// going gets an audit line of its own.
			p.log.Info("spare member trim", "audit", true, "action", "spare_trim", "template", m.Key.Template, "member", m.ID)
		} else {
			p.log.Info("pool trim", "tenant", string(m.Key.Tenant), "template", m.Key.Template, "member", m.ID)
		}
		p.destroy(m.ID)
	}
	// Fairness: the pools furthest below target first.
	sort.Slice(plans, func(i, j int) bool { return plans[i].want > plans[j].want })
	for _, pl := range plans {
		for range pl.want {
			if !p.startOne(ctx, pl.pl) {
				break
			}
		}
	}
}

type check struct {
	pl *pool
	m  *Member
}

// dueLocked takes the members due for a recheck out of their pools, as
// many as the bound on rechecks in flight allows; p.mu is held. Out of
// ready, no Claim or Take can hand one out while its envd is asked, and
// one that fails never goes back: checking in place and dropping failures
// afterwards would leave a window in which a claim takes a member whose
// check has just failed.
func (p *Pools) dueLocked(now time.Time) []check {
	if p.cfg.Recheck < 0 {
		return nil
	}
	var due []check
	for _, pl := range p.pools {
		keep := pl.ready[:0]
		for _, m := range pl.ready {
			if p.checking < recheckParallel && now.Sub(m.checkedAt) >= p.cfg.Recheck {
				due = append(due, check{pl, m})
				p.checking++
				pl.checking++
				continue
			}
			keep = append(keep, m)
		}
		clear(pl.ready[len(keep):])
		pl.ready = keep
	}
	return due
}

// recheck asks member m of pl for /health again: healthy, it goes back to
// pl in its place by ReadyAt; else it is destroyed. Either way the refiller
// looks again: to replace it, or to check the next due members.
func (p *Pools) recheck(ctx context.Context, pl *pool, m *Member) {
	hctx, cancel := context.WithTimeout(ctx, recheckTimeout)
	err := p.cfg.Health(hctx, m.ID)
	cancel()
	now := time.Now()
	p.mu.Lock()
	p.checking--
	pl.checking--
	// A member of a pool dropped or forgotten meanwhile, or checked while
	// the drain began, is destroyed as one that failed.
	kept := err == nil && !p.closed && p.pools[m.Key] == pl
	if kept {
		m.checkedAt = now
		i := sort.Search(len(pl.ready), func(i int) bool { return pl.ready[i].ReadyAt.After(m.ReadyAt) })
		pl.ready = slices.Insert(pl.ready, i, m)
		// A claim that missed while it was out may be waiting for it.
		close(p.readyCh)
		p.readyCh = make(chan struct{})
	}
	p.mu.Unlock()
	defer p.wake()
	if kept {
		return
	}
	if err != nil && ctx.Err() == nil {
		k := m.Key
		if k.IsSpare() {
			p.log.Info("spare member unhealthy", "audit", true, "action", "spare_unhealthy", "template", k.Template, "member", m.ID,
				"ready_s", int(now.Sub(m.ReadyAt).Seconds()), "err", err)
		} else {
			p.log.Warn("pool member unhealthy", "tenant", string(k.Tenant), "template", k.Template, "member", m.ID,
				"ready_s", int(now.Sub(m.ReadyAt).Seconds()), "err", err)
		}
	}
	p.destroy(m.ID)
}

// startOne launches one member create for pl, if the parallelism bound and
// Admit allow; it reports whether it did.
func (p *Pools) startOne(ctx context.Context, pl *pool) bool {
	p.mu.Lock()
	if p.closed || p.starting >= p.cfg.Parallel {
		p.mu.Unlock()
		return false
	}
	members, memMB := p.tenantMembersLocked(pl.key.Tenant)
	p.mu.Unlock()
	if err := p.cfg.Admission.AdmitMember(ctx, pl.key, members, memMB); err != nil {
		p.log.Debug("pool refill held back", "tenant", string(pl.key.Tenant), "template", pl.key.Template, "reason", err.Error())
		return false
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	p.starting++
	pl.starting++
	p.wg.Add(1)
	p.mu.Unlock()
	go func() { // exits when the backend's Create (bounded by ctx) returns
		defer p.wg.Done()
		p.create(ctx, pl)
	}()
	return true
}

// tenantMembersLocked counts t's members, ready and starting, and their
// memory.
func (p *Pools) tenantMembersLocked(t tenant.ID) (n, memMB int) {
	for _, pl := range p.pools {
		if pl.key.Tenant == t {
			c := len(pl.ready) + pl.starting + pl.checking
			n += c
			memMB += c * p.cfg.MemberMB(pl.key)
		}
	}
	return n, memMB
}

func (p *Pools) create(ctx context.Context, pl *pool) {
	k := pl.key
	m := &Member{ID: p.cfg.NewID(), AccessToken: p.cfg.NewToken(), Key: k}
	start := time.Now()
	// The pool's other members, ready or being made: a backend with
	// several hosts puts this one on the host with the fewest of them,
	// so that a host's death leaves members elsewhere.
	p.mu.Lock()
	siblings := make([]string, 0, len(pl.ready)+len(pl.creating))
	for _, r := range pl.ready {
		siblings = append(siblings, r.ID)
	}
	for id := range pl.creating {
		siblings = append(siblings, id)
	}
	if pl.creating == nil {
		pl.creating = map[string]bool{}
	}
	pl.creating[m.ID] = true
	p.mu.Unlock()
	_, err := p.cfg.Backend.Create(ctx, runtime.Spec{
		ID: m.ID, Template: k.Template, CPUCount: k.CPUCount, MemoryMB: k.MemoryMB, DiskSizeMB: k.DiskMB,
		AccessToken: m.AccessToken, AllowInternet: k.AllowInternet, SpreadFrom: siblings,
		Background: true, // no caller waits for a refill: one who waits for a cold create goes first
	})
	p.mu.Lock()
	delete(pl.creating, m.ID)
	p.mu.Unlock()
	if err == nil {
		if err = p.cfg.Health(ctx, m.ID); err != nil {
			err = errors.Join(errors.New("envd health"), err)
		} else if p.cfg.Prepare != nil {
			err = p.cfg.Prepare(ctx, m.ID, k.Template)
		}
		if err != nil {
			_ = p.destroyMember(context.WithoutCancel(ctx), m.ID)
		}
	}
	now := time.Now()
	p.mu.Lock()
	p.starting--
	pl.starting--
	if err != nil {
		pl.failures++
		backoff := min(time.Second<<min(pl.failures-1, 6), time.Minute)
		pl.retryAt = now.Add(backoff)
		// A pool born of a claim for a template the backend does not have
		// (or a shape it refuses) is dropped: retrying cannot help, and the
		// claims already got the error from their cold creates.
		permanent := errors.Is(err, runtime.ErrTemplateNotFound) || errors.Is(err, runtime.ErrInvalidSpec)
		if permanent && !pl.seed && p.pools[k] == pl && pl.starting == 0 && len(pl.ready) == 0 {
			delete(p.pools, k)
		}
		p.mu.Unlock()
		if ctx.Err() == nil {
			p.log.Warn("pool member create failed", "tenant", string(k.Tenant), "template", k.Template,
				"err", err, "retry_in", backoff.String())
		}
		p.wake()
		return
	}
	pl.failures = 0
	m.ReadyAt, m.checkedAt = now, now
	// A member made for a pool that was forgotten meanwhile, or after the
	// drain began, is destroyed rather than kept.
	if p.closed || p.pools[k] != pl {
		p.mu.Unlock()
		_ = p.destroyMember(context.WithoutCancel(ctx), m.ID)
		return
	}
	pl.ready = append(pl.ready, m)
	close(p.readyCh)
	p.readyCh = make(chan struct{})
	p.mu.Unlock()
	if k.IsSpare() {
		p.log.Info("spare member ready", "audit", true, "action", "spare_ready", "template", k.Template, "member", m.ID,
			"took_ms", now.Sub(start).Milliseconds())
	} else {
		p.log.Debug("pool member ready", "tenant", string(k.Tenant), "template", k.Template, "member", m.ID,
			"took_ms", now.Sub(start).Milliseconds())
	}
	p.wake()
}

// Drop forgets the pools of template (one that no longer exists, such as a
// deleted template's build) and destroys their ready members before it
// returns; members still starting are destroyed when they are done.
func (p *Pools) Drop(ctx context.Context, template string) {
	var gone []*Member
	p.mu.Lock()
	for k, pl := range p.pools {
		if k.Template == template {
			gone = append(gone, pl.ready...)
			delete(p.pools, k)
		}
	}
	p.mu.Unlock()
	for _, m := range gone {
		if err := p.destroyMember(ctx, m.ID); err != nil {
			p.log.Error("pool: destroy member", "member", m.ID, "err", err)
		}
	}
	if len(gone) > 0 {
		p.log.Info("pool dropped", "template", template, "members", len(gone))
	}
}

// destroyMember destroys member id in the backend and tells
// cfg.Destroyed.
func (p *Pools) destroyMember(ctx context.Context, id string) error {
	err := p.cfg.Backend.Destroy(ctx, id)
	if p.cfg.Destroyed != nil {
		p.cfg.Destroyed(id)
	}
	return err
}

// destroy removes a member in the background (tracked by wg).
func (p *Pools) destroy(id string) {
	p.wg.Add(1)
	go func() { // exits when the backend's Destroy returns
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.destroyMember(ctx, id); err != nil {
			p.log.Error("pool: destroy member", "member", id, "err", err)
		}
	}()
}

// drain stops claims, waits for creates in flight and destroys every member.
func (p *Pools) drain() {
	p.mu.Lock()
	p.closed = true
	// Waiters look once more, find nothing, and from then on get a nil
	// channel, which never fires.
	if p.readyCh != nil {
		close(p.readyCh)
		p.readyCh = nil
	}
	var all []*Member
	for _, pl := range p.pools {
		all = append(all, pl.ready...)
		pl.ready = nil
	}
	p.mu.Unlock()
	for _, m := range all {
		p.destroy(m.ID)
	}
	p.wg.Wait()
	p.log.Info("pools drained", "members", len(all))
}

// ReservedMB is the memory of all members, ready and starting.
func (p *Pools) ReservedMB() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, pl := range p.pools {
		n += (len(pl.ready) + pl.starting + pl.checking) * p.cfg.MemberMB(pl.key)
	}
	return n
}

// Stats describes every pool, ordered by tenant and template.
func (p *Pools) Stats() []Stat {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Stat, 0, len(p.pools))
	for _, pl := range p.pools {
		// A member under a recheck is ready until found dead: the gauge
		// does not dip every Recheck.
		out = append(out, Stat{Key: pl.key, Ready: len(pl.ready) + pl.checking, Starting: pl.starting, Target: pl.target})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Key, out[j].Key
		if a.Tenant != b.Tenant {
			return a.Tenant < b.Tenant
		}
		return a.Template < b.Template
	})
	return out
}

// Counts returns the cumulative hits and misses per (tenant, template).
func (p *Pools) Counts() []Count {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Count, 0, len(p.counts))
	for _, c := range p.counts {
		out = append(out, *c)
	}
	return out
}
