// Package local is the embedded runtime.Backend: each sandbox is a Linux
// container in runc's libcontainer's terms, with no daemon and no
// per-sandbox helper process. sandboxd-spawn (Options.SpawnPath, package
// spawn), a small C program executed once per create, starts it: it clones
// the sandbox's init into its namespaces and cgroup, sets up its root and
// executes envd, and sandboxd writes the state libcontainer would have
// written. libcontainer does everything after the start (pause, stats,
// signals, destroy), and starts the sandboxes sandboxd-spawn does not (none
// of today's configs, or every one without SpawnPath): then one small Go
// helper, sandboxd-init (Options.InitPath, package starter), makes its
// calls, so that the init libcontainer re-executes is that binary and not
// sandboxd. Everything else happens in the sandboxd process.
//
// A sandbox has its own mount, pid, uts, ipc, net and cgroup namespaces
// (and a user namespace where the host supports it: Options.UserNS, DEPS.md); its
// root is an overlayfs whose lower layer is the template (read-only) and
// whose upper and work directories live on a per-sandbox tmpfs sized by
// DiskSizeMB; cgroup limits bound its memory, pids and CPU; it runs with a
// reduced capability set, no_new_privs, runc's masked /proc paths and, when
// built with -tags seccomp, a seccomp deny list. On cgroup v2-only hosts
// its cgroup is a delegated subtree, mounted at /sys/fs/cgroup inside: its
// root may make child cgroups (at most 256, 4 deep), move its processes
// into them and limit them, but not change the sandbox's own limits (see
// delegateCgroup). envd is bind-mounted
// read-only, from the backend's copy on a tmpfs with huge pages (<Root>/envd,
// made by New: see copyEnvd), and started as the sandbox's init; sandboxd
// reaches it over a unix socket in a per-sandbox host directory
// bind-mounted into the sandbox, so no network is needed. The network
// namespace has loopback only, unless the spec allows internet access: then
// a veth pair, routing and nftables masquerading give it egress (see
// net.go), never to the host itself, to other sandboxes or, unless
// Options.EgressAllow says so, to private and special-purpose ranges.
//
// Everything a sandbox holds on the host lives under one directory,
// <Root>/sandboxes/<id>, plus its cgroup <CgroupParent>/<id> and, with
// internet access, a veth whose name derives from the id:
//
//	meta.json        the spec it was created with (written last: a
//	                 directory without it is a failed or interrupted create)
//	disk/            tmpfs of DiskSizeMB, holding all the sandbox can write:
//	  upper/ work/   the overlay's layers
//	  envd/          envd's socket directory, bound at /run/envd inside
//	                 only when libcontainer starts the sandbox: envd
//	                 binds its socket there
//	  envd.log       envd's stdout and stderr
//	envd.sock        envd's socket when sandboxd-spawn starts it: bound
//	                 here by sandboxd and handed to envd (envdHostSocket)
//	rootfs/          the overlay mount, the sandbox's /
//	ctr/             libcontainer's state (state.json; sandboxd writes it
//	                 for a sandbox sandboxd-spawn started)
//	resolv.conf      the sandbox's /etc/resolv.conf, with internet only
//
// A sandbox paused to disk (runtime.PauseDisk) has no process, mount,
// cgroup or veth: only meta.json (saying so) and its upper layer, copied to
// <SaveDir>/<id>/upper with everything overlayfs needs (whiteouts, opaque
// directory xattrs, ownership), next to a copy of meta.json: Root is
// usually a tmpfs, and SaveDir alone makes the sandbox known again after a
// reboot. A pause to disk needs room on SaveDir's filesystem for the layer
// plus a reserve (Options.SaveReserveMB), else it fails with
// runtime.ErrUnsupported before it touches the sandbox. Resume mounts a
// fresh tmpfs, copies the layer back from a child process in the sandbox's
// cgroup (so the pages are charged to the sandbox, as before) and starts
// envd again as init.
//
// Templates built by the control plane (runtime.Layered, layers.go) are
// stacks of layers in <Root>/templates/layers/<key>: an imported image's
// flattened root, or a copy of what a sandbox changed (its upper layer,
// whiteouts and opaque directories included, owners unshifted). A
// sandbox of such a template has the layers, top first, as the overlay's
// lower directories above its base template's, and gets the base's bind
// mounts; meta.json records the directories (lowerDirs), so the sandbox
// keeps them whatever happens to the template. Definitions live in memory
// only (the control plane defines them again after a restart); layers
// stay until RemoveLayer, which refuses while a live sandbox has one.
//
// With user namespaces, <Root>/templates-idmapped is a read-only, idmapped
// view of <Root>/templates, made by New, and <Root>/templates-idmapped-<hash>
// one of each directory template outside Root: the sandboxes' lower layers
// (see DEPS.md). Close detaches them once no sandbox is left under Root.
//
// Sandboxes outlive sandboxd: New re-adopts live ones and those paused to
// disk (from SaveDir, even when Root has none of them), and Reconcile
// removes what dead ones left (mounts, cgroups, directories). It never
// deletes a saved layer with its meta: one no sandbox claims is moved to
// <SaveDir>/.quarantine and logged.
//
// The binary that uses this package must call Init first thing in main
// (and in TestMain): libcontainer starts every sandbox by re-executing
// /proc/self/exe with the argument "init". It needs cgo (libcontainer's
// nsenter); seccomp needs -tags seccomp and libseccomp (see DEPS.md).
package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local/starter"
)

// Init runs libcontainer's container init and never returns when this
// process was started as one (os.Args[1] == "init"); otherwise it returns at
// once. Call it first in main, and in TestMain of tests that create
// sandboxes, before any other work.
func Init() {
	starter.InitIfAsked()
	if len(os.Args) > 1 && os.Args[1] == copyTreeArg {
		copyTreeMain(os.Args[2:]) // exits
	}
	if len(os.Args) > 1 && os.Args[1] == userNSHoldArg {
		userNSHoldMain() // exits
	}
	starter.PinGOMAXPROCS()
}

// Options configure a Backend. Zero fields take the defaults below.
type Options struct {
	// Root holds all host state of the backend. Default /run/sandboxd/local.
	Root string
	// SaveDir keeps the writable layers of sandboxes paused to disk, one
	// directory per sandbox with a copy of its meta. It should be on a
	// disk: under /run it takes the host's memory, and sandboxes paused
	// to disk do not survive a reboot. Default <Root>/saved.
	SaveDir string
	// VolumeDir keeps the volumes (runtime.VolumeStore), one directory
	// per volume with its ext4 image. It must be on a disk for volumes to
	// outlive a reboot. Default <Root>/volumes.
	VolumeDir string
	// SaveReserveMB is what a pause to disk must leave free on SaveDir's
	// filesystem (which may hold more than layers: sandboxd's database),
	// beyond the room of the layer it saves; a pause that would not leave
	// it fails with runtime.ErrUnsupported before it touches the sandbox.
	// Default (0): the larger of 5% of the filesystem and 256 MiB.
	// Negative: none. 5% of the filesystem's inodes are kept free too,
	// unless it is negative.
	SaveReserveMB int
	// EnvdPath is the host path of the static envd binary. Required.
	EnvdPath string
	// InitPath is the host path of sandboxd-init (cmd/sandboxd-init), the
	// helper that makes the libcontainer calls of a start so that the init
	// libcontainer re-executes for every sandbox is that small binary
	// (package starter). Empty: this process makes them and re-executes
	// itself, which costs each start the package inits of this binary.
	InitPath string
	// SpawnPath is the host path of sandboxd-spawn (cmd/sandboxd-spawn), a
	// small C program that starts a sandbox in place of libcontainer's
	// chain (package spawn): about half the CPU of a cold create. A
	// sandbox whose config it does not handle starts through libcontainer
	// (InitPath or this process) as without it. Empty: libcontainer starts
	// every sandbox.
	SpawnPath string
	// CgroupParent is the cgroup (in every hierarchy) under which each
	// sandbox gets <id>. Default /sandboxd.
	CgroupParent string
	// OwnCPUGroup: from the root of the cpu controller's hierarchy, this
	// process moves into a cpu cgroup of its own beside CgroupParent
	// (<CgroupParent>.daemon), weighted as many processes at nice 0 as Go
	// has processors at New, and back at Close (cpugroup.go). CPUGrouped
	// tells the caller it may then run more Go processors than CPUs.
	OwnCPUGroup bool
	// Templates maps extra template names to root filesystems: a directory
	// is used as the read-only lower layer as it is; an image archive (a
	// docker-save tarball, or an OCI layout directory, optionally
	// "LAYOUT:REF") is imported once with ImportOCI into
	// <Root>/templates/oci-<hash of the image> and used from there, with
	// root and user (uid 1000) added to its /etc/passwd and /etc/group
	// where missing. "base" and "host" are built in.
	Templates map[string]string
	// BaseRootfs is the root filesystem directory of the template "base"
	// (scripts/base-rootfs.sh builds one: Debian with Python, Node, git,
	// sudo …), used read-only as its lower layer; a symlink is resolved
	// once, at New, so that a rebuild behind it changes nothing for this
	// backend. Empty: "base" is the host view, as "host".
	BaseRootfs string
	// TemplateResources are the resources templates (of Templates, or
	// "base") declare, reported by TemplateResources for the control plane
	// to resolve a create's defaults with. Zero fields are unset.
	TemplateResources map[string]runtime.Resources
	// PidsMax bounds tasks per sandbox: default 1024.
	PidsMax int
	// EnvdLogLevel is envd's --log-level; its log goes to disk/envd.log
	// in the sandbox's state directory, on its disk tmpfs. Default "warn":
	// at "info" envd logs every process start, which eats into the disk.
	EnvdLogLevel string
	// EgressSubnet is where sandboxes with AllowInternet get their address;
	// its first address is every sandbox's gateway. Default 10.133.0.0/16.
	EgressSubnet netip.Prefix
	// EgressAllow are blocks of egress.DefaultDeny (private and
	// special-purpose ranges: the operator's LAN) that sandboxes with
	// internet access may reach nonetheless.
	EgressAllow []netip.Prefix
	// EgressDNS are the sandboxes' resolvers; none: the host's.
	EgressDNS []netip.Addr
	// Registerer gets the egress name filter's metrics; nil: none.
	Registerer prometheus.Registerer
	// UserNS runs sandboxes in a user namespace: their ids 0-65535 are
	// the host's 1,000,000,000-1,000,065,535, so root inside is no one on
	// the host. Templates are read through idmapped mounts; that needs
	// Linux ≥ 5.19 (overlayfs on idmapped layers; ≥ 6.3 with Root on
	// tmpfs, as the default /run is) and a filesystem that can be idmapped. The default, UserNSAuto, probes the host at New and
	// uses them where it can (see UserNSMode and DEPS.md).
	UserNS UserNSMode
	// LeaveCgroupMount keeps New from turning on the cgroup2 mount option
	// favordynmods, without which a sandbox start that follows no other
	// by more than about 10 ms waits for an RCU grace period (see
	// favorDynMods). By default New turns it on where the kernel has it.
	LeaveCgroupMount bool
	// TrackWriters records which process wrote each file of a sandbox's
	// writable layer (runtime.Change.Writer), with fanotify (writers.go).
	// A kernel that cannot (before 5.17) leaves sandboxes untracked, said
	// once in the log.
	TrackWriters bool
	// StartTimeout bounds Create when ctx has no deadline. Default 30s.
	StartTimeout time.Duration
	// Log receives warnings about cleanup. Default slog.Default().
	Log *slog.Logger
}

// Backend is the local runtime.Backend.
type Backend struct {
	opts    Options
	log     *slog.Logger
	starter *starter.Client // nil: libcontainer's calls are made in this process
	egress  *egress
	swap    bool // memory.memsw.* exists: limit memory+swap too
	seccomp bool
	// bpf is the seccomp profile compiled for sandboxd-spawn, once.
	bpfOnce sync.Once
	bpf     []byte
	bpfErr  error
	// spawnNS is the mount namespace sandboxd-spawn clones sandboxes from
	// (newSpawnMountNS); nil: sandboxd's own.
	spawnNS *os.File
	// memcgs are the memory cgroups of destroyed sandboxes kept for the
	// next creates.
	memcgs *memcgSpares
	// devicesOnce: CgroupParent's device rules are set at the first start
	// through sandboxd-spawn (presetDevices).
	devicesOnce sync.Once
	// fallbackOnce: the first create sandboxd-spawn leaves to libcontainer
	// is logged as a warning, the others at debug.
	fallbackOnce sync.Once
	// envdPath is the host path of the envd binary sandboxes bind-mount:
	// the backend's copy (copyEnvd) or Options.EnvdPath.
	envdPath string
	// userNS: new sandboxes get a user namespace (of templates with
	// template.userNS); set by setupUserNS.
	userNS bool
	// nsDelegate: the cgroup2 mount has nsdelegate, so the kernel refuses
	// writes from inside a cgroup namespace to its root's limits whoever
	// the writer is (see delegates).
	nsDelegate bool

	// nice is this process's nice value at New, its sandboxes' too: a
	// background create's thread runs at another (lowerThreadPriority).
	nice int
	// cpuGroup is this process's own cpu cgroup (Options.OwnCPUGroup).
	cpuGroup cpuGroup
	// cpuParent is CgroupParent's directory in the hierarchy of the cpu
	// controller, found once: a manager's paths cost ≈ 0.3 ms to compute.
	cpuParent func() (string, error)

	viewMu sync.Mutex
	views  map[string]bool // idmapped views of outside templates mounted

	// volMu serializes volume creates and deletes with the mounting of
	// volumes into starting sandboxes (volumes.go).
	volMu sync.Mutex

	mu  sync.Mutex
	sbx map[string]*sandbox // live and in-creation sandboxes
	ips map[netip.Addr]bool // egress addresses of the sandboxes in sbx
	// releasing counts the addresses of destroyed sandboxes waiting for
	// their veth to go (releaseNet).
	releasing sync.WaitGroup
	// saving is what pauses to disk in progress claimed of SaveDir's
	// filesystem (claimSaveRoom).
	saving struct{ bytes, inodes uint64 }
	// tplMu guards templates: New's, and those DefineTemplate adds while
	// creates read them.
	tplMu     sync.RWMutex
	templates map[string]*template
	// layerTemps are the temporary directories of layer writes and
	// removals in progress (under layersDir), which Reconcile leaves alone;
	// guarded by mu.
	layerTemps map[string]bool
	// writers records the sandboxes' writers (Options.TrackWriters); nil:
	// off. writersWarn says once that a kernel cannot.
	writers     *writerTracker
	writersWarn sync.Once
}

var (
	_ runtime.Backend           = (*Backend)(nil)
	_ runtime.Reconciler        = (*Backend)(nil)
	_ runtime.TemplateLister    = (*Backend)(nil)
	_ runtime.TemplateResourcer = (*Backend)(nil)
	_ runtime.Layered           = (*Backend)(nil)
	_ runtime.TemplateEnver     = (*Backend)(nil)
	_ runtime.WriterTracker     = (*Backend)(nil)
)

// sandbox is one sandbox's in-memory handle. mu serializes lifecycle calls
// on it. Lock order: sandbox.mu, then Backend.mu (Destroy removes the
// sandbox from the map while holding its mu); never the other way round.
type sandbox struct {
	id  string
	dir string

	mu   sync.Mutex
	meta meta
	// ctr is libcontainer's handle of the container, nil while paused to
	// disk; after a start through sandboxd-spawn or sandboxd-init it is
	// loaded on first use (loadLater). Read it through container().
	ctr     *libcontainer.Container
	ctrRoot string          // libcontainer's state directory while ctr is still to load; "" once loaded, or with none
	ctrErr  error           // that load's error
	frozen  bool            // paused in memory
	exited  <-chan struct{} // closed when init exits; nil for adopted sandboxes
	gone    bool            // destroyed
	ready   chan struct{}   // closed when Create finished (either way)
	created bool            // Create succeeded
	// layers are the keys of the layers its root is made of (none for a
	// template of the backend): set when s is made, never changed, so
	// that RemoveLayer reads it under Backend.mu alone.
	layers []string
	// initPid is envd's pid (ours) while it runs.
	initPid int
	// killInit SIGKILLs init (a pidfd's, reapChild) when sandboxd-spawn
	// started it; nil otherwise.
	killInit func() error
	// restorePriority gives the thread of a background Create its nice
	// value back (lowerThreadPriority); nil for other creates.
	restorePriority func()
	// writers is its record of writers (Options.TrackWriters), from its
	// start (or adoption) to its destroy; nil when not tracked.
	writers *writerRecord
	// envdOnHost: envd serves on the socket sandboxd bound in dir
	// (envdHostSocket) and handed over, not on one it bound in the disk.
	envdOnHost atomic.Bool
}

// meta is what <dir>/meta.json records.
type meta struct {
	Spec runtime.Spec `json:"spec"`
	// Lowers are the overlay's lower directories, top first: the
	// template's directory, or a stack of layers on one (DefineTemplate).
	Lowers []string `json:"lowerDirs,omitempty"`
	// Base is the template of the backend whose directory is the bottom
	// of Lowers and whose bind mounts the sandbox gets: Spec.Template
	// unless that is a stack of layers; "" for a stack with no base.
	Base string `json:"base,omitempty"`
	// Template is the one lower directory that metas had before layer
	// stacks (see upgrade), still written for a sandbox of a template of
	// the backend, so that an earlier sandboxd can adopt it after a
	// downgrade.
	Template  string    `json:"templateDir,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	Net       *netInfo  `json:"net,omitempty"`
	// Paused is pausedDisk while the sandbox is paused to disk.
	Paused string `json:"paused,omitempty"`
	// UserNS: made with a user namespace; it starts again only with one
	// (and one made without, only without: see startableUserNS).
	UserNS bool `json:"userns,omitempty"`
}

// upgrade turns a meta of an earlier sandboxd (one lower directory,
// Template, of the template named in its spec) into today's form.
func (m *meta) upgrade() {
	if len(m.Lowers) == 0 && m.Template != "" {
		m.Lowers = []string{m.Template}
		m.Base = m.Spec.Template
	}
}

// New prepares Root (writing the host view), re-adopts sandboxes that
// are still alive from an earlier process and returns the Backend. It does
// not remove dead sandboxes' leftovers: call Reconcile for that.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if opts.Root == "" {
		opts.Root = "/run/sandboxd/local"
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = "/sandboxd"
	}
	if opts.SaveDir == "" {
		opts.SaveDir = filepath.Join(opts.Root, "saved")
	}
	if d, err := filepath.Abs(opts.SaveDir); err == nil {
		opts.SaveDir = d // the copy child must find it whatever its cwd
	}
	if opts.VolumeDir == "" {
		opts.VolumeDir = filepath.Join(opts.Root, "volumes")
	}
	if d, err := filepath.Abs(opts.VolumeDir); err == nil {
		opts.VolumeDir = d
	}
	opts.PidsMax = orDefault(opts.PidsMax, 1024)
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if !opts.EgressSubnet.IsValid() {
		opts.EgressSubnet = netip.MustParsePrefix("10.133.0.0/16")
	}
	if opts.EnvdLogLevel == "" {
		opts.EnvdLogLevel = "warn"
	}
	if opts.EnvdPath == "" {
		return nil, fmt.Errorf("local backend: %w: no envd binary given", runtime.ErrUnavailable)
	}
	var err error
	if opts.EnvdPath, err = hostBinary("envd", opts.EnvdPath); err != nil {
		return nil, err
	}
	if opts.InitPath != "" {
		if opts.InitPath, err = hostBinary("sandboxd-init", opts.InitPath); err != nil {
			return nil, err
		}
	}
	if opts.SpawnPath != "" {
		if opts.SpawnPath, err = hostBinary("sandboxd-spawn", opts.SpawnPath); err != nil {
			return nil, err
		}
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("local backend: %w: needs root", runtime.ErrUnavailable)
	}
	created := missingDirs(opts.Root)
	for _, d := range []string{opts.Root, filepath.Join(opts.Root, "sandboxes"), filepath.Join(opts.Root, "templates"), layersDir(opts.Root), opts.SaveDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("local backend: %w", err)
		}
	}
	if opts.UserNS < UserNSAuto || opts.UserNS > UserNSOff {
		return nil, fmt.Errorf("local backend: unknown user namespace mode %v", opts.UserNS)
	}

	b := &Backend{
		cpuParent: sync.OnceValues(func() (string, error) {
			m, err := cgroupManager(opts.CgroupParent)
			if err != nil {
				return "", fmt.Errorf("cgroup %s: %w", opts.CgroupParent, err)
			}
			return m.Path("cpu"), nil // on cgroup v2 the one directory
		}),
		opts:       opts,
		log:        opts.Log,
		seccomp:    seccompEnabled,
		sbx:        map[string]*sandbox{},
		ips:        map[netip.Addr]bool{},
		templates:  map[string]*template{},
		views:      map[string]bool{},
		layerTemps: map[string]bool{},
	}
	if n, err := threadNice(); err == nil {
		b.nice = n
	}
	if opts.InitPath != "" {
		b.starter = starter.New(opts.InitPath)
	}
	if opts.TrackWriters {
		b.writers = newWriterTracker(b.log)
	}
	if exe, err := os.Readlink("/proc/self/exe"); err == nil {
		if sbx, err := filepath.Abs(b.sandboxesDir()); err == nil && nested(filepath.Dir(exe), sbx) {
			b.log.Warn("local backend: the binary's directory and the run dir's sandboxes/ contain one another: "+
				"libcontainer cannot seal the binary with an overlay of the two and copies it at every create "+
				"(about 8 ms for 20 MB); put the binary or the run dir elsewhere", "binary", exe, "sandboxes", sbx)
		}
	}
	if !opts.LeaveCgroupMount {
		if what, err := favorDynMods(); err != nil {
			b.log.Warn("local backend: cgroup favordynmods not turned on: sandbox starts far apart wait for an RCU grace period", "err", err)
		} else {
			b.log.Info("local backend: cgroup favordynmods", "state", what)
		}
	}
	if m, err := cgroup2Mount(); err == nil && m != nil {
		b.nsDelegate = slices.Contains(cgroup2Flags(m), "nsdelegate")
	}
	if b.egress, err = newEgress(opts.EgressSubnet, opts.EgressAllow, opts.EgressDNS); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	b.egress.Observe(b.log.With("component", "egress"), opts.Registerer)
	// Limit memory+swap to the memory limit (no swap) where the kernel
	// accounts swap: v1 with memsw files, or v2 (memory.swap.max).
	_, err = os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	b.swap = err == nil || cgroups.IsCgroup2UnifiedMode()
	b.memcgs = newMemcgSpares(opts.CgroupParent)
	if !b.seccomp {
		b.log.Warn("local backend built without -tags seccomp: sandboxes run without a seccomp " +
			"profile and can create user namespaces (and mount inside them)")
	}

	ents, mounts, err := hostEntries()
	if err != nil {
		return nil, fmt.Errorf("local backend: host template: %w", err)
	}
	hostDir := filepath.Join(opts.Root, "templates", HostTemplate+"-"+digest(ents))
	if err := writeTemplate(hostDir, ents); err != nil {
		return nil, fmt.Errorf("local backend: host template: %w", err)
	}
	b.templates[HostTemplate] = &template{name: HostTemplate, lowers: []string{hostDir}, base: HostTemplate, mounts: mounts}
	if opts.BaseRootfs == "" {
		b.templates[BaseTemplate] = &template{name: BaseTemplate, lowers: []string{hostDir}, base: BaseTemplate, mounts: mounts}
		b.log.Info("local backend: base template is the host view")
	} else {
		dir, err := baseRootfs(opts.BaseRootfs)
		if err != nil {
			return nil, fmt.Errorf("local backend: base template: %w", err)
		}
		b.templates[BaseTemplate] = &template{name: BaseTemplate, lowers: []string{dir}, base: BaseTemplate}
		b.log.Info("local backend: base template", "rootfs", dir)
	}
	for name, r := range opts.TemplateResources {
		if _, ok := opts.Templates[name]; !ok && name != BaseTemplate && name != HostTemplate {
			return nil, fmt.Errorf("local backend: resources for unknown template %q", name)
		}
		if r.CPUCount < 0 || r.MemoryMB < 0 || r.DiskSizeMB < 0 {
			return nil, fmt.Errorf("local backend: template %q: negative resources", name)
		}
	}
	for name, d := range opts.Templates {
		if name == BaseTemplate || name == HostTemplate {
			return nil, fmt.Errorf("local backend: template %q is built in", name)
		}
		lower, env, err := ociTemplate(ctx, filepath.Join(opts.Root, "templates"), d)
		if err != nil {
			return nil, fmt.Errorf("local backend: template %q: %w", name, err)
		}
		b.templates[name] = &template{name: name, lowers: []string{lower}, base: name, env: env}
	}

	if err := b.setupUserNS(created); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	b.log.Info("local backend: user namespaces", "mode", opts.UserNS.String(), "in_effect", b.userNS)
	if err := b.adopt(ctx); err != nil {
		b.releaseViews() // the probe's views, unless a sandbox is there to use them
		return nil, fmt.Errorf("local backend: %w", err)
	}
	// Last, so that no error above leaves the mounts behind.
	envdPath, skipped, err := copyEnvd(b.envdCopyDir(), opts.EnvdPath)
	if err != nil {
		b.releaseViews()
		return nil, fmt.Errorf("local backend: envd: %w", err)
	}
	if skipped != nil {
		b.log.Info("local backend: sandboxes run envd from its host path", "path", envdPath, "reason", skipped)
	}
	b.envdPath = envdPath
	if err := mountStateFS(b.sandboxesDir()); err != nil {
		b.releaseViews()
		_ = unmountEnvdCopy(b.envdCopyDir())
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if opts.OwnCPUGroup {
		// Before the helpers below start, so that they start in the group.
		name := opts.CgroupParent + cpuGroupSuffix
		if b.cpuGroup, err = joinCPUGroup(name, goruntime.GOMAXPROCS(0)); err != nil {
			b.log.Warn("local backend: sandboxd stays in the root cpu cgroup, its share of the CPU growing with its threads", "err", err)
		} else if b.cpuGroup.leave != nil {
			b.log.Info("local backend: sandboxd runs in a cpu cgroup of its own", "cgroup", name)
		}
	}
	if opts.SpawnPath != "" {
		b.spawnNS, err = b.newSpawnMountNS()
		if err != nil {
			b.log.Warn("local backend: sandboxd-spawn clones sandboxes from sandboxd's mount namespace, whose copy grows with every sandbox", "err", err)
		}
	}
	// The egress rules go in now, not at the first create that allows
	// internet access (the SDKs' default), which waited 10-12 ms for nft:
	// most of a create, and the worst of any short run. Without nft this
	// only logs; such creates then fail, saying so, as before.
	if err := b.egress.setup(); err != nil {
		b.log.Warn("local backend: internet access for sandboxes unavailable; creates that ask for it fail", "err", err)
	}
	if b.starter != nil {
		if err := b.starter.Spawn(); err != nil {
			b.log.Warn("local backend: sandboxd-init did not start; creates try again", "err", err)
		}
	}
	return b, nil
}

// nested reports whether one of the clean absolute paths a and b is the
// other or inside it: the overlap overlayfs refuses between lower layers.
// libcontainer stacks the directory of the binary it re-executes on each
// sandbox's state directory to seal the binary (see exeseal), and copies
// the binary instead when the mount fails.
func nested(a, b string) bool {
	within := func(x, dir string) bool {
		rel, err := filepath.Rel(dir, x)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
	}
	return within(a, b) || within(b, a)
}

// hostBinary returns the absolute path of the binary of kind at path, or
// ErrUnavailable when it is not an executable file.
func hostBinary(kind, path string) (string, error) {
	p, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("local backend: %w: %s binary %s: not an executable file (%v)", runtime.ErrUnavailable, kind, p, err)
	}
	return p, nil
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// SeccompEnabled reports whether sandboxes get the seccomp profile: only a
// binary built with -tags seccomp can apply one.
func (b *Backend) SeccompEnabled() bool { return b.seccomp }

// TemplateResources returns the resources template was given in
// Options.TemplateResources; none for one of DefineTemplate.
func (b *Backend) TemplateResources(template string) (runtime.Resources, bool) {
	t := b.template(template)
	if t == nil {
		return runtime.Resources{}, false
	}
	if t.defined {
		return runtime.Resources{}, true
	}
	return b.opts.TemplateResources[template], true
}

// TemplateEnv returns the ENV of the image template was imported from.
func (b *Backend) TemplateEnv(template string) map[string]string {
	if t := b.template(template); t != nil {
		return t.env
	}
	return nil
}

// Templates lists the template names this backend can create from: its
// own and those of DefineTemplate.
func (b *Backend) Templates(context.Context) ([]string, error) {
	b.tplMu.RLock()
	defer b.tplMu.RUnlock()
	return slices.Sorted(maps.Keys(b.templates)), nil
}

// template returns the template name, or nil.
func (b *Backend) template(name string) *template {
	b.tplMu.RLock()
	defer b.tplMu.RUnlock()
	return b.templates[name]
}

func (b *Backend) sandboxesDir() string { return filepath.Join(b.opts.Root, "sandboxes") }

// envdCopyDir holds the envd that sandboxes run (copyEnvd).
func (b *Backend) envdCopyDir() string { return filepath.Join(b.opts.Root, "envd") }

// Close waits for the veths of destroyed sandboxes to go (releaseNet), then
// releases what the backend holds outside its sandboxes when no sandbox is
// left to need it: the idmapped template views (releaseViews), the state
// tmpfs (mountStateFS) and its cgroup parent (a sandboxd whose sandboxes were
// all destroyed would otherwise leave an empty parent per run dir in every
// hierarchy). Sandboxes still alive keep it, for the next sandboxd to adopt.
// The backend is not used after Close.
func (b *Backend) Close() error {
	if b.starter != nil {
		_ = b.starter.Close() // the helper exits; the sandboxes it started live on
	}
	b.releasing.Wait()
	if b.writers != nil {
		b.writers.close() // the marks go with the group; sandboxes live on untracked
	}
	_ = b.egress.Close() // the name filter; the rules stay with the sandboxes
	b.releaseViews()
	if b.spawnNS != nil {
		_ = b.spawnNS.Close() // before the state tmpfs, which it holds a copy of
	}
	if err := unmountStateFS(b.sandboxesDir()); err != nil {
		b.log.Warn("local backend: close", "err", err)
	}
	// Sandboxes that outlive this process keep their envd through their
	// own mounts.
	if err := unmountEnvdCopy(b.envdCopyDir()); err != nil {
		b.log.Warn("local backend: close", "err", err)
	}
	b.memcgs.close()
	if b.opts.CgroupParent != "/" {
		removeEmptyCgroup(b.opts.CgroupParent)
	}
	if b.cpuGroup.leave != nil {
		if err := b.cpuGroup.leave(); err != nil {
			b.log.Warn("local backend: close", "err", err)
		}
	}
	return nil
}

// CPUGrouped reports whether this process runs in a cpu cgroup other than
// its hierarchy's root (Options.OwnCPUGroup moved it, or another put it
// there), where its share of the CPU does not grow with its threads.
func (b *Backend) CPUGrouped() bool { return b.cpuGroup.grouped }

func (b *Backend) cgroupPath(id string) string { return filepath.Join(b.opts.CgroupParent, id) }

// delegates reports whether sandbox s gets a delegated cgroup2 subtree
// (delegateCgroup): on cgroup v2 hosts only, and only where the limits on
// its cgroup stay out of its root's reach: with a user namespace (its root
// does not own them and has no capability over the host's root's files),
// or else with nsdelegate (without a user namespace root inside is the
// host's root, whose CAP_DAC_OVERRIDE would otherwise let it write
// pids.max; nsdelegate makes the kernel refuse that).
func (b *Backend) delegates(s *sandbox) bool {
	return cgroupDelegable() && (s.meta.UserNS || b.nsDelegate)
}

// HostPaths lists the host paths sandbox id holds while it lives: its state
// directory, its cgroup in each hierarchy and its veth (with internet). runtimetest checks that none
// of them exist after Destroy.
func (b *Backend) HostPaths(id string) []string {
	host, _ := linkNames(id)
	paths := []string{filepath.Join(b.sandboxesDir(), id), b.savedDir(id), "/sys/class/net/" + host}
	for _, h := range cgroupRoots() {
		paths = append(paths, filepath.Join(h, b.cgroupPath(id)))
	}
	return paths
}

// adopt loads every live sandbox under Root, and every sandbox paused to
// disk in SaveDir, into the map. Dead ones are left for Reconcile.
func (b *Backend) adopt(ctx context.Context) error {
	ents, err := os.ReadDir(b.sandboxesDir())
	if err != nil {
		return err
	}
	// SaveDir knows the sandboxes paused to disk when Root does not (a
	// reboot empties a Root on tmpfs).
	saved, err := os.ReadDir(b.opts.SaveDir)
	if err != nil {
		return err
	}
	var ids []string
	for _, e := range append(ents, saved...) {
		if e.IsDir() && runtime.ValidID(e.Name()) && !slices.Contains(ids, e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return err
		}
		b.mu.Lock()
		_, known := b.sbx[id]
		b.mu.Unlock()
		if known {
			continue
		}
		s, err := b.load(id)
		if err != nil {
			continue // dead or half-made: Reconcile removes it
		}
		b.mu.Lock()
		_, known = b.sbx[id]
		if !known {
			b.sbx[id] = s
			if s.meta.Net != nil {
				b.ips[s.meta.Net.IP] = true
			}
		}
		b.mu.Unlock()
		if !known && s.initPid > 0 && !s.frozen {
			s.mu.Lock()
			b.armWriters(s, s.initPid)
			s.mu.Unlock()
		}
	}
	return nil
}

// load reads a sandbox of an earlier process from disk. It fails unless the
// sandbox is complete and its init is alive (running or paused), or it is
// paused to disk.
//
// A saved layer with its meta (see savedDir) makes a sandbox paused to
// disk whatever its state directory says, unless that has a live init: a
// reboot took the state directory (or its init), or a crash came between
// the layer's rename and meta.json. With a live init the layer is stale: a
// crash came before a resume removed it.
func (b *Backend) load(id string) (*sandbox, error) {
	dir := filepath.Join(b.sandboxesDir(), id)
	saved, savedErr := b.readSaved(id)
	var m meta
	raw, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err == nil {
		err = json.Unmarshal(raw, &m)
	}
	if err != nil {
		if savedErr == nil {
			return b.loadSaved(id, dir, saved), nil
		}
		return nil, err
	}
	m.upgrade()
	ready := make(chan struct{})
	close(ready)
	if m.Paused == pausedDisk {
		if savedErr == nil {
			return b.loadSaved(id, dir, saved), nil
		}
		// Paused by a sandboxd that kept no meta in SaveDir: the layer
		// must be there, and gets its meta now.
		if _, err := os.Lstat(filepath.Join(b.savedDir(id), "upper")); err != nil {
			return nil, err
		}
		if err := writeJSON(b.savedMetaPath(id), m); err != nil {
			b.log.Warn("adopt: meta in SaveDir", "sandbox", id, "err", err)
		}
		return b.loadSaved(id, dir, m), nil
	}
	ctr, err := libcontainer.Load(filepath.Join(dir, "ctr"), id)
	var st libcontainer.Status
	if err == nil {
		st, err = ctr.Status()
	}
	if err == nil && st != libcontainer.Running && st != libcontainer.Paused {
		err = fmt.Errorf("sandbox %s is %s", id, st)
	}
	if err != nil {
		if savedErr == nil {
			return b.loadSaved(id, dir, saved), nil
		}
		return nil, err
	}
	if savedErr == nil {
		if err := b.retireSaved(id); err != nil {
			b.log.Warn("adopt: remove the layer of a resumed sandbox", "sandbox", id, "err", err)
		}
	}
	s := &sandbox{
		id: id, dir: dir, meta: m, ctr: ctr, frozen: st == libcontainer.Paused, ready: ready, created: true,
		layers: b.layerKeys(m.Lowers), writers: b.newWriterRecord(),
	}
	if cs, err := ctr.State(); err == nil {
		s.initPid = cs.InitProcessPid
	}
	if _, err := os.Lstat(filepath.Join(dir, envdHostSocket)); err == nil {
		s.envdOnHost.Store(true)
	}
	return s, nil
}

// loadSaved returns the sandbox paused to disk with meta m. What it held
// while running goes: a crash may have interrupted the pause after the
// layer was saved, or a resume before it finished. Failing that, it is
// still returned: the next resume or destroy releases it again, and a
// sandbox left out of the map would lose its layer to Reconcile.
func (b *Backend) loadSaved(id, dir string, m meta) *sandbox {
	ready := make(chan struct{})
	close(ready)
	s := &sandbox{id: id, dir: dir, meta: m, ready: ready, created: true, layers: b.layerKeys(m.Lowers), writers: b.newWriterRecord()}
	if s.writers != nil {
		s.writers.byPath = map[string]*runtime.Writer{} // lost with the process that kept them
	}
	if err := b.releaseStopped(s); err != nil {
		b.log.Warn("adopt sandbox paused to disk: release", "sandbox", id, "err", err)
	}
	if _, err := os.Stat(dir); err == nil {
		if err := writeJSON(filepath.Join(dir, "meta.json"), m); err != nil {
			b.log.Warn("adopt sandbox paused to disk: meta", "sandbox", id, "err", err)
		}
	}
	return s
}

// get returns the live sandbox id, waiting for a Create in progress to end.
func (b *Backend) get(ctx context.Context, id string) (*sandbox, error) {
	if !runtime.ValidID(id) {
		return nil, fmt.Errorf("sandbox %q: %w", id, runtime.ErrNotFound)
	}
	b.mu.Lock()
	s := b.sbx[id]
	b.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, runtime.ErrNotFound)
	}
	if err := runtime.AwaitCreate(ctx, id, s.ready, &s.created); err != nil {
		return nil, err
	}
	return s, nil
}

// lockLive returns sandbox id locked (s.mu), for a call that must not
// race its destroy, pause or resume: ErrNotFound once it is destroyed.
func (b *Backend) lockLive(ctx context.Context, id string) (*sandbox, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: %w", id, runtime.ErrNotFound)
	}
	return s, nil
}

// container returns s's libcontainer handle, loading it first if its start
// left it to load (loadLater): nil, and no error, while s is paused to
// disk. The caller holds s.mu.
func (s *sandbox) container() (*libcontainer.Container, error) {
	if root := s.ctrRoot; root != "" {
		s.ctrRoot = ""
		s.ctr, s.ctrErr = libcontainer.Load(root, s.id)
		if s.ctrErr != nil {
			s.ctr, s.ctrErr = nil, fmt.Errorf("load container: %w", s.ctrErr)
		}
	}
	return s.ctr, s.ctrErr
}

// state says whether s runs or is paused. It asks libcontainer (which
// reads /proc and the freezer) only for a sandbox adopted from an earlier
// process: for one started here, s.frozen and s.exited say it, and a Dial
// (every request to envd) need not wait for the handle.
func (s *sandbox) state() (runtime.State, error) {
	if s.meta.Paused == pausedDisk || s.frozen {
		return runtime.StatePaused, nil
	}
	if s.exited != nil {
		select {
		case <-s.exited:
			return "", fmt.Errorf("sandbox %s: %w", s.id, runtime.ErrNotRunning)
		default:
			return runtime.StateRunning, nil
		}
	}
	ctr, err := s.container()
	if err != nil {
		return "", err
	}
	st, err := ctr.Status()
	if err != nil {
		return "", err
	}
	switch st {
	case libcontainer.Running, libcontainer.Created:
		return runtime.StateRunning, nil
	case libcontainer.Paused:
		return runtime.StatePaused, nil
	}
	return "", fmt.Errorf("sandbox %s: %w", s.id, runtime.ErrNotRunning)
}

// info reports s; the caller holds s.mu.
func (s *sandbox) info() (*runtime.Sandbox, error) {
	state, err := s.state()
	if err != nil {
		return nil, err
	}
	return &runtime.Sandbox{
		ID:        s.id,
		Template:  s.meta.Spec.Template,
		State:     state,
		OnDisk:    s.meta.Paused == pausedDisk,
		Spec:      s.meta.Spec,
		CreatedAt: s.meta.CreatedAt,
	}, nil
}

// List returns the live sandboxes, adopting any that an earlier process of
// sandboxd left running.
func (b *Backend) List(ctx context.Context) ([]*runtime.Sandbox, error) {
	if err := b.adopt(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	all := make([]*sandbox, 0, len(b.sbx))
	for _, s := range b.sbx {
		all = append(all, s)
	}
	b.mu.Unlock()
	var out []*runtime.Sandbox
	for _, s := range all {
		select {
		case <-s.ready:
		default:
			continue // still being created: not live yet
		}
		s.mu.Lock()
		if s.created && !s.gone {
			if info, err := s.info(); err == nil {
				out = append(out, info)
			}
		}
		s.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b *runtime.Sandbox) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out, nil
}

// Reconcile removes what dead sandboxes left behind: state directories
// whose init is gone or that an interrupted Create left half-made, with
// their mounts and cgroups; cgroups under CgroupParent with no directory;
// old host views no live sandbox uses; and temporary directories that
// interrupted writes and removals of layers left (layers themselves are
// RemoveLayer's). Live sandboxes and creates in progress in this process
// are untouched.
func (b *Backend) Reconcile(ctx context.Context) error {
	if err := b.adopt(ctx); err != nil {
		return err
	}
	if err := b.reconcileDead(ctx); err != nil {
		return err
	}
	b.mu.Lock()
	known := map[string]bool{}
	lowers := map[string]bool{}
	for id, s := range b.sbx {
		known[id] = true
		for _, l := range s.meta.Lowers {
			lowers[l] = true
		}
	}
	b.mu.Unlock()
	b.tplMu.RLock()
	for _, t := range b.templates {
		for _, l := range t.lowers {
			lowers[l] = true
		}
	}
	b.tplMu.RUnlock()

	var errs []error
	ents, err := os.ReadDir(b.sandboxesDir())
	if err != nil {
		return err
	}
	for _, e := range ents {
		if known[e.Name()] {
			continue
		}
		if err := b.cleanup(e.Name(), filepath.Join(b.sandboxesDir(), e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	saved, _ := os.ReadDir(b.opts.SaveDir)
	for _, e := range saved {
		if err := b.reconcileSaved(e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	for _, id := range strayCgroups(b.opts.CgroupParent) {
		if known[id] || !runtime.ValidID(id) {
			continue
		}
		if err := openCgroup(b.cgroupPath(id)).remove(); err != nil {
			errs = append(errs, err)
		}
	}
	tpls, _ := os.ReadDir(filepath.Join(b.opts.Root, "templates"))
	for _, e := range tpls {
		p := filepath.Join(b.opts.Root, "templates", e.Name())
		if lowers[p] || p == b.layersDir() {
			continue // layers are the caller's to remove (RemoveLayer)
		}
		if err := removeDir(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := b.reconcileLayers(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// reconcileSaved removes the entry name of SaveDir unless a sandbox needs
// it. A layer with its meta is never deleted here, only put aside (adopt
// took every one it could: what is left is unreadable or not this
// backend's to delete).
func (b *Backend) reconcileSaved(name string) error {
	p := filepath.Join(b.opts.SaveDir, name)
	var id string
	switch {
	case name == quarantineDir:
		return nil
	case strings.HasPrefix(name, ".") && strings.HasSuffix(name, retiredSuffix):
		return os.RemoveAll(p) // on its way out: no sandbox needs it
	case strings.HasPrefix(name, ".") && strings.HasSuffix(name, savingSuffix):
		// A pause in progress, or one a crash interrupted.
		id = strings.TrimSuffix(strings.TrimPrefix(name, "."), savingSuffix)
		b.mu.Lock()
		s := b.sbx[id]
		b.mu.Unlock()
		if s != nil {
			return nil
		}
		return os.RemoveAll(p)
	default:
		id = name
	}
	b.mu.Lock()
	s := b.sbx[id]
	b.mu.Unlock()
	if s != nil && s.diskPaused() {
		return nil
	}
	if _, err := os.Lstat(filepath.Join(p, "meta.json")); err == nil {
		return b.quarantineSaved(id)
	}
	// No meta: a layer whose resume did not get to remove it, or debris.
	return os.RemoveAll(p)
}

// diskPaused reports whether the sandbox is paused to disk.
func (s *sandbox) diskPaused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.meta.Paused == pausedDisk
}
