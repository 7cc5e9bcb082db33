// Package runtime is the contract between sandboxd's control plane and an
// isolation backend: what a sandbox is asked to be (Spec), what a backend
// reports back (Sandbox, Stats), the errors callers branch on, and the
// Backend interface itself.
//
// It owns no backend code and no policy. Lifecycle states, per-sandbox
// locking, timeouts, tenants and the store live in package sandbox; a backend
// only makes the machine do what it is told and reports what exists. Every
// backend (runtime/local, incus) must pass the conformance suite in
// runtime/runtimetest.
//
// The wire stops before this package: Spec is filled from E2B's create
// request by the server, and nothing here knows HTTP or Connect.
package runtime

import (
	"context"
	"fmt"
	"net"
	"os"
	"path"

	"github.com/sandboxd/sandboxd/runtime/egress/policy"
	"regexp"
	"strings"
	"sync"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

// EnvdPort is the TCP port envd serves on inside every sandbox. Dial with
// this port reaches envd itself, by whatever path the backend prefers.
const EnvdPort = envdapi.Port

// Backend is what sandboxd needs from an isolation backend. All methods are
// safe for concurrent use; calls for different sandboxes do not serialize on
// each other. Callers serialize lifecycle calls for one sandbox (package
// sandbox holds a per-sandbox lock); a backend must still not corrupt its
// state if they do not.
type Backend interface {
	// Create starts a sandbox from s and returns once envd inside answers
	// GET /health. On error nothing of the sandbox is left behind. It fails
	// with ErrAlreadyExists if s.ID is in use, ErrInvalidSpec for a bad
	// spec and ErrTemplateNotFound for an unknown template.
	Create(ctx context.Context, s Spec) (*Sandbox, error)
	// Destroy kills every process of the sandbox and removes all it held on
	// the host. It is idempotent: destroying a sandbox that is already gone,
	// or never existed, returns nil. A paused sandbox can be destroyed.
	Destroy(ctx context.Context, id string) error
	// Pause stops every process of the sandbox. With PauseMemory the
	// processes are kept (frozen) and Resume continues them where they
	// were; with PauseDisk they are ended and only the sandbox's filesystem
	// is kept, off the memory it was charged to, and Resume starts the
	// sandbox afresh on it. Both kinds survive a restart of sandboxd.
	// Pausing a paused sandbox returns nil. A backend that cannot pause to
	// disk fails PauseDisk with ErrUnsupported and changes nothing. A
	// pause to disk that fails once the processes have ended (no room for
	// the files) may start the sandbox afresh and fail with ErrRestarted.
	Pause(ctx context.Context, id string, kind PauseKind) error
	// Resume continues a paused sandbox. restarted reports that its
	// processes were started afresh (it was paused with PauseDisk): envd is
	// then a new process that has to be initialised again. Resuming a
	// running one returns false, nil.
	Resume(ctx context.Context, id string) (restarted bool, err error)
	// Dial opens a byte stream to TCP port on the sandbox's loopback. Dial
	// of EnvdPort reaches envd. It fails with ErrPaused while the sandbox
	// is paused.
	Dial(ctx context.Context, id string, port int) (net.Conn, error)
	// Stats reports the sandbox's current resource use.
	Stats(ctx context.Context, id string) (Stats, error)
	// List returns the sandboxes this backend holds that are alive (running
	// or paused), including those started by an earlier process of sandboxd,
	// so that the control plane can re-adopt them after a restart.
	List(ctx context.Context) ([]*Sandbox, error)
}

// PauseKind says what a pause keeps.
type PauseKind int

const (
	// PauseMemory freezes the processes; they keep their memory.
	PauseMemory PauseKind = iota
	// PauseDisk ends the processes and keeps the sandbox's filesystem on
	// disk (E2B's pause with memory=false).
	PauseDisk
)

func (k PauseKind) String() string {
	if k == PauseDisk {
		return "disk"
	}
	return "memory"
}

// Optional abilities. The control plane finds them by type assertion; a
// backend without one simply does not implement it.

// Reconciler is a backend that can clean up after a crash: remove what dead
// sandboxes left behind (mounts, cgroups, directories) without touching live
// ones. sandboxd calls it once at start, before List.
type Reconciler interface {
	Reconcile(ctx context.Context) error
}

// LocalEnvdChannel is a backend whose channel to a sandbox's envd (Dial of
// EnvdPort) stays on this host, so that a connection to an envd that is
// gone fails at once (its peer's end closes) and never hangs: the control
// plane may then keep one from a control request to the next. A frozen
// sandbox's would hang; the control plane drops a sandbox's connections
// when it pauses it. A remote channel is dialled for every request, which
// lets the backend refuse at once a cluster member it knows is down, whose
// connections would hang instead.
type LocalEnvdChannel interface {
	LocalEnvdChannel() bool
}

// LivenessChecker is a backend that can tell at once, from what it holds
// on the host and without waking the sandbox, whether a sandbox still runs:
// Alive fails with ErrNotFound for one that is gone, ErrNotRunning for one
// whose init exited and ErrPaused for a paused one. The control plane then
// hands a claimed warm member over without a round trip to its envd, whose
// /init follows in the background (package sandbox, claiminit.go).
type LivenessChecker interface {
	Alive(ctx context.Context, id string) error
}

// TemplateLister is a backend that can say which templates it can create
// sandboxes from.
type TemplateLister interface {
	Templates(ctx context.Context) ([]string, error)
}

// TemplateResourcer is a backend whose templates carry default resources,
// as E2B's templates do (E2B's create request names none: the template's
// cpuCount, memoryMB and diskSizeMB apply).
type TemplateResourcer interface {
	// TemplateResources returns what template declares; zero fields it
	// leaves to the control plane's defaults. ok is false for a template
	// the backend lacks.
	TemplateResources(template string) (r Resources, ok bool)
}

// TemplateEnver is a backend whose templates carry an environment (an
// imported image's ENV): the control plane gives it to envd's /init under
// the create's own variables, so every process of the sandbox has it.
type TemplateEnver interface {
	TemplateEnv(template string) map[string]string
}

// EgressPolicer is a backend that enforces a per-sandbox egress policy on
// its sandboxes with internet access (runtime/egress: the same rules for
// every backend). The control plane puts a sandbox's policy in force after
// every create, claim and resume and before the sandbox is handed out, and
// again for each live sandbox at start; an empty policy clears it.
type EgressPolicer interface {
	SetEgressPolicy(ctx context.Context, id string, p *policy.Policy) error
}

// VolumeStore is a backend that keeps volumes: directories that outlive
// sandboxes, each with a size the kernel enforces, mounted into sandboxes
// through Spec.Mounts (several at once see the same files). Volumes survive
// a restart of sandboxd and the sandboxes that used them.
type VolumeStore interface {
	// CreateVolume makes volume id of sizeMB MiB, empty. On error nothing
	// of it is left. An id in use is ErrAlreadyExists.
	CreateVolume(ctx context.Context, id string, sizeMB int) error
	// DeleteVolume removes volume id and its files. It fails with ErrInUse
	// while a live sandbox (running or paused) mounts it, and returns nil
	// for a volume that does not exist.
	DeleteVolume(ctx context.Context, id string) error
	// OpenVolume returns the root of volume id's files as the sandboxes
	// see them (owners as inside), for the control plane to read and write
	// without leaving it; the caller closes it. ErrNotFound if it does not
	// exist.
	OpenVolume(ctx context.Context, id string) (*os.Root, error)
	// Volumes lists the volumes the backend holds, so that the control
	// plane can remove those a crash left without a record.
	Volumes(ctx context.Context) ([]string, error)
}

// Resources are a sandbox's limits, in Spec's units. Zero means unset.
type Resources struct {
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
}

// Spec is what a sandbox should be. Its fields are final: the control plane
// resolves defaults (the template's declared Resources, then its own) before
// a backend sees a Spec, and a backend never fills a field in. Template and
// the resources are required (Validate).
type Spec struct {
	// ID names the sandbox; see ValidID.
	ID string
	// Template is the name of the root filesystem to start from.
	Template string
	// CPUCount is the number of CPUs the sandbox may use (E2B cpuCount).
	CPUCount int
	// MemoryMB is the memory limit in MiB (E2B memoryMB).
	MemoryMB int
	// DiskSizeMB is the size of the sandbox's writable layer in MiB (E2B
	// diskSizeMB).
	DiskSizeMB int
	// Env is the environment envd starts with, and so the default
	// environment of every process it runs.
	Env map[string]string
	// AccessToken is the token envd requires once the control plane has
	// set it through /init; Dial sends it when it tunnels to a port. Empty
	// for sandboxes without one.
	AccessToken string
	// AllowInternet gives the sandbox egress to the internet. Without it,
	// the sandbox has loopback only. It never reaches the host's loopback.
	AllowInternet bool
	// EnvdInit, if set, is the body of envd's POST /init for this create:
	// access token, environment, default user, clock. A backend may send it
	// as its readiness probe instead of GET /health, and then says so in
	// Sandbox.EnvdInitialized: one request less on the way to a new
	// sandbox. It is not kept: envd started again (a resume from disk)
	// needs /init again.
	EnvdInit []byte `json:"-"`
	// ForkOf, if set, names a live sandbox of the same Template and
	// AllowInternet whose root
	// filesystem changes (its writable layer) the new sandbox starts with:
	// a copy taken while ForkOf's processes are frozen, so that it is
	// consistent, after which the two diverge. Processes are not copied.
	// Like EnvdInit it is for this create only. A backend that cannot fork
	// fails with ErrUnsupported; ErrNotFound when ForkOf is gone,
	// ErrNotRunning when it is not running.
	ForkOf string `json:"-"`
	// Mounts are volumes (VolumeStore) mounted read-write into the
	// sandbox. They are part of the sandbox: a resume or a re-adopt mounts
	// them again.
	Mounts []Mount `json:",omitempty"`
	// Group is the sandbox's tenant: a backend with hosts to choose from
	// spreads a group's sandboxes over them. Kept with the sandbox.
	Group string `json:",omitempty"`
	// SpreadFrom names sandboxes this one is to be placed away from, where
	// the backend has hosts to choose from (the Incus backend on a
	// cluster): the other members of its warm or spare pool. For this
	// create only.
	SpreadFrom []string `json:"-"`
	// Background: no caller waits for this create alone. It refills a
	// pool, or it is one of a flood of its tenant's creates (more of them
	// in flight or queued). A backend may start it with the least share
	// of the CPU and give the sandbox its own share once envd answers, so
	// that a create someone waits for gets the CPU first while both run;
	// alone it runs as fast as any. For this create only.
	Background bool `json:"-"`
}

// Mount is a volume mounted into a sandbox at Path.
type Mount struct {
	// Volume is the volume's id (see ValidID).
	Volume string
	// Path is an absolute, clean path inside the sandbox, not "/".
	Path string
}

// Compiled on first use, not at package init: every sandbox start
// re-executes sandboxd as libcontainer's init, which runs all package inits,
// and a bounded repeat like {0,62} compiles to a large program.
var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,62}$`) })

// ValidID reports whether id can name a sandbox: 1 to 63 ASCII letters,
// digits, '-' and '_', starting with a letter or digit. Backends use ids in
// paths, cgroup names and hostnames, so they accept nothing else.
func ValidID(id string) bool { return idPattern().MatchString(id) }

// Validate checks that a Spec is finished and usable: the id, a template,
// positive resources, and an environment that can be passed to a process.
func (s Spec) Validate() error {
	if !ValidID(s.ID) {
		return fmt.Errorf("%w: bad sandbox id %q", ErrInvalidSpec, s.ID)
	}
	if s.CPUCount < 0 || s.MemoryMB < 0 || s.DiskSizeMB < 0 {
		return fmt.Errorf("%w: negative resource (cpu %d, memory %d MiB, disk %d MiB)",
			ErrInvalidSpec, s.CPUCount, s.MemoryMB, s.DiskSizeMB)
	}
	if s.Template == "" || s.CPUCount == 0 || s.MemoryMB == 0 || s.DiskSizeMB == 0 {
		return fmt.Errorf("%w: unfinished spec (template %q, cpu %d, memory %d MiB, disk %d MiB): defaults are the control plane's to resolve",
			ErrInvalidSpec, s.Template, s.CPUCount, s.MemoryMB, s.DiskSizeMB)
	}
	for i, m := range s.Mounts {
		if !ValidID(m.Volume) || !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path || m.Path == "/" || strings.ContainsRune(m.Path, 0) {
			return fmt.Errorf("%w: mount %d: bad volume %q or path %q", ErrInvalidSpec, i, m.Volume, m.Path)
		}
		for _, o := range s.Mounts[:i] {
			if o.Path == m.Path {
				return fmt.Errorf("%w: mount %d: path %q is used twice", ErrInvalidSpec, i, m.Path)
			}
		}
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%w: bad environment variable %q", ErrInvalidSpec, k)
		}
	}
	return nil
}

// State is where a live sandbox is in its lifecycle, as the backend sees it.
type State string

const (
	StateRunning State = "running"
	StatePaused  State = "paused"
)

// Sandbox is a live sandbox as a backend reports it.
type Sandbox struct {
	ID       string
	Template string
	State    State
	// OnDisk: paused with PauseDisk, so it holds no memory, only files.
	OnDisk bool
	// Spec is the spec it was created with, resources defaulted.
	Spec      Spec
	CreatedAt time.Time
	// EnvdInitialized: Create's readiness probe was Spec.EnvdInit's
	// /init, which envd accepted.
	EnvdInitialized bool
}

// Stats is a sandbox's resource use at one moment. A backend that cannot
// measure a field leaves it zero.
type Stats struct {
	// CPUTime is the CPU time used by all processes since creation.
	CPUTime time.Duration
	// CPUCount is the CPU limit.
	CPUCount int
	// MemoryBytes is the memory charged to the sandbox now, and
	// MemoryLimitBytes its limit.
	MemoryBytes      uint64
	MemoryLimitBytes uint64
	// DiskBytes is the space used in the sandbox's writable layer, and
	// DiskLimitBytes its size.
	DiskBytes      uint64
	DiskLimitBytes uint64
	// Pids is the number of tasks, and PidsLimit the most it may have.
	Pids      uint64
	PidsLimit uint64
}
