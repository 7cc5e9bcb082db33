// Package sandbox owns the lifecycle of sandboxes: one state machine from
// create to kill, shared by every API surface. It keeps the store and the
// backend in step, serialises actions on one sandbox, writes an audit line
// for every state change, enforces end times (the sweeper) and re-adopts or
// removes what a crash of sandboxd left behind (Reconcile).
//
// # Cold create admission
//
// Admission is the Admitter's (admit.go, gate.go): a create asks it for a
// Ticket, then creates in the backend or initialises the claimed member,
// and commits the ticket.
//
// A create first claims a warm member of its pool (package pool). A hit
// costs envd's /init and one store write, and never waits on anything a
// cold create holds: the tenant's lock is taken only for tenants with a
// quota, and only around the check and the insert. A member whose envd
// does not take the /init (it died while warm) is destroyed and the create
// goes on as a cold one: a dead member costs the caller time, not an error.
//
// A miss needs a backend create, which is mostly CPU (mounts, namespaces,
// cgroups, envd's start). Started all at once, a burst of them shares the
// CPUs and every one of them finishes late; so at most ColdParallel (one
// per CPU, plus one) run at once. A miss waits for whichever comes first: a
// slot, or a member that a pool refill (started by the claim itself) makes
// ready; either way it is served as soon as capacity frees up, in arrival
// order within its tenant. The bound is work-conserving: a tenant alone
// may hold every slot; while another tenant is active each holds at most
// all slots but one, and free slots go to the waiting tenant holding the
// fewest (the one served longest ago among equals), so a tenant flooding
// creates never takes every slot from another: the other's create finds
// one free (or waits for one create), and shares the CPUs with a bounded
// number of the flood's: while the other's is its tenant's only create,
// the flood starts no new one (what it started finishes; its next wait
// for the lone create's time, at most loneHoldMax). The flood's creates after its first,
// and pool refills, start in the background (Ticket.Background,
// runtime.Spec.Background): they take the CPU a lone create leaves. Only what exceeds the host's
// capacity is refused: the waiters are bounded (ColdQueue), each tenant to
// its share, and a create beyond gets 429 with Retry-After. A waiting create counts against its
// tenant's quota although it has no row yet, holds no lock, and gives up
// when its request ends. Its audit line says how long it waited
// (waited_ms) and where it was served from (served_from: pool or cold).
//
// # Pause, resume and envd's /init
//
// envd takes any access token on its first /init, and the proxy leaves
// the token check to envd; so a sandbox is routed to only while its row
// says running, and a row says running only once its envd had its /init.
// A pause to disk (which may start the sandbox afresh, ErrRestarted) and a
// resume (which may start a new envd) write "pausing" or "resuming" first
// and settle it after /init. After a crash, Reconcile re-inits a sandbox it
// finds running under such a row; envd accepts the same token again. A
// sandbox whose new envd refuses /init is destroyed (kill_uninitialised),
// never left running open.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/telemetry"
	"github.com/sandboxd/sandboxd/tenant"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Config configures a Manager.
type Config struct {
	Store       *store.Store
	Backend     runtime.Backend
	BackendName string
	Log         *slog.Logger
	// EnvdVersion is what the API reports as each sandbox's envdVersion.
	EnvdVersion string
	// DefaultUser is the user processes run as when a request names none.
	DefaultUser string
	// Templates, when set, resolves the templates tenants built (package
	// template) and configures their sandboxes.
	Templates TemplateSource
	// DefaultTimeout applies when a create gives none; MaxTimeout caps
	// every timeout.
	DefaultTimeout, MaxTimeout time.Duration
	// Defaults are the resources of a sandbox whose create names none and
	// whose template declares none: 2 CPUs, 512 MiB, 1024 MiB disk. They
	// are resolved here, once (PoolKey); a backend gets a finished Spec.
	DefaultCPU, DefaultMemoryMB, DefaultDiskMB int
	// MaxCPU and MaxDiskMB cap one sandbox: a create asking for more is
	// refused (ErrInvalidArgument, 400, as E2B does past a plan's limit);
	// a template's or the configured default above them is clamped. 0:
	// DefaultMaxCPU and DefaultMaxDiskMB.
	MaxCPU, MaxDiskMB int
	// DiskInMemory says a sandbox's disk is a tmpfs (the local backend):
	// its size then counts with its memory in the tenant's memory quota,
	// the host budget and the MemAvailable guard, since the pages are RAM.
	DiskInMemory bool
	// KilledRetention is how long killed sandboxes stay in the store.
	KilledRetention time.Duration
	// OnCreate, when set, observes every successful create (metrics).
	// Deprecated: use OnCreateFrom, which also says where it came from.
	OnCreate func(template string, took time.Duration)
	// OnCreateFrom, when set, observes every successful create with where
	// it was served from: "pool" (a warm member) or "cold".
	OnCreateFrom func(template, servedFrom string, took time.Duration)
	// OnClaimFallback, when set, counts creates whose claimed member
	// (servedFrom "pool" or "spare") failed envd's /init, or was not
	// running, and that went on as cold creates.
	OnClaimFallback func(template, servedFrom string)
	// DeferClaimInit hands a claimed warm member over before its envd has
	// had /init, on a backend that can tell whether it runs without asking
	// it (runtime.LivenessChecker): the /init runs in the background, and
	// the sandbox's first request waits for it (claiminit.go). Off, or on
	// another backend, the create waits for the /init.
	DeferClaimInit bool
	// OnDeferredInit, when set, observes each such /init: by "claim" (in
	// the background) or "dial" (a request's), and its error.
	OnDeferredInit func(by string, err error)

	// Settings holds the per-tenant quotas (max sandboxes, max memory) and
	// min_warm; nil means no quotas and no min_warm.
	Settings *Settings
	// HostMemoryMB, when above zero, budgets the memory limits of all live
	// sandboxes (paused in memory included, paused to disk not) plus warm
	// pool members: a create, or a resume from disk, that would exceed it
	// is refused with ErrUnavailable (503 + Retry-After).
	HostMemoryMB int
	// HostReserveMB, when above zero, refuses a cold create (and holds back
	// pool refills) when the host's MemAvailable minus this reserve is
	// below the sandbox's memory.
	HostReserveMB int
	// MemAvailable reports the host's MemAvailable in MiB; nil reads
	// /proc/meminfo.
	MemAvailable func() (int, error)
	// MemTotal reports the host's MemTotal in MiB, the most any one
	// sandbox could ever get; nil reads /proc/meminfo.
	MemTotal func() (int, error)
	// TouchInterval throttles the store writes of sandbox activity (idle
	// TTLs): at most one per sandbox per interval. 0: TouchInterval.
	TouchInterval time.Duration
	// MetricsHistory is how many metrics samples (RunMetrics) are kept per
	// sandbox; 0: DefaultMetricsHistory.
	MetricsHistory int
	// OnMetricsPass, when set, observes every sampling pass: how many
	// sandboxes it measured and how long it took.
	OnMetricsPass func(sampled int, took time.Duration)
	// LogEntries and LogBytes bound each sandbox's log (logs.go); 0:
	// DefaultLogEntries and DefaultLogBytes.
	LogEntries, LogBytes int
	// OnLogDrop, when set, counts log entries evicted to keep within them.
	OnLogDrop func(n int)

	// ColdParallel bounds the cold creates in flight (backend creates of
	// creates that missed the pool); a tenant alone may hold all of them,
	// one of several all but one. The rest wait their turn, fairly between
	// tenants. 0: DefaultColdParallel; negative: no bound.
	ColdParallel int
	// ColdQueue bounds the creates waiting for a cold-create slot, each
	// tenant to its fair share of it; a create beyond is refused with
	// ErrRateLimited (429 + Retry-After). 0: DefaultColdQueue; negative:
	// unbounded.
	ColdQueue int

	// Spare turns the host-wide spare pools on (package pool): claims of
	// the backend's own templates and of those named in SpareMin may take
	// a never-used member after the tenant's own pool.
	Spare bool
	// SpareMin is the operator's floor of spare members per template
	// reference (a name, optionally with a tag; a public template or one
	// of the backend's own), in the template's default shape.
	SpareMin map[string]int
}

// DefaultTemplate is the template of a create that names none.
const DefaultTemplate = "base"

// DefaultMaxDiskMB is the default cap on one sandbox's disk. On the local
// backend the disk is RAM (a tmpfs), so a cap in tens of GiB would let one
// create take the host's memory.
const DefaultMaxDiskMB = 10240

// DefaultMaxCPU is the default cap on one sandbox's CPUs: all but one of
// the host's (at least one), so that no sandbox can starve sandboxd and
// the host. The backends clamp to the same as a safety net; resolving it
// here makes the CPU count the API reports the one in force.
func DefaultMaxCPU() int { return max(goruntime.NumCPU()-1, 1) }

// DefaultColdParallel is the default bound on cold creates in flight: one
// per CPU (at least 2) for any one tenant, plus one kept for the others. A
// cold create is mostly CPU (mounts, namespaces, cgroups, envd's start),
// so more at once only slows each down.
func DefaultColdParallel() int { return max(goruntime.NumCPU(), 2) + 1 }

// DefaultColdQueue is the default bound on creates waiting for a
// cold-create slot: deep enough for a burst of a few hundred creates
// (minus what the pools serve), shallow enough that a waiter is served
// within seconds rather than timing out in its client.
const DefaultColdQueue = 256

// Manager is the lifecycle state machine. Its methods are safe for
// concurrent use; actions on one sandbox are serialised.
type Manager struct {
	cfg     Config
	store   *store.Store
	backend runtime.Backend
	log     *slog.Logger
	locks   idLocks
	now     func() time.Time

	sweeps atomic.Int64
	wake   chan struct{} // a sweep is due before the next tick (cap 1)

	// bg runs what a request hands off (the destroy of a claimed member
	// that failed); Close waits for it.
	bg sync.WaitGroup

	hookMu    sync.Mutex
	stopHooks []func(id string)

	live sync.Map // sandbox id -> *liveInfo: tenant and idle TTL of live sandboxes, activity

	// adm admits creates (quota, host, pool claim, cold-create slot) and
	// resumes from disk.
	adm *Admitter

	history *history  // metrics samples per sandbox
	logs    *logBook  // log per sandbox
	follow  followers // start command output, into logs

	// envd keeps the connection of a sandbox's last control request
	// (envdAsk) for its next, when keepEnvd (the backend's channel is
	// runtime.LocalEnvdChannel): a warm member's health check leaves the
	// one its claim's /init uses.
	envd     envdconn.Keeper
	keepEnvd bool

	// liveness is the backend's, when a claim defers envd's /init
	// (Config.DeferClaimInit); uninit holds the sandboxes still to get it.
	liveness runtime.LivenessChecker
	uninit   uninitialised
}

// OnStop registers fn to run after a sandbox is paused or killed, so that
// holders of connections into it (the proxy's pool) drop them: a connection
// to a frozen sandbox does not fail, it hangs.
func (m *Manager) OnStop(fn func(id string)) {
	m.hookMu.Lock()
	defer m.hookMu.Unlock()
	m.stopHooks = append(m.stopHooks, fn)
}

func (m *Manager) stopped(id string) {
	m.live.Delete(id)
	m.envd.Forget(id)
	m.follow.stop(id)
	m.runStopHooks(id)
}

// runStopHooks drops the connections others hold into sandbox id.
func (m *Manager) runStopHooks(id string) {
	m.hookMu.Lock()
	hooks := m.stopHooks
	m.hookMu.Unlock()
	for _, fn := range hooks {
		fn(id)
	}
}

// New returns a Manager; call Reconcile before serving and Run to sweep.
func New(cfg Config) *Manager {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = 300 * time.Second
	}
	if cfg.MaxTimeout == 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	if cfg.DefaultUser == "" {
		cfg.DefaultUser = "user"
	}
	if cfg.DefaultCPU == 0 {
		cfg.DefaultCPU = 2
	}
	if cfg.DefaultMemoryMB == 0 {
		cfg.DefaultMemoryMB = 512
	}
	if cfg.DefaultDiskMB == 0 {
		cfg.DefaultDiskMB = 1024
	}
	if cfg.MaxCPU == 0 {
		cfg.MaxCPU = DefaultMaxCPU()
	}
	if cfg.MaxDiskMB == 0 {
		cfg.MaxDiskMB = DefaultMaxDiskMB
	}
	if cfg.KilledRetention == 0 {
		cfg.KilledRetention = time.Hour
	}
	if cfg.TouchInterval == 0 {
		cfg.TouchInterval = TouchInterval
	}
	if cfg.MetricsHistory <= 0 {
		cfg.MetricsHistory = DefaultMetricsHistory
	}
	if cfg.LogEntries <= 0 {
		cfg.LogEntries = DefaultLogEntries
	}
	if cfg.LogBytes <= 0 {
		cfg.LogBytes = DefaultLogBytes
	}
	m := &Manager{cfg: cfg, store: cfg.Store, backend: cfg.Backend, log: cfg.Log, now: time.Now, wake: make(chan struct{}, 1),
		history: newHistory(cfg.MetricsHistory), logs: newLogBook(cfg.LogEntries, cfg.LogBytes)}
	m.logs.onDrop = cfg.OnLogDrop
	if lc, ok := cfg.Backend.(runtime.LocalEnvdChannel); ok {
		m.keepEnvd = lc.LocalEnvdChannel()
	}
	if lc, ok := cfg.Backend.(runtime.LivenessChecker); ok && cfg.DeferClaimInit {
		m.liveness = lc
	}
	m.adm = &Admitter{
		store: cfg.Store, settings: cfg.Settings, log: cfg.Log,
		hostMemoryMB: cfg.HostMemoryMB, hostReserveMB: cfg.HostReserveMB,
		memAvailable: cfg.MemAvailable, memTotal: cfg.MemTotal, diskInMemory: cfg.DiskInMemory,
		lock:       m.lock,
		defaultKey: func(t tenant.ID) pool.Key { return m.PoolKey(t, CreateRequest{AllowInternet: true}) },
		slowStart: func(template string) bool {
			cfg, ok := m.templateConfig(template)
			return ok && cfg.StartCmd != ""
		},
	}
	if cfg.Spare {
		m.adm.spare = &spares{
			min: cfg.SpareMin, resolve: m.spareResolver, builtin: m.isBuiltin,
			key: func(template string) pool.Key {
				return m.PoolKey("", CreateRequest{Template: template, AllowInternet: true})
			},
		}
	}
	if m.adm.memAvailable == nil {
		m.adm.memAvailable = cachedMB(memAvailableEvery, MemAvailableMB)
	}
	if m.adm.memTotal == nil {
		m.adm.memTotal = cachedMB(memTotalEvery, MemTotalMB)
	}
	queue := cfg.ColdQueue
	if queue == 0 {
		queue = DefaultColdQueue
	}
	switch {
	case cfg.ColdParallel == 0:
		m.adm.gate = newColdGate(DefaultColdParallel(), queue)
	case cfg.ColdParallel > 0:
		m.adm.gate = newColdGate(cfg.ColdParallel, queue)
	}
	if lr, ok := cfg.Backend.(lossReporter); ok {
		lr.OnLost(m.lost)
	}
	return m
}

// lossReporter is a backend that can lose sandboxes behind the Manager's
// back: the Incus backend in cluster mode, when a member is gone.
type lossReporter interface {
	OnLost(fn func(id string))
}

// lost records that the backend gave sandbox id up: it is killed, so that
// it is never reported running while nothing runs it. A spare pool member
// has no row; the pool's health check drops it.
func (m *Manager) lost(id string) {
	ctx := context.Background()
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.store.GetSandboxAny(ctx, id)
	if err != nil || sb.State == store.StateKilled {
		return
	}
	if err := m.kill(ctx, &sb, "member_lost", "cause", "its cluster member is gone"); err != nil {
		m.log.Error("kill a lost sandbox", "sandbox_id", id, "err", err)
	}
}

// lock serialises lifecycle actions on one sandbox id.
func (m *Manager) lock(id string) func() { return m.locks.lock(id) }

// audit writes the one line every state change gets: who, what, which
// sandbox, and the result. The sandbox's log gets it too.
func (m *Manager) audit(ctx context.Context, action string, sb *store.Sandbox, err error, attrs ...any) {
	if sb != nil {
		m.logEvent(sb.ID, action, err, attrs)
	}
	t, _ := tenant.FromContext(ctx)
	if t == "" && sb != nil {
		t = sb.Tenant
	}
	args := []any{"audit", true, "action", action, "tenant", string(t)}
	if sb != nil {
		args = append(args, "sandbox_id", sb.ID, "state", string(sb.State), "template", sb.Template)
	}
	args = append(args, attrs...)
	if err != nil {
		m.log.Warn("sandbox "+action, append(args, "result", "error", "err", err.Error())...)
		return
	}
	m.log.Info("sandbox "+action, append(args, "result", "ok")...)
}

// CreateRequest is what a caller may ask of a new sandbox.
type CreateRequest struct {
	Template      string
	Timeout       time.Duration // 0 = default
	Secure        bool          // hand out an envd access token and require it
	AllowInternet bool
	Metadata      map[string]string
	EnvVars       map[string]string
	Lifecycle     store.Lifecycle
	CPUCount      int
	MemoryMB      int
	DiskMB        int
	Network       *NetworkConfig
	// IdleTTL, when above zero, kills the sandbox after that long without
	// activity (see Touch). The native API sets it; E2B's never does.
	IdleTTL time.Duration
	// Volumes are mounted into the sandbox (resolved and checked by the
	// caller, package volume). A create with volumes is never served from
	// a warm pool: its members have none.
	Volumes []store.SandboxVolume
}

// NetworkConfig is what sandboxd stores of E2B's network settings:
// AllowOut and DenyOut are the sandbox's egress policy (network.go, enforced
// by the backend), AllowPublicTraffic and TrafficAccessToken guard its
// ports (enforced by the proxy).
type NetworkConfig struct {
	AllowOut           []string        `json:"allowOut,omitempty"`
	DenyOut            []string        `json:"denyOut,omitempty"`
	DNSServers         []string        `json:"dnsServers,omitempty"`
	Rules              json.RawMessage `json:"rules,omitempty"`
	AllowPublicTraffic *bool           `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    string          `json:"maskRequestHost,omitempty"`
	// TrafficAccessToken is minted when AllowPublicTraffic is false.
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
}

// Network decodes a stored sandbox's network configuration.
func Network(sb *store.Sandbox) NetworkConfig {
	var n NetworkConfig
	if len(sb.Network) > 0 {
		_ = json.Unmarshal(sb.Network, &n) // written only by this package
	}
	return n
}

func (m *Manager) clampTimeout(d time.Duration) (time.Duration, error) {
	if d < 0 {
		return 0, errdefs.New(errdefs.ErrInvalidArgument, "timeout must not be negative")
	}
	if d == 0 {
		d = m.cfg.DefaultTimeout
	}
	return min(d, m.cfg.MaxTimeout), nil
}

// newID returns a sandbox id: 20 lowercase hex-and-letters characters from
// crypto/rand, matching E2B's `[a-z0-9]+` id format.
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Create starts a sandbox for the tenant in ctx: validate, admit (a
// ticket), create it in the backend or claim a warm member, init its envd,
// commit. On any failure nothing is left: not the backend's sandbox and not
// the store row.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (*store.Sandbox, error) {
	t, ok := tenant.FromContext(ctx)
	if !ok {
		return nil, errdefs.New(errdefs.ErrUnauthenticated, "no tenant")
	}
	start := m.now()
	timeout, err := m.clampTimeout(req.Timeout)
	if err != nil {
		return nil, err
	}
	if err := m.validateCreate(req); err != nil {
		return nil, err
	}
	alias := req.Template
	if m.cfg.Templates != nil && req.Template != "" {
		backend, ok, err := m.cfg.Templates.Resolve(ctx, t, req.Template)
		if err != nil {
			return nil, err
		}
		if ok {
			req.Template = backend
		}
	}
	key := m.PoolKey(t, req)
	if err := m.adm.checkFits(key); err != nil {
		return nil, err
	}
	sb, err := m.newRow(key, req, start, timeout)
	if err != nil {
		return nil, err
	}
	if alias != sb.Template {
		sb.Alias = alias
	}
	if err := m.create(ctx, sb, key, start, createExtra{mounts: mounts(req.Volumes)}); err != nil {
		m.audit(ctx, "create", sb, err)
		return nil, err
	}
	m.recordVolumes(ctx, sb, req.Volumes)
	return sb, nil
}

// mounts are the backend's mounts of vols.
func mounts(vols []store.SandboxVolume) []runtime.Mount {
	out := make([]runtime.Mount, 0, len(vols))
	for _, v := range vols {
		out = append(out, runtime.Mount{Volume: v.VolumeID, Path: v.Path})
	}
	return out
}

// recordVolumes keeps what sandbox sb mounts (what GET reports; the
// backend's spec is what mounts them), with an audit line each.
func (m *Manager) recordVolumes(ctx context.Context, sb *store.Sandbox, vols []store.SandboxVolume) {
	if len(vols) == 0 {
		return
	}
	if err := m.store.SetSandboxVolumes(context.WithoutCancel(ctx), sb.ID, vols); err != nil {
		m.log.ErrorContext(ctx, "record volume mounts", "tenant", sb.Tenant, "sandbox_id", sb.ID, "err", err)
	}
	for _, v := range vols {
		m.log.InfoContext(ctx, "volume mounted", "audit", true, "tenant", sb.Tenant, "sandbox_id", sb.ID, "volume_id", v.VolumeID,
			"volume_name", v.Name, "path", v.Path)
	}
}

func (m *Manager) validateCreate(req CreateRequest) error {
	if req.CPUCount < 0 || req.MemoryMB < 0 || req.DiskMB < 0 {
		return errdefs.New(errdefs.ErrInvalidArgument, "resources must not be negative")
	}
	if req.CPUCount > m.cfg.MaxCPU {
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(
			"CPU count %d exceeds the limit of %d CPUs per sandbox", req.CPUCount, m.cfg.MaxCPU))
	}
	if req.DiskMB > m.cfg.MaxDiskMB {
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(
			"disk size %d MiB exceeds the limit of %d MiB per sandbox", req.DiskMB, m.cfg.MaxDiskMB))
	}
	if err := validateEnv(req.EnvVars); err != nil {
		return err
	}
	p, err := egressPolicy(req.Network)
	if err != nil {
		return err
	}
	if err := m.checkPolicy(p, req.AllowInternet); err != nil {
		return err
	}
	if req.IdleTTL < 0 {
		return errdefs.New(errdefs.ErrInvalidArgument, "idle TTL must not be negative")
	}
	return nil
}

// newRow is the row of a new sandbox, as "creating": its tenant, template
// and resources are key's (the request with its defaults resolved).
func (m *Manager) newRow(key pool.Key, req CreateRequest, start time.Time, timeout time.Duration) (*store.Sandbox, error) {
	sb := &store.Sandbox{
		ID:                  newID(),
		Tenant:              key.Tenant,
		Template:            key.Template,
		State:               store.StateCreating,
		StartedAt:           start.UTC(),
		EndAt:               start.Add(timeout).UTC(),
		CPUCount:            key.CPUCount,
		MemoryMB:            key.MemoryMB,
		DiskMB:              key.DiskMB,
		Metadata:            req.Metadata,
		EnvVars:             req.EnvVars,
		Secure:              req.Secure,
		AllowInternetAccess: req.AllowInternet,
		Lifecycle:           req.Lifecycle,
		Backend:             m.cfg.BackendName,
		IdleTTL:             req.IdleTTL,
		Timeout:             timeout,
	}
	if req.IdleTTL > 0 {
		sb.LastActiveAt = start.UTC()
	}
	if req.Secure {
		sb.EnvdAccessToken = newToken()
	}
	if req.Network != nil {
		n := *req.Network
		if n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic {
			n.TrafficAccessToken = newToken()
		}
		raw, err := json.Marshal(n)
		if err != nil {
			return nil, fmt.Errorf("encode network config: %w", err)
		}
		sb.Network = raw
	}
	return sb, nil
}

// createExtra is what a create takes beside its row.
type createExtra struct {
	// forkOf: the sandbox whose files it starts with (runtime.Spec.ForkOf).
	forkOf string
	// mounts: the volumes it mounts.
	mounts []runtime.Mount
}

// create admits sb, brings it up and commits it; on failure it leaves
// nothing behind. extra makes it a fork or mounts volumes; either makes
// it the backend's create, never a warm member's claim.
//
// A claimed member whose envd does not take its /init (it died while
// warm: killed, out of memory, or its cluster member died) is the pool's
// failure, not the caller's: the member is destroyed, and the create goes
// on with another claim (which skips members the backend cannot reach
// now), then, if that one fails too, as a cold one, as if the claims had
// missed. A cold create's failure is the caller's error, and so is any
// failure once the caller's ctx is done.
func (m *Manager) create(ctx context.Context, sb *store.Sandbox, key pool.Key, start time.Time, extra createExtra) (err error) {
	ctx, span := tracer.Start(ctx, "sandbox.create", trace.WithAttributes(
		attribute.String("sandbox.id", sb.ID), attribute.String("tenant", string(sb.Tenant)), attribute.String("sandbox.template", sb.Template)))
	defer func() { telemetry.End(span, err) }()
	cold := extra.forkOf != "" || len(extra.mounts) > 0
	for _, then := range []string{"claiming another", "creating cold instead"} {
		bad, err := m.createOnce(ctx, span, sb, key, start, extra, cold)
		if bad == nil || ctx.Err() != nil {
			return err
		}
		// Its ticket is released and the member being destroyed: the
		// retry holds nothing of the attempt but the row to be, which
		// gets an id (and token) of its own, as newRow mints them; the
		// member's are gone with it.
		servedFrom := "pool"
		if bad.Key.IsSpare() {
			servedFrom = "spare"
		}
		m.log.WarnContext(ctx, "claimed member failed (its envd's /init, or not running): destroyed, "+then,
			"sandbox_id", bad.ID, "tenant", string(sb.Tenant), "template", sb.Template, "served_from", servedFrom, "err", err)
		if m.cfg.OnClaimFallback != nil {
			m.cfg.OnClaimFallback(sb.Template, servedFrom)
		}
		sb.ID = newID()
		if sb.Secure {
			sb.EnvdAccessToken = newToken()
		}
		span.SetAttributes(attribute.String("sandbox.id", sb.ID), attribute.String("sandbox.claim_failed", bad.ID))
	}
	_, err = m.createOnce(ctx, span, sb, key, start, extra, true)
	return err
}

// createOnce is one attempt of create: admitted cold, or as a claim unless
// cold. On failure it leaves nothing behind; bad is the claimed member when
// the failure was its envd's /init (create's cue to retry cold).
func (m *Manager) createOnce(ctx context.Context, span trace.Span, sb *store.Sandbox, key pool.Key, start time.Time, extra createExtra, cold bool) (bad *pool.Member, err error) {
	actx, aspan := tracer.Start(ctx, "sandbox.admit")
	tk, err := m.adm.Admit(actx, AdmitRequest{Sandbox: sb, Key: key, Cold: cold})
	telemetry.End(aspan, err)
	if err != nil {
		return nil, err
	}
	span.SetAttributes(attribute.String("sandbox.served_from", tk.ServedFrom()))
	if tk.Member() != nil {
		span.SetAttributes(attribute.String("sandbox.id", sb.ID)) // the claimed member's
	}
	defer tk.Release() // after the undos below
	r := revert.New()
	defer r.Fail()
	// The log opens before the start command runs, which writes to it
	// (sb.ID is a claimed member's from here).
	m.logs.open(sb.ID)
	r.Add(func() { m.logs.drop(sb.ID) })
	cleanupCtx := context.WithoutCancel(ctx)
	id := sb.ID // create's retry gives sb another while a member's destroy runs
	destroy := func() {
		if derr := m.backend.Destroy(cleanupCtx, id); derr != nil {
			m.log.Error("revert create: destroy", "sandbox_id", id, "served_from", tk.ServedFrom(), "err", derr)
		}
	}

	tAdmitted := m.now()
	initialized := false
	if tk.Member() != nil {
		// In the background: a member that failed is often one whose
		// cluster member died, and its deletion may wait for as long as
		// Incus elects a new leader, which the retry need not.
		r.Add(func() { m.bg.Go(destroy) })
	} else {
		spec := runtime.Spec{
			ID: sb.ID, Template: sb.Template, Group: string(sb.Tenant),
			CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB,
			Env: sb.EnvVars, AccessToken: sb.EnvdAccessToken, AllowInternet: sb.AllowInternetAccess,
			ForkOf: extra.forkOf, Mounts: extra.mounts, Background: tk.Background(),
		}
		if spec.EnvdInit, err = m.envdInitBody(sb); err != nil {
			return nil, fmt.Errorf("create sandbox: %w", err)
		}
		bctx, bspan := tracer.Start(ctx, "backend.create")
		created, err := m.backend.Create(bctx, spec)
		telemetry.End(bspan, err)
		tk.ReleaseSlot() // the slot bounds the backend's work, not the rest
		if err != nil {
			return nil, fmt.Errorf("create sandbox: %w", backendErr(err))
		}
		r.Add(destroy)
		initialized = created != nil && created.EnvdInitialized
	}
	tBackend := m.now()
	// The egress policy goes in beside envd's /init (it is an nft
	// transaction, the longest step of a warm claim with a policy), and
	// before the template's start command or the caller can run anything.
	// A warm member's start command ran under no policy, as a template's
	// build did.
	policyErr := make(chan error, 1)
	go func() { policyErr <- m.applyPolicy(ctx, sb) }()
	deferredInit := !initialized && tk.Member() != nil && m.deferInitAtClaim()
	switch {
	case deferredInit:
		if err := m.claimedAlive(ctx, sb.ID); err != nil {
			<-policyErr
			return tk.Member(), fmt.Errorf("create sandbox: claimed member: %w", err)
		}
	case !initialized:
		ictx, ispan := tracer.Start(ctx, "envd.init")
		err := m.initEnvd(ictx, sb)
		telemetry.End(ispan, err)
		if err != nil {
			<-policyErr
			return tk.Member(), fmt.Errorf("create sandbox: init envd: %w", err)
		}
	}
	if err := <-policyErr; err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	if cfg, ok := m.templateConfig(sb.Template); ok && cfg.StartCmd != "" && tk.Member() == nil {
		// A warm member ran it before it was claimed.
		sctx, sspan := tracer.Start(ctx, "template.start_command")
		err := m.startTemplate(sctx, sb.ID, sb.EnvdAccessToken, cfg)
		telemetry.End(sspan, err)
		if err != nil {
			return nil, fmt.Errorf("create sandbox: %w", err)
		}
	}
	tInit := m.now()
	// The timeout runs from the hand-over, not from the request: a cold
	// create that took seconds (Incus under load) must not eat into a short
	// timeout. startedAt moves with it, so endAt − startedAt stays the
	// timeout, as E2B reports them.
	sb.StartedAt, sb.EndAt = tInit.UTC(), tInit.Add(sb.Timeout).UTC()
	if sb.IdleTTL > 0 {
		sb.LastActiveAt = sb.StartedAt
	}
	sb.State = store.StateRunning
	if deferredInit {
		// Before the row says running: DialSandbox routes only to running
		// sandboxes, and must find this one's /init still to send.
		m.uninit.add(sb.ID)
		r.Add(func() { m.uninit.forget(id) })
	}
	if err := tk.Commit(ctx); err != nil {
		return nil, err
	}
	r.Success()
	if deferredInit {
		row := *sb
		m.bg.Go(func() { _ = m.initDeferred(context.WithoutCancel(ctx), &row, "claim") })
	}
	took := m.now().Sub(start)
	if m.cfg.OnCreateFrom != nil {
		m.cfg.OnCreateFrom(sb.Template, tk.ServedFrom(), took)
	} else if m.cfg.OnCreate != nil {
		m.cfg.OnCreate(sb.Template, took)
	}
	action, from := "create", []any{}
	if extra.forkOf != "" {
		action, from = "fork", []any{"fork_of", extra.forkOf}
	}
	m.audit(ctx, action, sb, nil, append(from, "took_ms", took.Milliseconds(), "timeout_s", int(sb.Timeout.Seconds()),
		"served_from", tk.ServedFrom(), "waited_ms", tk.Waited().Milliseconds(),
		// Where the time went: quota, claim, wait and row; the backend's
		// create (0 from a pool); envd's /init; the rest (row update).
		"admit_ms", tAdmitted.Sub(start).Milliseconds(), "backend_ms", tBackend.Sub(tAdmitted).Milliseconds(),
		"init_ms", tInit.Sub(tBackend).Milliseconds(), "envd_init", envdInitWhen(initialized, deferredInit))...)
	return nil, nil
}

// envdInitWhen says, for a create's audit line, how its envd got /init:
// as the backend's readiness probe, from the create, or after it (in the
// background, or by the first request to reach the sandbox).
func envdInitWhen(byBackend, deferred bool) string {
	switch {
	case byBackend:
		return "backend"
	case deferred:
		return "deferred"
	}
	return "create"
}

// tracer is the lifecycle's: a span per create (and fork), with one for
// each of its steps, the same steps as the audit line's *_ms.
var tracer = otel.Tracer("github.com/sandboxd/sandboxd/sandbox")

// TemplateResources returns the resources a sandbox of template gets when
// its create names none: the template's own (runtime.TemplateResourcer),
// else the configured defaults, lowered to the per-sandbox caps. Clamped
// here, the row and what the API reports (getInfo, the template list) say
// what is in force; a request above a cap never gets this far
// (validateCreate refuses it).
func (m *Manager) TemplateResources(template string) runtime.Resources {
	var r runtime.Resources
	if cfg, ok := m.templateConfig(template); ok {
		r = cfg.Resources
	} else if tr, ok := m.backend.(runtime.TemplateResourcer); ok {
		r, _ = tr.TemplateResources(template)
	}
	return runtime.Resources{
		CPUCount:   min(cmpOr(r.CPUCount, m.cfg.DefaultCPU), m.cfg.MaxCPU),
		MemoryMB:   cmpOr(r.MemoryMB, m.cfg.DefaultMemoryMB),
		DiskSizeMB: min(cmpOr(r.DiskSizeMB, m.cfg.DefaultDiskMB), m.cfg.MaxDiskMB),
	}
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// Get returns a sandbox of the tenant in ctx; a foreign or killed sandbox is
// ErrNotFound, exactly like a missing one.
func (m *Manager) Get(ctx context.Context, id string) (*store.Sandbox, error) {
	t, _ := tenant.FromContext(ctx)
	sb, err := m.store.GetSandbox(ctx, t, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	// A sandbox being killed is gone already to the API, as lists leave
	// it out: a kill is never undone (the sweeper finishes a failed one).
	if !sb.State.Live() || sb.State == store.StateKilling {
		return nil, notFound(id, errdefs.ErrNotFound)
	}
	return &sb, nil
}

func notFound(id string, err error) error {
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("sandbox %q not found", id))
	}
	return err
}

// List returns a page of the tenant's sandboxes.
func (m *Manager) List(ctx context.Context, f store.ListFilter) ([]store.Sandbox, string, error) {
	t, _ := tenant.FromContext(ctx)
	f.Tenant = t
	return m.store.ListSandboxes(ctx, f)
}

// Kill destroys a sandbox. Killing a killed or missing one is ErrNotFound.
func (m *Manager) Kill(ctx context.Context, id string) error {
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	return m.kill(ctx, sb, "kill")
}

// kill runs with the sandbox's lock held. attrs go to its audit line.
func (m *Manager) kill(ctx context.Context, sb *store.Sandbox, reason string, attrs ...any) error {
	prev := sb.State
	if prev == store.StateRunning {
		m.pullEnvdLogs(ctx, sb.ID, sb.EnvdAccessToken) // its last lines
	}
	sb.State = store.StateKilling
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		sb.State = prev
		m.audit(ctx, reason, sb, err, attrs...)
		return err
	}
	// From here the sandbox is no longer listed and no new connection is
	// dialled into it (DialSandbox wants "running"); the proxy's pooled
	// ones go now too, not after the destroy. Under load a destroy takes
	// tens of milliseconds, and meanwhile a pooled connection still reached
	// the dying envd: a client that had seen the sandbox gone from the list
	// got its /health answered, so the SDKs' isRunning() said true.
	m.runStopHooks(sb.ID)
	if err := m.backend.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
		// The row stays "killing": the sweeper and Reconcile retry it.
		m.audit(ctx, reason, sb, err, attrs...)
		return fmt.Errorf("kill sandbox %s: %w", sb.ID, backendErr(err))
	}
	m.stopped(sb.ID)
	m.adm.forget(sb.ID)
	m.ended(sb.ID)
	sb.State = store.StateKilled
	sb.EndAt = m.now().UTC()
	err := m.store.UpdateSandbox(ctx, sb)
	m.audit(ctx, reason, sb, err, attrs...)
	return err
}

// destroyUninitialised kills a sandbox whose envd was started afresh and
// could not be given its /init. Such an envd takes any token on its first
// /init and runs anyone's commands meanwhile, so the sandbox must not run
// on: it is destroyed, with cause on the audit line. Runs with the lock
// held.
func (m *Manager) destroyUninitialised(ctx context.Context, sb *store.Sandbox, cause error) {
	ctx = context.WithoutCancel(ctx)
	err := m.kill(ctx, sb, "kill_uninitialised", "cause", cause.Error())
	if err == nil || sb.State == store.StateKilling {
		return // killed, or "killing" (not routed; the sweeper retries)
	}
	// The row could not be written: destroy it all the same. Its row is
	// not routed to (it is not running) and Reconcile marks it killed.
	if derr := m.backend.Destroy(ctx, sb.ID); derr != nil {
		m.log.Error("destroy uninitialised sandbox", "sandbox_id", sb.ID, "err", derr)
		return
	}
	m.stopped(sb.ID)
	m.ended(sb.ID)
}

// ended drops what the Manager keeps of a killed sandbox: its metrics
// history now, its log after KilledRetention (Sweep), as the store its row.
func (m *Manager) ended(id string) {
	m.uninit.forget(id)
	m.history.forget(id)
	m.logs.end(id, m.now())
}

// Pause stops a running sandbox. A paused one is ErrConflict (E2B's 409).
// memory=true freezes its processes; memory=false (E2B's filesystem-only
// pause) ends them and keeps only its filesystem, and resume starts it
// afresh. A backend that cannot pause to disk pauses in memory instead: the
// sandbox then resumes exactly where it was, a superset of what was asked.
func (m *Manager) Pause(ctx context.Context, id string, memory bool) error {
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	return m.pause(ctx, sb, "pause", memory)
}

func (m *Manager) pause(ctx context.Context, sb *store.Sandbox, reason string, memory bool) error {
	if sb.State == store.StatePaused {
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("sandbox %q is already paused", sb.ID))
	}
	if sb.State != store.StateRunning {
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("sandbox %q is %s", sb.ID, sb.State))
	}
	// Its lines so far: a paused envd cannot be read, and one paused to
	// disk does not come back.
	m.pullEnvdLogs(ctx, sb.ID, sb.EnvdAccessToken)
	kind := runtime.PauseMemory
	if !memory {
		kind = runtime.PauseDisk
		// A pause to disk that fails late starts the sandbox afresh
		// (ErrRestarted), with an envd that has not had its /init. The row
		// says "pausing" until that is settled: the proxy routes only to
		// running sandboxes, and after a crash Reconcile re-inits it.
		sb.State = store.StatePausing
		if err := m.store.UpdateSandbox(ctx, sb); err != nil {
			sb.State = store.StateRunning
			m.audit(ctx, reason, sb, err, "memory", memory)
			return err
		}
	}
	err := m.backend.Pause(ctx, sb.ID, kind)
	if kind == runtime.PauseDisk && errors.Is(err, runtime.ErrUnsupported) {
		kind = runtime.PauseMemory
		err = m.backend.Pause(ctx, sb.ID, kind)
	}
	if err != nil {
		cctx := context.WithoutCancel(ctx)
		if errors.Is(err, runtime.ErrRestarted) {
			// It runs on, afresh: its new envd needs its /init.
			if ierr := m.initEnvd(cctx, sb); ierr != nil {
				err = fmt.Errorf("%w (and init envd after the restart: %w)", err, ierr)
				m.audit(ctx, reason, sb, err, "memory", memory)
				m.destroyUninitialised(cctx, sb, err)
				return fmt.Errorf("pause sandbox %s: %w", sb.ID, backendErr(err))
			}
		}
		if sb.State == store.StatePausing {
			// It runs on, initialised (its old envd, or the new one).
			sb.State = store.StateRunning
			if uerr := m.store.UpdateSandbox(cctx, sb); uerr != nil {
				sb.State = store.StatePausing
				err = fmt.Errorf("%w (and marking it running again: %w)", err, uerr)
			}
		}
		m.audit(ctx, reason, sb, err, "memory", memory)
		return fmt.Errorf("pause sandbox %s: %w", sb.ID, backendErr(err))
	}
	m.stopped(sb.ID)
	if kind == runtime.PauseDisk {
		m.adm.pausedToDisk(sb.ID)
	}
	sb.State = store.StatePaused
	err = m.store.UpdateSandbox(ctx, sb)
	m.audit(ctx, reason, sb, err, "memory", memory, "kind", kind.String())
	return err
}

// unsettled reports whether a row is left in the middle of a pause to disk
// or a resume: found so under the sandbox's lock, the operation failed half
// way (or sandboxd died), and its envd may never have had its /init. A
// resume settles it.
func unsettled(s store.State) bool { return s == store.StatePausing || s == store.StateResuming }

// Connect makes sure a sandbox runs and extends its end time to at least
// now+timeout; it never shortens a running one's. A paused one is resumed
// with an end of exactly now+timeout, as E2B's connect does: its paused time
// does not count. resumed says whether it was paused (E2B answers 201 then,
// 200 otherwise).
func (m *Manager) Connect(ctx context.Context, id string, timeout time.Duration) (sb *store.Sandbox, resumed bool, err error) {
	timeout, err = m.clampTimeout(timeout)
	if err != nil {
		return nil, false, err
	}
	unlock := m.lock(id)
	defer unlock()
	sb, err = m.Get(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if sb.State == store.StatePaused || unsettled(sb.State) {
		if err := m.resume(ctx, sb, "resume", timeout); err != nil {
			return nil, false, err
		}
		resumed = true
	}
	if sb.State != store.StateRunning {
		return nil, false, errdefs.New(errdefs.ErrConflict, fmt.Sprintf("sandbox %q is %s", id, sb.State))
	}
	if end := m.now().Add(timeout).UTC(); end.After(sb.EndAt) {
		sb.EndAt = end
		if err := m.store.UpdateSandbox(ctx, sb); err != nil {
			return nil, false, err
		}
	}
	return sb, resumed, nil
}

// Resume continues a paused sandbox (E2B's legacy /resume). A running one is
// ErrConflict.
func (m *Manager) Resume(ctx context.Context, id string, timeout time.Duration) (*store.Sandbox, error) {
	timeout, err := m.clampTimeout(timeout)
	if err != nil {
		return nil, err
	}
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State != store.StatePaused && !unsettled(sb.State) {
		return nil, errdefs.New(errdefs.ErrConflict, fmt.Sprintf("sandbox %q is already running", id))
	}
	if err := m.resume(ctx, sb, "resume", timeout); err != nil {
		return nil, err
	}
	return sb, nil
}

// resume runs a paused (or unsettled) sandbox again. Its row says
// "resuming" from before the backend is asked until envd has its /init:
// the proxy does not route to it meanwhile, and if sandboxd dies in
// between, Reconcile re-inits or destroys it. A sandbox whose envd cannot
// be initialised is put back to disk, or destroyed: never left running
// with an envd that takes anyone's token. Once it runs, its end is
// now+timeout: the time it spent paused does not count against it.
func (m *Manager) resume(ctx context.Context, sb *store.Sandbox, reason string, timeout time.Duration) error {
	prior := sb.State
	cctx := context.WithoutCancel(ctx)
	onDisk := m.adm.onDisk(sb.ID)
	if onDisk {
		// On disk it held no memory: it must fit again, as a create must.
		if err := m.adm.AdmitResume(ctx, sb); err != nil {
			m.audit(ctx, reason, sb, err)
			return err
		}
	}
	backToDisk := func() {
		if onDisk {
			m.adm.pausedToDisk(sb.ID)
		}
	}
	sb.State = store.StateResuming
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		sb.State = prior
		backToDisk()
		m.audit(ctx, reason, sb, err)
		return err
	}
	restarted, err := m.backend.Resume(ctx, sb.ID)
	if err != nil {
		backToDisk()
		sb.State = store.StatePaused
		if uerr := m.store.UpdateSandbox(cctx, sb); uerr != nil {
			sb.State = store.StateResuming // still not routed; a retry settles it
			err = fmt.Errorf("%w (and marking it paused again: %w)", err, uerr)
		}
		m.audit(ctx, reason, sb, err)
		return fmt.Errorf("resume sandbox %s: %w", sb.ID, backendErr(err))
	}
	// A sandbox paused to disk runs a new envd: it gets its env vars, token
	// and default user again, exactly as at create. So does one whose last
	// pause or resume did not finish, even if the backend found it running
	// (Resume's false, nil): its envd may never have had its /init.
	if restarted || onDisk || prior != store.StatePaused {
		// Not the caller's ctx: the backend has resumed it; a client that
		// goes away now must not cost it its /init.
		if err := m.initEnvd(cctx, sb); err != nil {
			err = fmt.Errorf("resume sandbox %s: init envd: %w", sb.ID, err)
			// Back to disk, so that a retry starts over.
			perr := m.backend.Pause(cctx, sb.ID, runtime.PauseDisk)
			if perr == nil {
				m.stopped(sb.ID)
				m.adm.pausedToDisk(sb.ID)
				sb.State = store.StatePaused
				if uerr := m.store.UpdateSandbox(cctx, sb); uerr != nil {
					err = fmt.Errorf("%w (and marking it paused again: %w)", err, uerr)
				}
				m.audit(ctx, reason, sb, err)
				return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
			}
			// Still running (a pause to disk that restarted it, or one the
			// backend cannot do), with an envd that never had its /init.
			err = fmt.Errorf("%w (and pausing it again failed: %w)", err, perr)
			m.audit(ctx, reason, sb, err)
			m.destroyUninitialised(cctx, sb, err)
			return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
		}
	}
	sb.State = store.StateRunning
	now := m.now()
	sb.EndAt = now.Add(timeout).UTC()
	if sb.IdleTTL > 0 {
		sb.LastActiveAt = now.UTC() // its idle time starts over
	}
	err = m.store.UpdateSandbox(ctx, sb)
	m.audit(ctx, reason, sb, err, "restarted", restarted)
	if err == nil {
		// Its follower stopped at the pause; a start command that runs on
		// (paused in memory) is followed again.
		m.attachStart(sb.ID, sb.Template, sb.EnvdAccessToken)
	}
	return err
}

// SetTimeout sets the end time to now+timeout, shorter or longer. As in
// E2B, zero means now and a negative timeout is zero: the sandbox's
// on-timeout action (kill, or pause under auto-pause) runs at once, as the
// SDKs rely on to force an auto-pause, so the sweeper is woken for it.
func (m *Manager) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	timeout = min(max(timeout, 0), m.cfg.MaxTimeout)
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	sb.EndAt = m.now().Add(timeout).UTC()
	err = m.store.UpdateSandbox(ctx, sb)
	m.audit(ctx, "set_timeout", sb, err, "timeout_s", int(timeout.Seconds()))
	if err == nil && timeout == 0 {
		m.wakeSweeper()
	}
	return err
}

// Refresh extends the end time by d from now, never shortening it.
func (m *Manager) Refresh(ctx context.Context, id string, d time.Duration) error {
	if d <= 0 {
		d = m.cfg.DefaultTimeout
	}
	d = min(d, m.cfg.MaxTimeout)
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	if end := m.now().Add(d).UTC(); end.After(sb.EndAt) {
		sb.EndAt = end
		err = m.store.UpdateSandbox(ctx, sb)
	}
	m.audit(ctx, "refresh", sb, err, "duration_s", int(d.Seconds()))
	return err
}

// Stats reports a sandbox's resource use.
func (m *Manager) Stats(ctx context.Context, id string) (*store.Sandbox, runtime.Stats, error) {
	sb, err := m.Get(ctx, id)
	if err != nil {
		return nil, runtime.Stats{}, err
	}
	st, err := m.backend.Stats(ctx, id)
	if err != nil {
		// A kill that began meanwhile explains the failure (Incus answers
		// 500 for the state of an instance being stopped): answer as a
		// call after the kill would, not as a backend fault.
		if _, gerr := m.Get(ctx, id); gerr != nil {
			return nil, runtime.Stats{}, gerr
		}
		return nil, runtime.Stats{}, fmt.Errorf("stats of sandbox %s: %w", id, backendErr(err))
	}
	return sb, st, nil
}

// DialSandbox reaches port inside any tenant's sandbox, for the data-plane
// proxy (which envd's access token and the traffic token protect, as in
// E2B). A paused sandbox with auto-resume is resumed first.
func (m *Manager) DialSandbox(ctx context.Context, id string, port int) (net.Conn, error) {
	sb, err := m.store.GetSandboxAny(ctx, id)
	if err != nil || !sb.State.Live() {
		return nil, errdefs.ErrNotFound
	}
	if unsettled(sb.State) {
		// A pause or resume in progress holds the lock: wait for it.
		m.lock(id)()
		if sb, err = m.store.GetSandboxAny(ctx, id); err != nil {
			return nil, errdefs.ErrNotFound
		}
	}
	switch {
	case sb.State == store.StatePaused && sb.Lifecycle.AutoResume:
		if err := m.autoResume(ctx, id); err != nil {
			return nil, err
		}
	case sb.State != store.StateRunning:
		// Only a running sandbox's envd is known to have had its /init.
		return nil, errdefs.ErrNotFound
	}
	m.touch(ctx, m.remember(&sb))
	if err := m.initDeferred(ctx, &sb, "dial"); err != nil {
		return nil, fmt.Errorf("dial sandbox %s port %d: deferred envd /init: %w", id, port, backendErr(err))
	}
	conn, err := m.backend.Dial(ctx, id, port)
	if err != nil {
		return nil, fmt.Errorf("dial sandbox %s port %d: %w", id, port, backendErr(err))
	}
	// A pause to disk may have restarted it since the read above; the row
	// says "pausing" from before that until its new envd has its /init.
	// Running now means every request on conn reaches an initialised envd.
	if now, err := m.store.GetSandboxAny(ctx, id); err != nil || now.State != store.StateRunning {
		conn.Close()
		return nil, errdefs.ErrNotFound
	}
	return conn, nil
}

func (m *Manager) autoResume(ctx context.Context, id string) error {
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.store.GetSandboxAny(ctx, id)
	if err != nil {
		return errdefs.ErrNotFound
	}
	switch sb.State {
	case store.StateRunning:
		return nil // resumed by someone else meanwhile
	case store.StatePaused:
		return m.resume(ctx, &sb, "auto_resume", m.ownTimeout(&sb))
	}
	return errdefs.ErrNotFound
}

// ownTimeout is the timeout an auto-resume gives sb: the one its create
// asked for, as E2B's auto-resume does (the request that wakes it names
// none). A row from before sandboxd stored it (zero) gets the server's
// default; the store never holds a negative one.
func (m *Manager) ownTimeout(sb *store.Sandbox) time.Duration {
	d, _ := m.clampTimeout(sb.Timeout)
	return d
}

// PortAccess is what the proxy applies to requests for a sandbox's ports
// other than envd's: the token they must carry, or "", and the Host they
// reach it with (E2B's maskRequestHost), or "".
func (m *Manager) PortAccess(ctx context.Context, id string) (token, maskHost string, err error) {
	sb, err := m.store.GetSandboxAny(ctx, id)
	if err != nil || !sb.State.Live() {
		return "", "", errdefs.ErrNotFound
	}
	n := Network(&sb)
	return n.TrafficAccessToken, n.MaskRequestHost, nil
}

// backendErr maps runtime errors to errdefs kinds, keeping the cause.
func backendErr(err error) error {
	kind := errdefs.ErrUnavailable
	switch {
	case errors.Is(err, runtime.ErrNotFound), errors.Is(err, runtime.ErrNotRunning):
		kind = errdefs.ErrNotFound
	case errors.Is(err, runtime.ErrTemplateNotFound):
		return errdefs.New(errdefs.ErrInvalidArgument, "template not found")
	case errors.Is(err, runtime.ErrInvalidSpec):
		kind = errdefs.ErrInvalidArgument
	case errors.Is(err, runtime.ErrAlreadyExists):
		kind = errdefs.ErrConflict
	case errors.Is(err, runtime.ErrPaused):
		kind = errdefs.ErrConflict
	case errors.Is(err, runtime.ErrUnsupported):
		// What the backend cannot do is the caller's to know, in its
		// words: "per-sandbox network rules on an Incus cluster", not a
		// bare "Not Implemented".
		return errdefs.New(errdefs.ErrNotImplemented, err.Error())
	case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, errdefs.ErrNotFound):
		return err
	}
	return fmt.Errorf("%w: %w", kind, err)
}

// Limits of what a sandbox's environment can carry: the kernel refuses a
// single "K=V" string of 128 KiB or more at exec, and envd's /init body is
// bounded at 1 MiB. Checked up front so that a too-large environment is the
// client's 400, not a failed start.
const (
	maxEnvEntry = 128<<10 - 1
	maxEnvTotal = 768 << 10
)

func validateEnv(env map[string]string) error {
	total := 0
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("env var %q: names must be non-empty without '=' or NUL, values without NUL", k))
		}
		n := len(k) + 1 + len(v)
		if n > maxEnvEntry {
			return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("env var %q: %d bytes, at most %d", k, n, maxEnvEntry))
		}
		total += n
	}
	if total > maxEnvTotal {
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("env vars: %d bytes in all, at most %d", total, maxEnvTotal))
	}
	return nil
}
