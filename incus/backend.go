// Package incus is the runtime.Backend on Incus: each sandbox is an
// unprivileged, ephemeral LXC container, without a NIC unless it has
// internet access, created through the Incus REST API (our own client,
// client.go; no Incus Go module).
//
// A sandbox's container:
//   - starts from an Incus image (Options.Images maps template names to image
//     aliases or fingerprints) or, for a built template, from a stopped
//     layer instance (layers.go), with its root on a copy-on-write storage
//     pool (btrfs: each root is a snapshot of the image's unpacked volume or
//     of the layer's root);
//   - runs envd as its init (raw.lxc lxc.init.cmd), from the host's envd
//     binary shared read-only with a disk device at /opt/sandboxd/envd;
//   - shares a per-sandbox host directory <Root>/sandboxes/<id> at /run/envd
//     (disk device, shift=true: an idmapped mount), where envd listens on
//     envd.sock; sandboxd connects to that socket file directly, so no proxy
//     device and no network are needed;
//   - has no NIC: only loopback, which the backend sets up from the host
//     (envd cannot: the container has no CAP_NET_ADMIN); with AllowInternet,
//     a p2p NIC (a veth) as eth0, whose host end is named, addressed and
//     filtered by runtime/egress exactly like runtime/local's;
//   - keeps Docker's default capabilities minus CAP_NET_RAW and CAP_MKNOD
//     (lxc.cap.drop); setuid programs (sudo) work, as in E2B; /usr is
//     read-only only with Options.ReadOnlyUsr (a read-only idmapped bind
//     of its own /usr);
//   - carries user.sandboxd.* config keys (id, template, created-at and the
//     spec) from which List rebuilds the backend's view after a restart.
//
// A pause to disk makes the instance persistent, marks it
// (user.sandboxd.paused=disk) and stops it: its root volume stays on the
// pool, its processes and memory go; Resume starts it again (ops.go).
//
// Destroy returns at once: LXC takes about 0.7 s to stop a container, so the
// forced stop (which deletes the ephemeral instance) runs in the background
// with retries; List and the other calls no longer see the sandbox, and a
// Create of the same id waits for it to be gone.
package incus

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/egress"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// Paths inside every sandbox.
const (
	envdPath      = "/opt/sandboxd/envd"
	envdSocketDir = "/run/envd"
)

// Config keys on each instance.
const (
	keyID        = "user.sandboxd.id"
	keyTemplate  = "user.sandboxd.template"
	keyCreatedAt = "user.sandboxd.created-at"
	keySpec      = "user.sandboxd.spec"
	keyNamespace = "user.sandboxd.namespace"
	keyEgressIP  = "user.sandboxd.egress-ip"
	// keySource is the image fingerprint or layer instance the root was
	// cloned from (rootSource.id).
	keySource = "user.sandboxd.source"
	// keyPaused is "disk" on the stopped instance of a sandbox paused to
	// disk (which is then not ephemeral, so that the stop keeps it).
	keyPaused = "user.sandboxd.paused"
)

// DefaultTemplate is the template the default Images map names: the image
// scripts/incus-setup.sh builds.
const DefaultTemplate = "base"

// Options configure a Backend. Zero fields take the defaults given.
type Options struct {
	// Socket is the Incus unix socket. Default DefaultSocket. Ignored
	// when Client is set.
	Socket string
	// Client, when set, is used instead of a unix-socket client (for
	// tests, or another transport). The socket directories are still
	// host paths: sandboxd must run on the Incus host.
	Client *Client
	// Pool is the storage pool of the sandboxes' roots. Default
	// "sandboxd". Use a copy-on-write driver (btrfs, zfs): "dir" copies
	// the whole image for every sandbox.
	Pool string
	// Images maps template names to Incus image aliases (or
	// fingerprints). Default {"base": "sandboxd-base"}.
	Images map[string]string
	// EnvdPath is the host path of the static envd binary. Required.
	EnvdPath string
	// Root holds the per-sandbox socket directories. Default
	// /run/sandboxd/incus.
	Root string
	// IncusDir is incusd's state directory, where the pool's volumes are
	// mounted (for ReadOnlyUsr's bind). Default /var/lib/incus.
	IncusDir string
	// PidsMax bounds tasks per sandbox: default 1024.
	PidsMax int
	// EgressSubnet is where sandboxes with AllowInternet get their
	// address; its first address is every sandbox's gateway. Default
	// 10.134.0.0/16 (runtime/local's is 10.133.0.0/16): each sandboxd on a
	// host needs a subnet of its own.
	EgressSubnet netip.Prefix
	// EgressAllow are blocks of egress.DefaultDeny (private and
	// special-purpose ranges: the operator's LAN) that sandboxes with
	// internet access may reach nonetheless.
	EgressAllow []netip.Prefix
	// EgressDNS are the sandboxes' resolvers; none: the host's.
	EgressDNS []netip.Addr
	// Registerer gets the egress name filter's metrics; nil: none.
	Registerer prometheus.Registerer
	// EnvdLogLevel is envd's --log-level. Default "warn".
	EnvdLogLevel string
	// StartTimeout bounds Create when ctx has no deadline. Default 30s.
	StartTimeout time.Duration
	// ReadOnlyUsr shows the template's /usr read-only even to root inside.
	// By default root may change it (apt-get install, as in E2B), in the
	// sandbox's own root volume.
	ReadOnlyUsr bool
	// NoDiskSync skips the syncfs Stats does so that btrfs quota groups
	// count recent writes (a sync of the whole pool's filesystem).
	NoDiskSync bool
	// Namespace separates the sandboxes of several backends (several
	// sandboxd, or tests) on one Incus: each sees only instances with its
	// own user.sandboxd.namespace. Empty is a namespace of its own.
	Namespace string
	// Log receives warnings about background deletions. Default
	// slog.Default().
	Log *slog.Logger
	// Cluster, when set, drives an Incus cluster through Client (an HTTPS
	// client, NewRemoteClient) and reaches sandboxes through each member's
	// relay (cluster.go). EnvdPath, Root and the egress options are then
	// unused: envd and the firewall are the members'.
	Cluster *ClusterOptions
}

// Backend is the Incus runtime.Backend.
type Backend struct {
	opts Options
	c    *Client
	log  *slog.Logger

	egress *egress.Egress
	// resolv is the host file bind-mounted as /etc/resolv.conf into
	// sandboxes with internet access.
	resolv string

	mu       sync.Mutex
	sbx      map[string]*sandbox         // live and in-creation sandboxes
	ips      map[netip.Addr]string       // egress addresses in use → instance name
	deleting map[string]chan struct{}    // closed when the instance is gone
	images   map[string]*rootSource      // base images, by alias or fingerprint
	defined  map[string]*definedTemplate // templates of DefineTemplate (layers.go)

	// owner is this process's mark on the layer images and commit
	// snapshots it makes (propOwner, commitSnapshot): one without a name
	// and another owner is what a dead process left.
	owner string

	// background is Reconcile's clean-up that waits for incusd
	// (removeStaleCommits); closing ends with Close, which joins it.
	background sync.WaitGroup
	closing    context.Context
	close      context.CancelFunc

	// quota rescans the pool's btrfs quota groups when the kernel stops
	// keeping them (quota.go).
	quota *quotaGuard

	// cluster is the members and placement in cluster mode; nil on a
	// single host.
	cluster *cluster
}

var (
	_ runtime.Backend        = (*Backend)(nil)
	_ runtime.Reconciler     = (*Backend)(nil)
	_ runtime.TemplateLister = (*Backend)(nil)
)

// rootSource is what a sandbox's root is cloned from: a template's image
// (one of Options.Images), or a layer instance (layers.go).
type rootSource struct {
	image string // fingerprint; "" for a layer
	layer string // layer instance name; "" for an image
	// size is the bytes the source's root holds, which the clone's root
	// size must allow for (see instanceRequest).
	size int64
}

// id names the source: an image's fingerprint or a layer instance's name
// (recorded on sandboxes as keySource).
func (r *rootSource) id() string {
	if r.layer != "" {
		return r.layer
	}
	return r.image
}

// instanceSource is r as the source of an instance create: a btrfs
// snapshot either way (of the image's volume, unpacked once on the pool,
// or of the layer instance's root).
func (r *rootSource) instanceSource() InstanceSource {
	if r.layer != "" {
		return InstanceSource{Type: "copy", Source: r.layer, InstanceOnly: true}
	}
	return InstanceSource{Type: "image", Fingerprint: r.image}
}

// sandbox is one sandbox's in-memory handle; mu serializes lifecycle calls.
type sandbox struct {
	id, name, dir string // dir: "" in cluster mode
	// ip is the egress address (invalid without internet) or, in cluster
	// mode, the routed address every sandbox has.
	ip netip.Addr
	// member is the cluster member the instance is on ("" on one host).
	member string
	// source is the id of the image or layer the root was cloned from
	// (rootSource.id), and stack what it holds (see keyStack in layers.go).
	source string
	stack  []string

	mu        sync.Mutex
	spec      runtime.Spec
	createdAt time.Time
	paused    bool
	onDisk    bool          // paused to disk: the instance is stopped
	ready     chan struct{} // closed when Create finished (either way)
	created   bool
	readyAt   time.Time // when created became true; set before ready closes
}

// New checks the Incus server, the pool and envd, and re-adopts the live
// sandboxes of an earlier process. Unknown image aliases are not an error
// here: Create of their template fails with ErrTemplateNotFound.
func New(ctx context.Context, opts Options) (_ *Backend, err error) {
	if opts.Pool == "" {
		opts.Pool = "sandboxd"
	}
	if len(opts.Images) == 0 {
		opts.Images = map[string]string{DefaultTemplate: "sandboxd-base"}
	}
	if opts.Root == "" {
		opts.Root = "/run/sandboxd/incus"
	}
	if opts.IncusDir == "" {
		opts.IncusDir = "/var/lib/incus"
	}
	opts.PidsMax = orDefault(opts.PidsMax, 1024)
	if opts.EnvdLogLevel == "" {
		opts.EnvdLogLevel = "warn"
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if !opts.EgressSubnet.IsValid() {
		opts.EgressSubnet = netip.MustParsePrefix("10.134.0.0/16")
	}
	eg, err := egress.New(opts.EgressSubnet, opts.EgressAllow...)
	if err != nil {
		return nil, fmt.Errorf("incus backend: %w", err)
	}
	defer func() {
		if err != nil {
			_ = eg.Close()
		}
	}()
	if err := eg.UseResolvers(opts.EgressDNS); err != nil {
		return nil, err
	}
	eg.Observe(opts.Log.With("component", "egress"), opts.Registerer)
	var cl *cluster
	if opts.Cluster != nil {
		if opts.Client == nil {
			return nil, fmt.Errorf("incus backend: %w: cluster mode needs a remote client", runtime.ErrInvalidSpec)
		}
		if cl, err = newCluster(*opts.Cluster); err != nil {
			return nil, err
		}
		opts.EnvdPath = cl.opts.MemberEnvd
	} else if err := checkEnvd(&opts); err != nil {
		return nil, err
	}
	c := opts.Client
	if c == nil {
		c = NewUnixClient(opts.Socket)
	}
	srv, err := c.Server(ctx)
	if err != nil {
		return nil, fmt.Errorf("incus backend: %w", err)
	}
	if !srv.HasExtension("instance_create_start") {
		return nil, fmt.Errorf("incus backend: %w: server lacks API extension instance_create_start", runtime.ErrUnavailable)
	}
	if _, err := c.StoragePool(ctx, opts.Pool); err != nil {
		return nil, fmt.Errorf("incus backend: storage pool %q: %w", opts.Pool, err)
	}
	resolv := ""
	if cl == nil {
		if resolv, err = writeHostFiles(opts.Root, eg); err != nil {
			return nil, fmt.Errorf("incus backend: %w", err)
		}
	}
	b := &Backend{
		opts:     opts,
		c:        c,
		log:      opts.Log,
		egress:   eg,
		resolv:   resolv,
		ips:      map[netip.Addr]string{},
		sbx:      map[string]*sandbox{},
		deleting: map[string]chan struct{}{},
		images:   map[string]*rootSource{},
		defined:  map[string]*definedTemplate{},
		owner:    strings.ToLower(rand.Text()[:10]),
		quota:    newQuotaGuard(filepath.Join(opts.IncusDir, "storage-pools", opts.Pool)),
		cluster:  cl,
	}
	b.closing, b.close = context.WithCancel(context.Background())
	if cl != nil {
		// The members' pools are not here: their quota mode is what the
		// operator says (ClusterOptions.SimpleQuotas).
		b.quota = &quotaGuard{simple: cl.opts.SimpleQuotas}
		if err := b.startCluster(ctx, srv); err != nil {
			b.close()
			return nil, fmt.Errorf("incus backend: %w", err)
		}
	}
	if _, err = b.List(ctx); err != nil {
		b.close()
		return nil, fmt.Errorf("incus backend: %w", err)
	}
	if cl != nil {
		b.background.Go(b.watchCluster)
		return b, nil
	}
	b.ensureQuota(ctx)
	b.background.Go(b.watchQuota)
	return b, nil
}

// checkEnvd makes opts.EnvdPath absolute and checks that it is a file.
func checkEnvd(opts *Options) error {
	if opts.EnvdPath == "" {
		return fmt.Errorf("incus backend: %w: no envd binary given", runtime.ErrUnavailable)
	}
	envd, err := filepath.Abs(opts.EnvdPath)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(envd); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("incus backend: %w: envd binary %s: %v", runtime.ErrUnavailable, envd, err)
	}
	opts.EnvdPath = envd
	return nil
}

// writeHostFiles makes root's socket directory parent and the sandboxes'
// resolv.conf, and returns the latter's path. The file is written whole
// and renamed: running sandboxes keep the one they have.
func writeHostFiles(root string, eg *egress.Egress) (string, error) {
	if err := os.MkdirAll(filepath.Join(root, "sandboxes"), 0o700); err != nil {
		return "", err
	}
	resolv := filepath.Join(root, "resolv.conf")
	if err := os.WriteFile(resolv+".tmp", eg.ResolvConf(), 0o644); err != nil {
		return "", err
	}
	return resolv, os.Rename(resolv+".tmp", resolv)
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// Client returns the backend's Incus client.
func (b *Backend) Client() *Client { return b.c }

// EnvdPath is the agent the sandboxes run: the host's --envd, or in
// cluster mode the path the members hold theirs at (MemberEnvd).
func (b *Backend) EnvdPath() string { return b.opts.EnvdPath }

// Templates lists the template names this backend maps to images and
// those of DefineTemplate.
func (b *Backend) Templates(context.Context) ([]string, error) {
	return slices.Sorted(slices.Values(append(slices.Collect(maps.Keys(b.opts.Images)), b.definedNames()...))), nil
}

// Compiled on first use: sandboxd re-executes itself as every local
// sandbox's init, which runs all package inits.
var simpleName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,57}[a-z0-9])?$`) })

// InstanceName is the Incus instance name of sandbox id in namespace ns:
// "sbx-<id>" when ns is empty and id is a lower-case host name label that
// fits, else "sbh-" and a hash of both (instance names are host names: no
// '_', no upper case, at most 63 bytes).
func InstanceName(ns, id string) string {
	if ns == "" && simpleName().MatchString(id) && !strings.Contains(id, "--") {
		return "sbx-" + id
	}
	h := sha256.Sum256([]byte(ns + "\x00" + id))
	return "sbh-" + hex.EncodeToString(h[:16])
}

func (b *Backend) instanceName(id string) string { return InstanceName(b.opts.Namespace, id) }

// ours reports whether instance in is a sandbox of this backend's namespace.
func (b *Backend) ours(in *Instance) bool {
	id := in.Config[keyID]
	return runtime.ValidID(id) && in.Config[keyNamespace] == b.opts.Namespace && in.Name == b.instanceName(id)
}

// sockDir is the host directory of instance name's envd socket: a small
// tmpfs of its own, so that root inside, who can write there, cannot fill
// the host's /run.
// In cluster mode there is none: "".
func (b *Backend) sockDir(name string) string {
	if b.cluster != nil {
		return ""
	}
	return filepath.Join(b.opts.Root, "sandboxes", name)
}

// makeSockDir creates and mounts dir, replacing what is there.
func makeSockDir(dir string) error {
	if err := removeSockDir(dir); err != nil {
		return err
	}
	return mountSockDir(dir)
}

// mountSockDir creates and mounts dir; it fails with an error that
// errors.Is os.ErrExist if dir exists.
func mountSockDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		"size=256k,nr_inodes=64,mode=0700"); err != nil {
		_ = os.Remove(dir)
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	return nil
}

// removeSockDir unmounts and removes dir; a missing dir is fine, and so is
// none ("": cluster mode).
func removeSockDir(dir string) error {
	if dir == "" {
		return nil
	}
	for {
		err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err != nil {
			break // EINVAL: not a mount point (any more); ENOENT: no dir
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return nil
}

// image resolves a template's alias or fingerprint, caching the answer.
func (b *Backend) image(ctx context.Context, ref string) (*rootSource, error) {
	b.mu.Lock()
	im := b.images[ref]
	b.mu.Unlock()
	if im != nil {
		return im, nil
	}
	fp, err := b.c.ImageAlias(ctx, ref)
	if errors.Is(err, runtime.ErrNotFound) {
		fp = ref // maybe a fingerprint
	} else if err != nil {
		return nil, err
	}
	img, err := b.c.Image(ctx, fp)
	if err != nil {
		return nil, err
	}
	im = &rootSource{image: img.Fingerprint, size: img.Size}
	b.mu.Lock()
	b.images[ref] = im
	b.mu.Unlock()
	return im, nil
}

// Every capability outside Docker's default set minus NET_RAW and MKNOD (as
// runtime/local keeps) is dropped. lxc.cap.keep cannot be used: Incus
// writes lxc.cap.drop lines itself, and LXC refuses both.
var droppedCaps = []string{
	"dac_read_search", "linux_immutable", "net_broadcast", "net_admin", "net_raw",
	"ipc_lock", "ipc_owner", "sys_module", "sys_rawio", "sys_ptrace", "sys_pacct",
	"sys_admin", "sys_boot", "sys_nice", "sys_resource", "sys_time", "sys_tty_config",
	"mknod", "lease", "audit_control", "mac_override", "mac_admin", "syslog",
	"wake_alarm", "block_suspend", "audit_read", "perfmon", "bpf", "checkpoint_restore",
}

// instanceRequest describes sandbox s as an Incus create request.
func (b *Backend) instanceRequest(s *sandbox, src *rootSource) (InstancesPost, error) {
	sp := s.spec
	specJSON, err := json.Marshal(sp)
	if err != nil {
		return InstancesPost{}, err
	}
	// envd listens on the shared socket directory and loopback or, in
	// cluster mode, on the sandbox's routed address (the relay's way in).
	listen := fmt.Sprintf("--socket %s/envd.sock --listen 127.0.0.1:%d", envdSocketDir, runtime.EnvdPort)
	if b.cluster != nil {
		listen = fmt.Sprintf("--listen 0.0.0.0:%d", runtime.EnvdPort)
	}
	raw := []string{
		fmt.Sprintf("lxc.init.cmd = %s --init %s --log-level %s", envdPath, listen, b.opts.EnvdLogLevel),
		"lxc.cap.drop = " + strings.Join(droppedCaps, " "),
		// No no_new_privs: setuid programs work (sudo, as in E2B's
		// sandboxes); what they give is root inside, which the API gives
		// anyone with the sandbox anyway, still without the dropped
		// capabilities (runtime/local does the same).
	}
	if b.opts.ReadOnlyUsr {
		usr := filepath.Join(b.opts.IncusDir, "storage-pools", b.opts.Pool, "containers", s.name, "rootfs", "usr")
		raw = append(raw, "lxc.mount.entry = "+usr+" usr none ro,bind,idmap=container 0 0")
	}
	cfg := map[string]string{
		"limits.cpu":          strconv.Itoa(sp.CPUCount),
		"limits.memory":       strconv.Itoa(sp.MemoryMB) + "MiB",
		"limits.memory.swap":  "false",
		"limits.processes":    strconv.Itoa(b.opts.PidsMax),
		"raw.lxc":             strings.Join(raw, "\n") + "\n",
		"security.privileged": "false",
		// No /dev/incus: the guest API would let the sandbox read its own
		// user.* keys, including the spec's env and access token.
		"security.guestapi": "false",
		// No nested user namespaces (in which an unprivileged user would
		// have CAP_SYS_ADMIN and could mount): set in the container's own
		// user namespace before the capabilities are dropped; without
		// CAP_SYS_RESOURCE, root inside cannot raise it again.
		"linux.sysctl.user.max_user_namespaces": "0",
		keyID:                                   sp.ID,
		keyTemplate:                             sp.Template,
		keyCreatedAt:                            s.createdAt.Format(time.RFC3339Nano),
		keySpec:                                 string(specJSON),
		keyStack:                                strings.Join(s.stack, ","),
		keySource:                               src.id(),
	}
	if b.opts.Namespace != "" {
		cfg[keyNamespace] = b.opts.Namespace
	}
	if src.layer != "" {
		// Not inherited from the layer instance (an empty value drops a
		// key a copy would take over).
		for _, k := range []string{keyLayer, keyOwner, keyLayerSize} {
			cfg[k] = ""
		}
	}
	// Env for envd (and so every process it runs), as runtime/local.
	env := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
		"E2B_SANDBOX": "true", "E2B_SANDBOX_ID": sp.ID,
	}
	maps.Copy(env, sp.Env)
	for k, v := range env {
		cfg["environment."+k] = v
	}
	// Full quota groups count the source's blocks the clone references
	// too: the root then gets the source's size (with 10% for btrfs
	// metadata) on top of DiskSizeMB, so that DiskSizeMB is what the
	// sandbox can write. Simple quotas count only what it writes.
	rootMiB := int64(sp.DiskSizeMB) + 1
	if !b.quota.simple {
		rootMiB += (src.size * 11 / 10) >> 20
	}
	devices := map[string]map[string]string{
		"root": {"type": "disk", "path": "/", "pool": b.opts.Pool, "size": strconv.FormatInt(rootMiB, 10) + "MiB"},
		"envd": {"type": "disk", "source": b.opts.EnvdPath, "path": envdPath, "readonly": "true"},
	}
	maps.Copy(devices, b.volumeDevices(sp.Mounts))
	if b.cluster != nil {
		maps.Copy(devices, b.clusterDevices(s))
		cfg[keyEgressIP] = s.ip.String()
	} else {
		devices["sock"] = map[string]string{"type": "disk", "source": s.dir, "path": envdSocketDir, "shift": "true"}
	}
	if s.ip.IsValid() && b.cluster == nil {
		// A bare veth: Incus names the host end (so that the egress rules,
		// which match its prefix, cover it) and moves the other in as
		// eth0; the addresses and routes are ours (Create).
		host, _ := egress.LinkNames(s.name)
		devices["eth0"] = map[string]string{"type": "nic", "nictype": "p2p", "name": "eth0", "host_name": host}
		devices["resolv"] = map[string]string{"type": "disk", "source": b.resolv, "path": "/etc/resolv.conf", "readonly": "true"}
		cfg[keyEgressIP] = s.ip.String()
	}
	return InstancesPost{
		Name:      s.name,
		Type:      "container",
		Ephemeral: true,
		Start:     true,
		Source:    src.instanceSource(),
		Config:    cfg,
		Profiles:  []string{}, // no default profile: no NIC, our root device
		Devices:   devices,
	}, nil
}

// Create starts a sandbox and returns once envd answers /health. A failed
// or cancelled Create deletes what it made (in the background).
func (b *Backend) Create(ctx context.Context, spec runtime.Spec) (*runtime.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	// The /init body is for this start only (it holds the access token):
	// the sandbox's kept spec goes without it.
	init, forkOf, spread := spec.EnvdInit, spec.ForkOf, spec.SpreadFrom
	spec.EnvdInit, spec.ForkOf, spec.SpreadFrom = nil, "", nil
	// Resolved now: a template defined again later does not change
	// this sandbox.
	im, stack, err := b.templateSource(ctx, spec.Template)
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	var forkSrc string
	if forkOf != "" {
		if forkSrc, err = b.forkSource(ctx, forkOf, spec, im); err != nil {
			return nil, fmt.Errorf("create sandbox %s: fork of %s: %w", spec.ID, forkOf, err)
		}
	}
	// The members a fork, a layered template or a volume may be on.
	var onMembers []string
	if b.cluster != nil {
		if onMembers, err = b.storageMembers(ctx, spec, im, forkOf); err != nil {
			return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
		}
	} else if spec.AllowInternet {
		if err := b.egress.Setup(); err != nil {
			return nil, fmt.Errorf("create sandbox %s: %w: %w", spec.ID, runtime.ErrUnavailable, err)
		}
	}
	// All but one of the host's CPUs at most, as on the local backend: a
	// busy sandbox (a fork bomb) must leave the host a CPU to answer with.
	spec.CPUCount = min(spec.CPUCount, max(1, goruntime.NumCPU()-1))
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.opts.StartTimeout)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	b.ensureQuota(ctx) // the root's size holds only with consistent quota groups
	wrap := func(step string, err error) error {
		return fmt.Errorf("create sandbox %s: %s: %w", spec.ID, step, err)
	}

	s := &sandbox{
		id:        spec.ID,
		name:      b.instanceName(spec.ID),
		spec:      spec,
		createdAt: time.Now().UTC(),
		ready:     make(chan struct{}),
		source:    im.id(),
		stack:     stack,
	}
	s.dir = b.sockDir(s.name)
	// Claim the id, waiting for a deletion of the same id to finish.
	for {
		b.mu.Lock()
		if _, exists := b.sbx[spec.ID]; exists {
			b.mu.Unlock()
			return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, runtime.ErrAlreadyExists)
		}
		gone := b.deleting[spec.ID]
		if gone == nil {
			if err := b.claimAddress(s, onMembers, spread); err != nil {
				b.mu.Unlock()
				return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
			}
			b.sbx[spec.ID] = s
			b.mu.Unlock()
			break
		}
		b.mu.Unlock()
		select {
		case <-gone:
		case <-ctx.Done():
			return nil, wrap("waiting for the previous sandbox of this id to be deleted", ctx.Err())
		}
	}
	// posted: the instance may exist, undo must delete it. keepDir: the
	// socket directory is not ours to remove (until we know no instance of
	// this id exists, it may be another's).
	posted, keepDir := false, true
	var opID string
	defer close(s.ready) // after the undo: waiters then see the outcome
	r := revert.New()
	defer r.Fail()
	r.Add(func() {
		// One step under the lock: the id goes from claimed to deleting
		// with no gap a create of the same id could slip through.
		b.mu.Lock()
		delete(b.sbx, spec.ID)
		if posted {
			// The deletion frees the address once the instance is gone.
			b.startDelete(s.id, s.name, s.dir, opID)
		} else if s.ip.IsValid() {
			delete(b.ips, s.ip)
		}
		b.mu.Unlock()
		if !posted && !keepDir {
			_ = removeSockDir(s.dir)
		}
	})

	t0 := time.Now()
	// Fast path: no socket directory, so no instance of this id that
	// shares our Root runs (a live one always has its directory; one
	// paused to disk, or another Root's, has none, and the POST below
	// then fails with ErrAlreadyExists). Otherwise an instance of this id
	// that the map lacks (an earlier process's, not adopted yet) takes the
	// id, and its socket directory must stay.
	fresh := true
	if s.dir == "" {
		// Cluster mode: no socket directory; a taken name fails the POST.
	} else if err := mountSockDir(s.dir); errors.Is(err, os.ErrExist) {
		fresh = false
		if _, err := b.c.Instance(ctx, s.name); err == nil {
			return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, runtime.ErrAlreadyExists)
		} else if !errors.Is(err, runtime.ErrNotFound) {
			return nil, wrap("instance", err)
		}
		keepDir = false
		if err := makeSockDir(s.dir); err != nil {
			return nil, wrap("socket dir", err)
		}
	} else if err != nil {
		return nil, wrap("socket dir", err)
	}
	keepDir = false
	req, err := b.instanceRequest(s, im)
	if err != nil {
		return nil, wrap("config", err)
	}
	req.Target = targetOf(s.member)
	if b.cluster != nil && im.layer != "" {
		// On a member other than the layer's, the clone is of the
		// layer's replica there (placement chose among the holders).
		if r := b.cluster.replicaOn(im.layer, s.member); r != "" {
			req.Source = InstanceSource{Type: "copy", Source: r, InstanceOnly: true}
		}
	}
	if forkSrc != "" {
		// A copy of the source's root volume (a btrfs snapshot: one
		// moment's files) under this sandbox's config and devices, which
		// override the source's; a pause-to-disk mark is not inherited.
		req.Source = InstanceSource{Type: "copy", Source: forkSrc, InstanceOnly: true}
		req.Config[keyPaused] = ""
	}
	tDir := time.Now()
	opID, err = b.postInstance(ctx, req)
	if err != nil {
		return nil, b.createError(ctx, spec, im, wrap("instance", err))
	}
	posted = true
	if _, err := b.c.Wait(ctx, opID); err != nil {
		if gone := b.createError(ctx, spec, im, err); errors.Is(gone, runtime.ErrTemplateNotFound) {
			return nil, gone
		}
		if errors.Is(err, runtime.ErrAlreadyExists) {
			// Someone else's instance: not ours to delete; the socket
			// directory is ours only if it did not exist before.
			posted, keepDir = false, !fresh
			return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, runtime.ErrAlreadyExists)
		}
		var ie *Error
		if errors.As(err, &ie) && ie.Method == "OP" {
			// Incus undid its own failed create; but a started-then-failed
			// instance may remain, which the deletion handles (404 is fine).
			return nil, wrap("instance", fmt.Errorf("%w: %w", runtime.ErrUnavailable, err))
		}
		return nil, wrap("instance", err)
	}
	tRunning := time.Now()
	tHealthy, err := b.settle(ctx, s, init)
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	b.log.Debug("incus sandbox created", "sandbox", spec.ID, "instance", s.name, "member", s.member, "fresh", fresh,
		"socket_dir", tDir.Sub(t0), "running", tRunning.Sub(tDir), "healthy", tHealthy.Sub(tRunning),
		"network", time.Since(tHealthy), "total", time.Since(t0))
	r.Success()
	s.mu.Lock()
	s.created = true
	s.readyAt = time.Now()
	info := s.info()
	s.mu.Unlock()
	info.EnvdInitialized = init != nil
	return info, nil
}

// claimAddress reserves what sandbox s needs before its instance is made:
// the egress address of a sandbox with internet access or, in cluster
// mode, a member (one of onMembers when set, away from the sandboxes
// spread names) and the routed address every sandbox has there. The
// caller holds b.mu.
func (b *Backend) claimAddress(s *sandbox, onMembers, spread []string) error {
	var ip netip.Addr
	var err error
	switch {
	case b.cluster != nil:
		if s.member, err = b.place(s.spec, onMembers, spread); err != nil {
			return err
		}
		ip, err = b.allocateSandboxIP()
	case s.spec.AllowInternet:
		ip, err = b.egress.Allocate(func(a netip.Addr) bool { _, used := b.ips[a]; return used })
	default:
		return nil
	}
	if err != nil {
		return err
	}
	s.ip = ip
	b.ips[ip] = s.name
	return nil
}

// forkSource returns the instance of sandbox src for a fork into a new
// sandbox of template, whose image is im: src must have been created from
// the same image, so that its root is one of template's, and have the same
// network devices (the copy keeps the source's devices the new sandbox's
// config does not override).
func (b *Backend) forkSource(ctx context.Context, src string, spec runtime.Spec, im *rootSource) (string, error) {
	s, err := b.get(ctx, src)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.spec.Template != spec.Template || s.source != im.id():
		return "", fmt.Errorf("%w: sandbox %s was created from another version of template %q", runtime.ErrInvalidSpec, src, spec.Template)
	case s.spec.AllowInternet != spec.AllowInternet:
		return "", fmt.Errorf("%w: sandbox %s and its fork differ in internet access", runtime.ErrInvalidSpec, src)
	}
	return s.name, nil
}

// createError is err, the failure of a create from im, unless im is gone
// (a layer removed after its template was defined): then
// ErrTemplateNotFound, which Incus does not say in a way to branch on.
func (b *Backend) createError(ctx context.Context, spec runtime.Spec, im *rootSource, err error) error {
	var ierr error
	if im.layer != "" {
		_, ierr = b.c.Instance(context.WithoutCancel(ctx), im.layer)
	} else {
		_, ierr = b.c.Image(context.WithoutCancel(ctx), im.image)
	}
	if errors.Is(ierr, runtime.ErrNotFound) {
		return fmt.Errorf("create sandbox %s: %w: the image of template %q is gone", spec.ID, runtime.ErrTemplateNotFound, spec.Template)
	}
	return err
}

// settle finishes the start of s's running instance: envd answering
// /health, then loopback up and the network of a sandbox with internet
// access, in the network namespace of envd's process, which the socket's
// peer credentials name (no GET …/state: it gathers disk and network usage,
// 5 ms to over 100 ms on a loaded host). envd binds 127.0.0.1 with lo
// still down, and nothing reaches it over TCP before Create returns. It
// returns when envd first answered. With init, envd's first answer is to
// that /init (envdconn.Health.Init).
func (b *Backend) settle(ctx context.Context, s *sandbox, init []byte) (healthy time.Time, err error) {
	if b.cluster != nil {
		// Incus set the routed NIC up on both ends, and LXC loopback.
		if err := envdconn.WaitHealthy(ctx, b.envdDialer(s), envdconn.Health{MaxDelay: 5 * time.Millisecond, Init: init}); err != nil {
			return time.Time{}, fmt.Errorf("envd: %w", err)
		}
		return time.Now(), nil
	}
	if err := envdconn.WaitHealthy(ctx, b.envdDialer(s), envdconn.Health{MaxDelay: 2 * time.Millisecond, Socket: filepath.Join(s.dir, "envd.sock"), Init: init}); err != nil {
		return time.Time{}, fmt.Errorf("envd: %w", err)
	}
	healthy = time.Now()
	pid, err := b.envdPid(ctx, s)
	if err != nil {
		return healthy, fmt.Errorf("envd process: %w", err)
	}
	if err := loopbackUp(pid); err != nil {
		return healthy, fmt.Errorf("loopback: %w", err)
	}
	if s.ip.IsValid() {
		// The veth dies with the container's network namespace, and the
		// host end's address and route with it: no undo needed.
		host, _ := egress.LinkNames(s.name)
		if err := b.egress.ConfigureHost(host, s.ip); err != nil {
			return healthy, fmt.Errorf("network: %w", err)
		}
		if err := egress.ConfigureSandbox(pid, s.ip, b.egress.Gateway()); err != nil {
			return healthy, fmt.Errorf("network: %w", err)
		}
	}
	return healthy, nil
}

// envdPid returns the host pid of the process serving envd's socket (the
// peer credentials of a connection, recorded at its listen), checked to be
// in s's instance's cgroup; failing that, the instance's init from Incus.
func (b *Backend) envdPid(ctx context.Context, s *sandbox) (int, error) {
	if conn, err := b.envdDialer(s)(ctx); err == nil {
		pid := peerPid(conn)
		conn.Close()
		if pid > 0 && inInstanceCgroup(pid, s.name) {
			return pid, nil
		}
	}
	st, err := b.c.InstanceState(ctx, s.name)
	if err != nil {
		return 0, fmt.Errorf("instance state: %w", err)
	}
	return int(st.Pid), nil
}

// peerPid is the pid of a unix connection's peer, 0 if unknown.
func peerPid(conn net.Conn) int {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// inInstanceCgroup reports whether process pid is in the cgroup of Incus
// container name (lxc.payload.<name>, or below it).
func inInstanceCgroup(pid int, name string) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	want := "/lxc.payload." + name
	for line := range strings.SplitSeq(string(raw), "\n") {
		f := strings.SplitN(line, ":", 3) // v2: 0::PATH; v1: N:CONTROLLERS:PATH
		if len(f) < 3 {
			continue
		}
		if path := f[2]; path == want || strings.HasPrefix(path, want+"/") {
			return true
		}
	}
	return false
}

// info reports s; the caller holds s.mu.
func (s *sandbox) info() *runtime.Sandbox {
	state := runtime.StateRunning
	if s.paused {
		state = runtime.StatePaused
	}
	return &runtime.Sandbox{ID: s.id, Template: s.spec.Template, State: state, OnDisk: s.onDisk, Spec: s.spec, CreatedAt: s.createdAt}
}

// envdDialer connects to s's envd: its unix socket in the shared socket
// directory (see envdconn.DialSocket: root inside can plant a symlink
// there) or, in cluster mode, its address through the member's relay.
func (b *Backend) envdDialer(s *sandbox) envdconn.DialFunc {
	if b.cluster != nil {
		return func(ctx context.Context) (net.Conn, error) { return b.dialCluster(ctx, s, runtime.EnvdPort) }
	}
	return func(ctx context.Context) (net.Conn, error) {
		return envdconn.DialSocket(ctx, filepath.Join(s.dir, "envd.sock"), s.id)
	}
}

// get returns the live sandbox id: from memory, or adopted from Incus (a
// sandbox of an earlier process). It waits for a Create in progress.
func (b *Backend) get(ctx context.Context, id string) (*sandbox, error) {
	if !runtime.ValidID(id) {
		return nil, fmt.Errorf("sandbox %q: %w", id, runtime.ErrNotFound)
	}
	b.mu.Lock()
	s := b.sbx[id]
	_, deleting := b.deleting[id]
	b.mu.Unlock()
	if deleting && s == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, runtime.ErrNotFound)
	}
	if s == nil {
		in, err := b.c.Instance(ctx, b.instanceName(id))
		if err != nil {
			if errors.Is(err, runtime.ErrNotFound) {
				return nil, fmt.Errorf("sandbox %s: %w", id, runtime.ErrNotFound)
			}
			return nil, err
		}
		if s = b.adopt(in); s == nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, runtime.ErrNotFound)
		}
	}
	if err := runtime.AwaitCreate(ctx, id, s.ready, &s.created); err != nil {
		return nil, err
	}
	return s, nil
}

// adopt returns the handle of a live sandbox instance, adding it to the map
// if needed; nil if in is not a live sandbox or is being deleted.
func (b *Backend) adopt(in *Instance) *sandbox {
	id := in.Config[keyID]
	if b.isLostInstance(in) || !b.ours(in) {
		return nil
	}
	onDisk := in.Status == "Stopped" && in.Config[keyPaused] == pausedDisk
	if in.Status != "Running" && in.Status != "Frozen" && !onDisk {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.sbx[id]; s != nil {
		return s
	}
	if _, deleting := b.deleting[id]; deleting {
		return nil
	}
	var sp runtime.Spec
	if err := json.Unmarshal([]byte(in.Config[keySpec]), &sp); err != nil || sp.ID != id {
		sp = runtime.Spec{ID: id, Template: in.Config[keyTemplate]}
	}
	created, err := time.Parse(time.RFC3339Nano, in.Config[keyCreatedAt])
	if err != nil {
		created = in.CreatedAt
	}
	ready := make(chan struct{})
	close(ready)
	s := &sandbox{
		id: id, name: in.Name, spec: sp, createdAt: created,
		paused: in.Status == "Frozen" || onDisk, onDisk: onDisk, ready: ready, created: true, readyAt: time.Now(),
	}
	if st, ok := in.Config[keyStack]; ok {
		s.stack = strings.Split(st, ",")
	} else {
		s.stack = []string{sp.Template} // made before layers existed
	}
	s.dir = b.sockDir(in.Name)
	if b.cluster != nil {
		s.member = in.Location
	}
	s.source = in.Config[keySource]
	if s.source == "" {
		s.source = in.Config["volatile.base_image"] // made before layer instances
	}
	if ip, err := netip.ParseAddr(in.Config[keyEgressIP]); err == nil {
		s.ip = ip
		b.ips[ip] = in.Name
	}
	b.sbx[id] = s
	return s
}

// List returns the live sandboxes: every Incus instance with a
// user.sandboxd.id that is running, frozen or stopped by a pause to disk, minus those being deleted or
// created.
func (b *Backend) List(ctx context.Context) ([]*runtime.Sandbox, error) {
	t0 := time.Now()
	all, err := b.c.Instances(ctx, keyID)
	if err != nil {
		return nil, err
	}
	var out []*runtime.Sandbox
	exists := map[string]bool{}
	for _, in := range all {
		if b.ours(in) {
			exists[in.Config[keyID]] = true
		}
		s := b.adopt(in)
		if s == nil {
			continue
		}
		select {
		case <-s.ready:
		default:
			continue // still being created
		}
		s.mu.Lock()
		if s.created {
			if !s.onDisk {
				s.paused = in.Status == "Frozen"
			}
			out = append(out, s.info())
		}
		s.mu.Unlock()
	}
	// A sandbox whose instance vanished (envd exited, so the container
	// stopped and Incus deleted it as ephemeral) is forgotten, and its
	// socket directory removed. Only those known before the listing began.
	b.mu.Lock()
	for id, s := range b.sbx {
		if exists[id] {
			continue
		}
		select {
		case <-s.ready:
		default:
			continue
		}
		if !s.created || s.readyAt.After(t0) || !b.memberUsable(s.member) {
			continue // a member that does not answer lists stubs: see cluster.go
		}
		delete(b.sbx, id)
		b.startDelete(id, s.name, s.dir, "")
		b.log.Warn("incus: sandbox instance is gone (did envd exit?); forgetting it", "sandbox", id, "instance", s.name)
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(a, b *runtime.Sandbox) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}
