package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sync"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/runtime/local/spawn"
	"github.com/sandboxd/sandboxd/runtime/local/starter"
)

// Create starts a sandbox and returns once envd answers /health, or has
// accepted spec.EnvdInit as its /init (then the Sandbox says
// EnvdInitialized). Every step registers its undo, so a failed or
// cancelled Create leaves nothing.
func (b *Backend) Create(ctx context.Context, spec runtime.Spec) (_ *runtime.Sandbox, err error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	// The /init body is for this start only (it holds the access token):
	// the sandbox's kept spec goes without it.
	init, forkOf := spec.EnvdInit, spec.ForkOf
	spec.EnvdInit, spec.ForkOf = nil, ""
	tpl := b.template(spec.Template)
	if tpl == nil {
		return nil, fmt.Errorf("create sandbox %s: %w: %q", spec.ID, runtime.ErrTemplateNotFound, spec.Template)
	}
	if forkOf != "" {
		if err := b.checkFork(ctx, forkOf, tpl); err != nil {
			return nil, fmt.Errorf("create sandbox %s: fork of %s: %w", spec.ID, forkOf, err)
		}
	}
	if ncpu := numCPU(); spec.CPUCount > ncpu {
		spec.CPUCount = ncpu // the host keeps one; report what holds
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.opts.StartTimeout)
		defer cancel()
	}

	t0 := time.Now()
	dir := filepath.Join(b.sandboxesDir(), spec.ID)
	s := &sandbox{
		id:    spec.ID,
		dir:   dir,
		ready: make(chan struct{}),
		meta: meta{
			Spec: spec, Lowers: tpl.lowers, Base: tpl.base,
			CreatedAt: time.Now().UTC(), UserNS: b.userNS && tpl.userNS,
		},
		writers: b.newWriterRecord(),
	}
	if !tpl.defined {
		s.meta.Template = tpl.lower()
	}
	if spec.Background && b.opts.SpawnPath != "" {
		s.restorePriority = lowerThreadPriority()
		defer s.restorePriority()
	}
	s.layers = b.layerKeys(tpl.lowers)
	if spec.AllowInternet {
		if err := b.egress.setup(); err != nil {
			return nil, fmt.Errorf("create sandbox %s: %w: %w", spec.ID, runtime.ErrUnavailable, err)
		}
	}
	b.mu.Lock()
	if _, exists := b.sbx[spec.ID]; exists {
		b.mu.Unlock()
		return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, runtime.ErrAlreadyExists)
	}
	var ip netip.Addr
	if spec.AllowInternet {
		var err error
		if ip, err = b.egress.allocate(b.ips); err != nil {
			b.mu.Unlock()
			return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
		}
		b.ips[ip] = true
	}
	b.sbx[spec.ID] = s
	b.mu.Unlock()

	defer close(s.ready) // after the undos: waiters then see the outcome
	r := revert.New()
	defer r.Fail()
	r.Add(func() {
		b.mu.Lock()
		delete(b.sbx, spec.ID)
		if ip.IsValid() {
			delete(b.ips, ip)
		}
		b.mu.Unlock()
	})
	wrap := func(step string, err error) error {
		return fmt.Errorf("create sandbox %s: %s: %w", spec.ID, step, err)
	}

	// A directory left by an earlier process is a live sandbox (adopt would
	// have found it) or debris for Reconcile: either way the id is taken.
	if err := makeStateDir(dir, s.meta.UserNS); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, runtime.ErrAlreadyExists)
		}
		return nil, wrap("state dir", err)
	}
	r.Add(func() {
		if err := b.cleanup(spec.ID, dir); err != nil {
			b.log.Warn("undo create", "sandbox", spec.ID, "err", err)
		}
	})

	var restore func(upper string) error
	if forkOf != "" {
		// Written by a child in the new sandbox's cgroup, as a resume from
		// disk restores: the copy is charged to the fork, not to sandboxd.
		restore = func(upper string) error {
			return b.withFrozenUpper(ctx, forkOf, func(_ *sandbox, src string) error {
				return copyTreeInCgroup(ctx, b.cgroupPath(spec.ID), src, upper)
			})
		}
	}
	if err := s.prepareDisk(restore); err != nil {
		return nil, wrap("disk", err)
	}
	if err := b.start(ctx, s, tpl, ip, init, r); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}

	b.log.Debug("sandbox created", "sandbox", spec.ID, "total", time.Since(t0))

	s.mu.Lock()
	defer s.mu.Unlock()
	s.created = true
	r.Success()
	info, err := s.info()
	if err != nil {
		return nil, err
	}
	info.EnvdInitialized = init != nil
	return info, nil
}

// checkFork checks that sandbox src can be forked into a new sandbox of
// tpl: src runs on the same lower directories (tpl has not been redefined
// since) with the same user namespace, so its writable layer reads the
// same on top of tpl's and its file owners mean the same.
func (b *Backend) checkFork(ctx context.Context, src string, tpl *template) error {
	s, err := b.get(ctx, src)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.gone:
		return fmt.Errorf("sandbox %s: %w", src, runtime.ErrNotFound)
	case s.meta.Spec.Template != tpl.name || !slices.Equal(s.meta.Lowers, tpl.lowers):
		return fmt.Errorf("%w: sandbox %s was created from another version of template %q", runtime.ErrInvalidSpec, src, tpl.name)
	case s.meta.UserNS != (b.userNS && tpl.userNS):
		return fmt.Errorf("%w: sandbox %s runs in another kind of user namespace", runtime.ErrUnsupported, src)
	}
	return nil
}

// makeStateDir makes a sandbox's state directory dir, which must not exist.
func makeStateDir(dir string, userNS bool) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if userNS {
		// The sandbox's root (a host id of its own) must reach rootfs/
		// to set it up; nobody else on the host may.
		if err := errors.Join(os.Chown(dir, 0, userNSBase), os.Chmod(dir, 0o710)); err != nil {
			_ = os.Remove(dir)
			return err
		}
	}
	return nil
}

// writeJSON writes v to path atomically: a reader sees all of it or nothing.
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// The paths of a sandbox's state directory; see the package doc.
func (s *sandbox) diskDir() string   { return filepath.Join(s.dir, "disk") }
func (s *sandbox) rootfsDir() string { return filepath.Join(s.dir, "rootfs") }
func (s *sandbox) upperDir() string  { return filepath.Join(s.dir, "disk", "upper") }

// prepareDisk mounts the sandbox's disk tmpfs and makes the directories the
// sandbox writes to, filling the overlay's upper layer with restore when
// given (a resume from disk). Its undo is cleanup's (Create) or
// stopToDisk's (resume): both unmount everything under the state dir.
func (s *sandbox) prepareDisk(restore func(upper string) error) error {
	// Everything the sandbox can write to lives on its disk tmpfs, so its
	// size bounds it: the overlay's upper layer, the socket directory
	// (bind-mounted in, writable by root inside) and envd's log (which
	// root inside can write through /proc/1/fd/2).
	disk := s.diskDir()
	for _, d := range []string{disk, s.rootfsDir()} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if err := mountTmpfs(disk, s.meta.Spec.DiskSizeMB); err != nil {
		return err
	}
	for _, d := range []string{"work", "envd"} {
		if err := os.Mkdir(filepath.Join(disk, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(disk, "envd"), 0o700); err != nil {
		return err
	}
	if restore != nil {
		return restore(s.upperDir())
	}
	return os.Mkdir(s.upperDir(), 0o755)
}

// start mounts the sandbox's root on its prepared disk, gives it its
// network (ip, when valid) and starts envd in a new container, returning
// once envd answers /health, or accepts init as its /init when given. It
// writes meta.json once the container runs.
// Its undos kill the container and delete the links; the mounts and the
// cgroup are left to the caller's cleanup.
func (b *Backend) start(ctx context.Context, s *sandbox, tpl *template, ip netip.Addr, init []byte, r *revert.Reverter) error {
	var (
		spec    = s.meta.Spec
		dir     = s.dir
		rootfs  = s.rootfsDir()
		sockDir = filepath.Join(s.diskDir(), "envd")
		logPath = filepath.Join(s.diskDir(), "envd.log")
	)
	t0 := time.Now()
	// With debug logs on, the start's thread is read before and after (its
	// goroutine wired to it meanwhile): the wiring costs a create a thread
	// handoff at each wait, too much to pay when nobody reads the figures.
	debug := b.log.Enabled(ctx, slog.LevelDebug)
	var thread0 taskTimes
	if debug {
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		thread0, _ = threadTimes()
	}
	if err := b.startableUserNS(s); err != nil {
		return err
	}
	lowers := tpl.lowers
	if s.meta.UserNS {
		if err := chownToMappedRoot(s.upperDir(), sockDir); err != nil {
			return fmt.Errorf("user namespace: %w", err)
		}
		var err error
		if lowers, err = b.idmappedLowers(tpl.lowers); err != nil {
			return fmt.Errorf("%w: user namespace: idmapped template: %w", runtime.ErrUnavailable, err)
		}
	}
	if err := mountOverlay(rootfs, lowers, s.upperDir(), filepath.Join(s.diskDir(), "work")); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := os.Chmod(rootfs, 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}

	tNet := time.Now()
	var resolv string
	if ip.IsValid() {
		resolv = filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(resolv, b.egress.ResolvConf(), 0o644); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}

	tMounted := time.Now()
	delegate := b.delegates(s)
	if delegate {
		owner := 0
		if s.meta.UserNS {
			owner = userNSBase
		}
		// Before libcontainer applies the cgroup: once it holds init, the
		// subtree must already be the sandbox's. The caller's cleanup
		// removes it, as it does libcontainer's.
		if err := delegateCgroup(b.cgroupPath(spec.ID), owner); err != nil {
			return err
		}
	}
	volumes, err := b.volumeMounts(ctx, s)
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	oci := ociSpec(specInput{
		spec:      spec,
		pidsMax:   int64(b.opts.PidsMax),
		swap:      b.swap,
		rootfs:    rootfs,
		tpl:       tpl,
		envdHost:  b.envdPath,
		socketDir: sockDir,
		cgroup:    b.cgroupPath(spec.ID),
		seccomp:   b.seccomp,
		logLevel:  b.opts.EnvdLogLevel,
		resolv:    resolv,
		userNS:    s.meta.UserNS,
		delegate:  delegate,
		volumes:   volumes,
	})
	cfg, err := libcontainerConfig(spec.ID, oci, s.meta.UserNS)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	// No session keyring per sandbox where seccomp denies the keyring
	// syscalls anyway (keyctl, add_key, request_key): nothing inside could
	// use it, and each one counts against its owner's key quota. With user
	// namespaces that owner is the one mapped root of every sandbox, a
	// plain user with kernel.keys.maxkeys = 200 keys: creates failed from
	// about the 200th live sandbox on ("unable to create session key: disk
	// quota exceeded"). The inherited keyring is out of reach the same way.
	cfg.NoNewKeyring = b.seccomp
	tCreated := time.Now()
	s.envdOnHost.Store(false) // until sandboxd-spawn starts it with the socket (a resume may not)
	s.killInit = nil          // until sandboxd-spawn starts it
	pid, exited, err := b.run(ctx, s, cfg, oci.Process, logPath, r)
	if err != nil {
		return err
	}
	tStarted := time.Now()
	s.exited, s.initPid = exited, pid
	if err := bindBootID(s.dir, pid); err != nil {
		return err
	}
	tRoute := time.Now()
	if ip.IsValid() {
		// The veth is made once init's network namespace exists, its
		// peer right in it (no device move between namespaces).
		r.Add(func() { deleteLinks(spec.ID) })
		ni, err := b.egress.createVethIn(spec.ID, ip, pid)
		if err != nil {
			return fmt.Errorf("network: %w", err)
		}
		s.meta.Net = &ni
	}

	tRouted := time.Now()
	if err := writeJSON(filepath.Join(dir, "meta.json"), s.meta); err != nil {
		return fmt.Errorf("meta: %w", err)
	}
	// A socket sandboxd bound takes connections before envd accepts
	// them: the first request waits in its queue, nothing to watch for.
	watch := filepath.Join(sockDir, "envd.sock")
	if s.envdOnHost.Load() {
		watch = ""
	}
	if err := envdconn.WaitHealthy(ctx, s.dialEnvd, envdconn.Health{
		Exited: exited, LogHint: "its log is disk/envd.log", MaxDelay: 2 * time.Millisecond,
		Socket: watch, Init: init,
	}); err != nil {
		return fmt.Errorf("envd: %w", err)
	}
	if spec.Background {
		// Up: from here it is a sandbox like any, with its full share.
		parent, err := b.cpuParent()
		if err != nil {
			return err
		}
		if err := setCPUShares(filepath.Join(parent, spec.ID), cpuShares(spec.CPUCount)); err != nil {
			return err
		}
		s.meta.Spec.Background = false
	}
	if s.ctr == nil {
		s.loadLater(filepath.Join(dir, "ctr"))
	}
	// From envd's answer on: what envd does to start (before it answers)
	// is nobody's work.
	b.armWriters(s, pid)
	r.Add(func() { b.disarmWriters(s, false) })
	if debug {
		thread, _ := threadTimes()
		thread = thread.sub(thread0)
		agent, _ := processTimes(pid)
		b.log.Debug("sandbox started", "sandbox", spec.ID, "background", spec.Background,
			"mounts", tNet.Sub(t0), "net", tMounted.Sub(tNet), "config", tCreated.Sub(tMounted),
			"run", tStarted.Sub(tCreated), "route", tRouted.Sub(tRoute), "health", time.Since(tRouted),
			"threadCPU", thread.onCPU, "threadRunqueue", thread.runqueue,
			"envdCPU", agent.onCPU, "envdRunqueue", agent.runqueue)
	}
	return nil
}

// run creates and starts sandbox s's container from cfg, with envd (proc)
// as its init writing to logPath. It returns init's pid and a channel
// closed when init exits, and registers on r the undos that kill init and
// destroy the container. With Options.SpawnPath sandboxd-spawn starts it
// (spawnNative), unless it cannot do what cfg asks. Otherwise, with
// Options.InitPath the helper sandboxd-init does the libcontainer calls
// (package starter), so that the init libcontainer re-executes is that
// small binary. s.ctr is then nil, for a call that needs it to load
// (loadLater). Without either this process does libcontainer's calls,
// re-executes itself, and sets s.ctr.
func (b *Backend) run(ctx context.Context, s *sandbox, cfg *configs.Config, proc *specs.Process, logPath string, r *revert.Reverter) (int, <-chan struct{}, error) {
	spec := starter.Spec{
		Root: filepath.Join(s.dir, "ctr"), ID: s.id, Config: cfg,
		Args: proc.Args, Env: proc.Env, Cwd: proc.Cwd, Log: logPath,
	}
	if b.opts.SpawnPath != "" {
		pid, exited, err := b.spawnNative(ctx, s, cfg, proc, logPath, r)
		if !errors.Is(err, spawn.ErrUnsupported) {
			return pid, exited, err
		}
		// libcontainer's processes would inherit a background create's
		// nice value, which only sandboxd-spawn gives back.
		if s.restorePriority != nil {
			s.restorePriority()
		}
		// Not a config the local backend makes today: say so once.
		level := slog.LevelDebug
		b.fallbackOnce.Do(func() { level = slog.LevelWarn })
		b.log.Log(ctx, level, "local backend: sandboxd-spawn does not start this sandbox; libcontainer does", "sandbox", s.id, "err", err)
	}
	var (
		ctr    *libcontainer.Container
		pid    int
		exited <-chan struct{}
		pidErr error
	)
	if b.starter != nil {
		var err error
		pid, exited, err = b.starter.Start(ctx, spec)
		if errors.Is(err, starter.ErrUnavailable) {
			return 0, nil, fmt.Errorf("%w: %w", runtime.ErrUnavailable, err)
		}
		if err != nil {
			return 0, nil, err // the helper left nothing
		}
		// No handle yet to kill with: init is the first process of the
		// cgroup, and of a pid namespace (all of it goes with it). The
		// caller's cleanup removes the state and the cgroups by path.
		cg := b.cgroupPath(s.id)
		r.Add(func() {
			openCgroup(cg).kill()
			<-exited
		})
		return pid, exited, nil
	} else {
		c, p, err := starter.Run(spec)
		if err != nil {
			return 0, nil, err
		}
		ctr = c
		ch := make(chan struct{})
		// The waiter reaps init. It exits when init does: on Destroy, on a
		// pause to disk, or when envd dies on its own.
		go func() {
			_, _ = p.Wait()
			close(ch)
		}()
		exited = ch
		if pid, pidErr = p.Pid(); pidErr != nil {
			pidErr = fmt.Errorf("start: %w", pidErr)
		}
	}
	s.ctr = ctr
	// cleanup removes the cgroups and the state by path as well; Destroy
	// here keeps libcontainer's view consistent while it can.
	r.Add(func() { _ = ctr.Destroy() })
	r.Add(func() {
		_ = ctr.Signal(unix.SIGKILL)
		<-exited
	})
	if pidErr != nil {
		return 0, nil, pidErr
	}
	return pid, exited, nil
}

// specconvMu serializes specconv.CreateLibcontainerConfig: with a user
// namespace it sets the owner of its package-level default devices in
// place (a data race between concurrent creates).
var specconvMu sync.Mutex

// libcontainerConfig turns oci into libcontainer's config for sandbox id,
// with device nodes of its own, owned by the sandbox's root (the host's
// userNSBase with a user namespace, else 0) whatever another create left in
// specconv's shared defaults.
func libcontainerConfig(id string, oci *specs.Spec, userNS bool) (*configs.Config, error) {
	specconvMu.Lock()
	defer specconvMu.Unlock()
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{CgroupName: id, Spec: oci})
	if err != nil {
		return nil, err
	}
	var owner uint32
	if userNS {
		owner = userNSBase
	}
	for i, d := range cfg.Devices {
		c := *d
		c.Uid, c.Gid = owner, owner
		cfg.Devices[i] = &c
	}
	return cfg, nil
}

// loadLater leaves libcontainer's handle of s's container, which
// sandboxd-spawn or sandboxd-init started, to be loaded from the state under
// root when a call needs it (container: pause, stats, layers). Reading and
// decoding that state takes 0.4-0.6 ms of CPU, which most sandboxes never
// need: a destroy of a sandbox started here kills it by its cgroup. A
// failed load leaves the sandbox without a handle: its destroy still kills
// and removes it by cgroup and by path.
func (s *sandbox) loadLater(root string) {
	s.ctr, s.ctrRoot, s.ctrErr = nil, root, nil
}
