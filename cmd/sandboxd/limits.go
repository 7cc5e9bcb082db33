package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/codeinterp"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/ratelimit"
	sbxruntime "github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server"
	"github.com/sandboxd/sandboxd/tenant"
	"github.com/sandboxd/sandboxd/volume"
)

// limitOpts are serve's flags for rate limits, quotas, the host guard and
// the warm pools.
type limitOpts struct {
	createRate, lifecycleRate, readRate, ipRate     float64
	createBurst, lifecycleBurst, readBurst, ipBurst int
	dataplaneRate                                   float64
	dataplaneBurst                                  int
	maxSandboxes, maxMemoryMB, minWarm              int
	hostMemoryMB, hostReserveMB                     int
	maxCPU, maxDiskMB                               int
	maxVolumes, maxVolumesMB, volumeSizeMB          int
	settingsPoll                                    time.Duration
	nativeIdleTTL                                   time.Duration

	pool                    bool
	poolLead, poolHalfLife  time.Duration
	poolIdle, poolForget    time.Duration
	poolMax, poolParallel   int
	coldParallel, coldQueue int
	spare                   bool
	spareMin                spareMinFlag
	spareMax                int
	spareReserve            int
	deferClaimInit          bool
}

// spareMinFlag is --spare-min: TEMPLATE=N pairs, comma-separated.
type spareMinFlag struct {
	m   map[string]int
	set bool // given on the command line (no default added)
}

func (f *spareMinFlag) String() string {
	if f == nil || len(f.m) == 0 {
		return ""
	}
	names := slices.Sorted(maps.Keys(f.m))
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + strconv.Itoa(f.m[n])
	}
	return strings.Join(parts, ",")
}

func (f *spareMinFlag) Set(v string) error {
	m := map[string]int{}
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, n, ok := strings.Cut(part, "=")
		c, err := strconv.Atoi(n)
		if !ok || name == "" || err != nil || c < 0 {
			return fmt.Errorf("%q: want TEMPLATE=N (N >= 0), e.g. base=2", part)
		}
		m[name] = c
	}
	f.m, f.set = m, true
	return nil
}

// defaultSpareMin is --spare-min's default: two of base, so that a lone
// user's first creates on a fresh sandboxd are warm claims.
const defaultSpareMin = "base=2"

// spareCodeInterpMinMB is the MemAvailable (MiB) at start below which the
// code interpreter gets no spare member by default: an idle one holds
// about 110 MiB, and its memory limit counts in the host budget.
const spareCodeInterpMinMB = 2048

// incusSpareMax bounds the default spare floor of base on Incus (see
// spareFloors).
const incusSpareMax = 20

// localSpareMB is the MemAvailable at start (MiB) per default spare member
// of base on the local backend (see spareFloors).
const localSpareMB = 256

// defaultSpareMax is the smallest default cap of a spare pool's target:
// what --pool-max's default allows one tenant's pool.
const defaultSpareMax = 64

// spareCap is the cap of each spare pool's target (its floor and what
// the host-wide claim rate grows it to): --spare-max as given or, by
// default, on the local backend one member per localSpareMB of memory
// available at start (availMB) and at least defaultSpareMax, elsewhere
// defaultSpareMax. Not --pool-max, which bounds one tenant's pool: on a
// 24 GiB host, a spare pool of 92 rather than 64 serves 28 more of a
// burst's creates as claims (200 at once against a tenant pool of 50
// met 86 cold creates, ≈ 14 ms of CPU each on 2 cores, for a p99 of
// 555 ms) for ≈ 80 MiB more of idle members.
func (o *limitOpts) spareCap(availMB int, backend string) int {
	if o.spareMax > 0 {
		return o.spareMax
	}
	if backend == "local" {
		return max(defaultSpareMax, availMB/localSpareMB)
	}
	return defaultSpareMax
}

// spareFloors is the spare pools' floors: --spare-min as given or, by
// default, one base member per so much memory available at start
// (availMB), at least 2, plus one code-interpreter-v1 when the code
// interpreter is built (codeInterp) and the host has memory to spare.
//   - Local backend: one per localSpareMB, up to spareCap. An idle
//     member holds ≈ 2.5 MiB of host memory (1% of what it is kept for)
//     and no CPU, while a cold create costs ≈ 30 ms of CPU: 50 concurrent
//     cold creates are CPU-bound at ≈ 0.75 s on 2 cores, 50 claims take
//     a few ms each.
//   - Incus: one per GiB, up to incusSpareMax: a cold create there costs
//     ≈ 0.27 s of incusd's CPU (20 at once took 4.1 s on 2 cores, 0.3 s
//     from 20 spare members) and an idle member ≈ 18 MiB.
func (o *limitOpts) spareFloors(codeInterp bool, availMB int, backend string) map[string]int {
	if o.spareMin.set {
		return o.spareMin.m
	}
	floors := maps.Clone(o.spareMin.m)
	switch backend {
	case "incus":
		floors["base"] = min(max(floors["base"], availMB/1024), incusSpareMax)
	case "local":
		floors["base"] = max(floors["base"], min(availMB/localSpareMB, o.spareCap(availMB, backend)))
	}
	if codeInterp && availMB >= spareCodeInterpMinMB {
		floors[codeinterp.TemplateName] = 1
	}
	return floors
}

func (o *limitOpts) register(fs *flag.FlagSet) {
	fs.Float64Var(&o.createRate, "create-rate", 0, "default sandbox creates (create, resume, connect) per second per tenant; 0: no limit, the host's capacity is shared fairly instead (--cold-parallel, --create-queue); tenants set --create-rate overrides")
	fs.IntVar(&o.createBurst, "create-burst", 20, "default create token bucket size per tenant")
	fs.Float64Var(&o.lifecycleRate, "lifecycle-rate", 20, "other mutating API calls per second per tenant; 0: no limit")
	fs.IntVar(&o.lifecycleBurst, "lifecycle-burst", 50, "lifecycle token bucket size per tenant")
	fs.Float64Var(&o.readRate, "read-rate", 50, "API reads (GET) per second per tenant; 0: no limit")
	fs.IntVar(&o.readBurst, "read-burst", 100, "read token bucket size per tenant")
	fs.Float64Var(&o.dataplaneRate, "dataplane-rate", 0, "data-plane requests (through the sandbox proxy) per second per tenant owning the sandbox; 0: no limit")
	fs.IntVar(&o.dataplaneBurst, "dataplane-burst", 200, "data-plane token bucket size per tenant")
	fs.Float64Var(&o.ipRate, "ip-rate", 0, "API requests per second per client address, checked before auth; 0: no limit")
	fs.IntVar(&o.ipBurst, "ip-burst", 200, "per-address token bucket size")
	fs.IntVar(&o.maxSandboxes, "max-sandboxes", 0, "default live sandboxes per tenant, paused included; 0: no limit")
	fs.IntVar(&o.maxMemoryMB, "max-memory-mb", 0, "default total memory (MiB) of a tenant's live sandboxes; 0: no limit")
	fs.IntVar(&o.minWarm, "min-warm", 0, "default warm sandboxes kept per tenant's default pool")
	fs.IntVar(&o.hostMemoryMB, "host-memory-mb", 0, "budget (MiB) for the memory limits of all live sandboxes (not those paused to disk) plus warm members; 0: no budget")
	fs.IntVar(&o.hostReserveMB, "host-memory-reserve-mb", 512, "refuse creates (503) when MemAvailable minus this is below the sandbox's memory; 0: off")
	fs.IntVar(&o.maxCPU, "max-cpu", 0, "most CPUs one sandbox may ask for; a create asking more is refused (400), a template's or the default count above it is lowered to it; 0: all but one of the host's (at least 1)")
	fs.IntVar(&o.maxDiskMB, "max-disk-mb", sandbox.DefaultMaxDiskMB, "largest disk (MiB) one sandbox may ask for; a create asking more is refused (400), a template's or the default size above it is lowered to it. With --backend local the disk is a tmpfs: it is RAM, and counts with memory in quotas and the host guard")
	fs.IntVar(&o.maxVolumes, "max-volumes", volume.DefaultMax, "default volumes per tenant; 0: no limit (tenants set --max-volumes overrides)")
	fs.IntVar(&o.maxVolumesMB, "max-volumes-mb", volume.DefaultMaxMB, "default total size (MiB) of a tenant's volumes; 0: no limit")
	fs.IntVar(&o.volumeSizeMB, "volume-size-mb", volume.DefaultSizeMB, "default size (MiB) of a new volume (E2B's create names none): an ext4 image on the local backend, the kernel enforces it")
	fs.DurationVar(&o.nativeIdleTTL, "native-idle-ttl", 5*time.Minute, "kill a native-API sandbox after this long without activity, unless its create names an idle_ttl; 0: off (E2B sandboxes never have one)")
	fs.DurationVar(&o.settingsPoll, "settings-poll", 2*time.Second, "how often tenant settings are re-read from the store")
	fs.BoolVar(&o.pool, "pool", true, "keep warm pools (min_warm and adaptive)")
	fs.DurationVar(&o.poolLead, "pool-lead", 5*time.Second, "adaptive pool size: keep this many seconds of recent claims warm; negative: off")
	fs.DurationVar(&o.poolHalfLife, "pool-half-life", time.Minute, "half-life of the claim-rate average")
	fs.DurationVar(&o.poolIdle, "pool-idle", 5*time.Minute, "a pool without claims this long shrinks to min_warm")
	fs.DurationVar(&o.poolForget, "pool-forget", time.Hour, "a non-default pool without claims this long is removed")
	fs.IntVar(&o.poolMax, "pool-max", 64, "largest target of a tenant's pool (spare pools: --spare-max)")
	fs.IntVar(&o.poolParallel, "pool-parallel", max(runtime.NumCPU(), 2), "warm member creates in flight at once")
	fs.BoolVar(&o.spare, "spare", true, "keep host-wide spare pools: never-used, tenant-neutral sandboxes of the backend's templates and of those in --spare-min, claimed by any tenant after its own min_warm pool; sized by the host-wide claim rate above --spare-min's floor")
	_ = o.spareMin.Set(defaultSpareMin)
	o.spareMin.set = false
	fs.IntVar(&o.spareMax, "spare-max", 0, fmt.Sprintf("largest target of a spare pool, its floor and what the host-wide claim rate grows it to; 0: on the local backend one per %d MiB available at start, at least %d, elsewhere %d", localSpareMB, defaultSpareMax, defaultSpareMax))
	fs.IntVar(&o.spareReserve, "spare-reserve", pool.DefaultSpareReserve, "ready members of a spare pool kept for lone creates (a tenant's only create in progress) once two tenants claimed from it within the hour: a tenant's flood leaves them to the others, whose creates stay warm meanwhile; 0: none")
	fs.Var(&o.spareMin, "spare-min", `spare members kept per template (default shape) when idle, as TEMPLATE=N,...; "" for none; the default base=2 grows with the memory available at start: on the local backend one base per 256 MiB, up to --pool-max (an idle member holds ≈ 2.5 MiB), on Incus one per GiB, up to 20 (a cold create costs Incus ≈ 0.27 s of CPU); it gets code-interpreter-v1=1 too when --code-interpreter=build and 2 GiB are available`)
	fs.BoolVar(&o.deferClaimInit, "defer-claim-init", true, "answer a create served from a warm pool before the member's envd has its /init (env vars, access token, user), on a backend that tells at once whether the member runs (local): the /init runs in the background and the sandbox's first request waits for it, so no request reaches the envd before it; false, and on Incus: the create waits for the /init")
	fs.IntVar(&o.coldParallel, "cold-parallel", 0, "cold creates (pool misses) in flight at once; a tenant alone may hold all, one of several all but one; the rest wait, fairly between tenants, for a slot or a warm refill; 0: one per CPU (at least 2) plus one; negative: no bound")
	fs.IntVar(&o.coldQueue, "create-queue", sandbox.DefaultColdQueue, "creates waiting for a cold-create slot, shared fairly between the tenants waiting; a create beyond its tenant's share gets 429 + Retry-After; negative: unbounded")
}

// defaults are the server-wide tenant settings, for tenants (or values)
// with none stored.
func (o *limitOpts) defaults() tenant.Effective {
	return tenant.Effective{
		MinWarm: o.minWarm, MaxSandboxes: o.maxSandboxes, MaxMemoryMB: o.maxMemoryMB,
		Limits: map[tenant.Class]tenant.Bucket{
			tenant.Create:    {Rate: o.createRate, Burst: o.createBurst},
			tenant.Lifecycle: {Rate: o.lifecycleRate, Burst: o.lifecycleBurst},
			tenant.Read:      {Rate: o.readRate, Burst: o.readBurst},
			tenant.DataPlane: {Rate: o.dataplaneRate, Burst: o.dataplaneBurst},
		},
	}
}

// tenantLimiter builds the per-tenant limiter over the settings cache and
// its defaults.
func (o *limitOpts) tenantLimiter(settings *sandbox.Settings) *ratelimit.Tenants {
	defaults := map[tenant.Class]ratelimit.Limit{}
	for c, b := range settings.Defaults().Limits {
		defaults[c] = ratelimit.Limit(b)
	}
	return &ratelimit.Tenants{
		Limiter: ratelimit.New(10*time.Minute, nil),
		Policy:  ratelimit.Policy{Defaults: defaults, Settings: settings.Stored},
	}
}

func (o *limitOpts) ipLimiter() (*ratelimit.Limiter, ratelimit.Limit) {
	return ratelimit.New(10*time.Minute, nil), ratelimit.Limit{Rate: o.ipRate, Burst: o.ipBurst}
}

// newPools builds the warm pools over mgr (nil when --pool=false); the
// spare pools are on with --spare (Manager's Config.Spare), each up to
// spareMax members.
func (o *limitOpts) newPools(mgr *sandbox.Manager, be sbxruntime.Backend, spareMax int, log *slog.Logger) *pool.Pools {
	if !o.pool {
		return nil
	}
	cfg := pool.Config{
		Backend: be, Health: mgr.EnvdHealth, Prepare: mgr.PrepareMember, Admission: mgr.Admission(), MemberMB: mgr.Admission().MemberMB,
		Destroyed: mgr.ForgetEnvd, NewID: sandbox.NewID, NewToken: sandbox.NewToken,
		Log:  log.With("component", "pool"),
		Lead: o.poolLead, HalfLife: o.poolHalfLife, IdleAfter: o.poolIdle, ForgetAfter: o.poolForget,
		MaxPerPool: o.poolMax, MaxSpare: spareMax, Parallel: o.poolParallel,
		SpareReserve: o.spareReserveConfig(),
	}
	if o.spare {
		cfg.Spare = mgr.Admission().SpareKey
	}
	p := pool.New(cfg)
	mgr.UsePool(p)
	return p
}

// spareReserveConfig is --spare-reserve as pool.Config.SpareReserve, where
// 0 is the default and negative none.
func (o *limitOpts) spareReserveConfig() int {
	if o.spareReserve <= 0 {
		return -1
	}
	return o.spareReserve
}

// background runs fn in a goroutine that stop cancels and waits for.
func background(parent context.Context, fn func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(parent)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); fn(ctx) }() // exits when ctx is cancelled
	return func() { cancel(); wg.Wait() }
}

// poolStats avoids a typed nil in server.Config.Pools.
func poolStats(p *pool.Pools) server.PoolStats {
	if p == nil {
		return nil
	}
	return p
}

// availableMB is the host's MemAvailable in MiB, 0 when unread.
func availableMB() int {
	mb, err := sandbox.MemAvailableMB()
	if err != nil {
		return 0
	}
	return mb
}
