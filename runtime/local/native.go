package local

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/runtime/local/spawn"
	"github.com/sandboxd/sandboxd/runtime/local/starter"
)

// spawnNative starts sandbox s with sandboxd-spawn (Options.SpawnPath,
// package spawn) instead of libcontainer's chain: it makes and configures
// the cgroup as libcontainer would, has the spawner clone the init into it,
// and writes libcontainer's state for the container, so that everything
// after the start goes through libcontainer as before. It returns
// spawn.ErrUnsupported, having done nothing, for a config the spawner does
// not handle. Like run, it registers on r the undo that kills init, and
// leaves the cgroup and the state to the caller's cleanup.
func (b *Backend) spawnNative(ctx context.Context, s *sandbox, cfg *configs.Config, proc *specs.Process, logPath string, r *revert.Reverter) (int, <-chan struct{}, error) {
	var bpf []byte
	if cfg.Seccomp != nil {
		var err error
		if bpf, err = b.seccompBPF(cfg.Seccomp); err != nil {
			return 0, nil, err
		}
	}
	paths, err := joinedCgroupDirs(cfg.Cgroups.Path)
	if err != nil {
		return 0, nil, fmt.Errorf("cgroup: %w", err)
	}
	m, err := manager.NewWithPaths(cfg.Cgroups, paths)
	if err != nil {
		return 0, nil, fmt.Errorf("cgroup: %w", err)
	}
	dirs := slices.Sorted(maps.Values(paths))
	dirs = slices.Compact(dirs)
	cfg, args, sock, err := envdOnHost(cfg, proc.Args)
	if err != nil {
		return 0, nil, err
	}
	req, err := spawn.Encode(cfg, spawn.Process{Args: args, Env: proc.Env, Cwd: proc.Cwd, Nice: b.nice}, dirs, bpf)
	if err != nil {
		return 0, nil, err
	}
	var listener *os.File
	if sock {
		if listener, err = listenEnvd(s.dir); err != nil {
			return 0, nil, err
		}
		// envd holds it from here: a connection to an envd that exited
		// fails at once (LocalEnvdChannel).
		defer listener.Close()
	}
	b.presetDevices(paths, cfg.Cgroups.Resources)
	if dir, ok := paths["memory"]; ok {
		b.memcgs.take(dir) // else Apply makes it
	}
	// As libcontainer's start: the directories, then the limits, before
	// the init runs anything of its own.
	if err := m.Apply(-1); err != nil {
		return 0, nil, fmt.Errorf("cgroup: %w", err)
	}
	if err := m.Set(cfg.Cgroups.Resources); err != nil {
		return 0, nil, fmt.Errorf("cgroup: %w", err)
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, nil, fmt.Errorf("log: %w", err)
	}
	pid, err := spawn.Start(ctx, b.opts.SpawnPath, req, logf, b.spawnNS, listener)
	logf.Close()
	if err != nil {
		return 0, nil, fmt.Errorf("start: %w", err)
	}
	s.envdOnHost.Store(sock)
	exited, kill := reapChild(pid)
	s.killInit = kill
	cg := b.cgroupPath(s.id)
	r.Add(func() {
		openCgroup(cg).kill()
		<-exited
	})
	if err := spawn.WriteState(filepath.Join(s.dir, "ctr"), s.id, cfg, pid, paths); err != nil {
		return 0, nil, err
	}
	return pid, exited, nil
}

// presetDevices gives CgroupParent, on a cgroup v1 host, the device rules
// of the sandbox whose cgroup directories are paths, once per backend. A
// v1 devices cgroup starts with its parent's rules, so that the sandboxes
// made after it need no write of their own: libcontainer's Set reads the
// rules, finds them as asked and leaves them, where it wrote a dozen
// (deny all, then each device allowed), the rules being the same for every
// sandbox. Should a sandbox ever ask for a device the parent denies, its
// Set fails (a child cannot allow what its parent denies): loudly, never
// looser. The kernel refuses to change a parent that has children already
// (EINVAL: sandboxes adopted from an earlier process, which set its rules
// then, or others' cgroups under a parent the operator shares): then the
// parent stays as it is and each sandbox writes its own rules, as before.
func (b *Backend) presetDevices(paths map[string]string, r *cgroups.Resources) {
	dev, ok := paths["devices"]
	if !ok || cgroups.DevicesSetV1 == nil || b.opts.CgroupParent == "/" {
		return // cgroup v2, or no devices hierarchy
	}
	b.devicesOnce.Do(func() {
		parent := filepath.Dir(dev)
		err := os.MkdirAll(parent, 0o755)
		if err == nil {
			err = cgroups.DevicesSetV1(parent, &cgroups.Resources{Devices: r.Devices})
		}
		if err != nil {
			b.log.Debug("local backend: the sandboxes' device rules stay per sandbox", "cgroup", parent, "err", err)
		}
	})
}

// reapChild returns a channel closed once this process's child pid has
// exited and been reaped, and a kill that SIGKILLs it through a pidfd of
// its own (nil without pidfds): a signal that cannot reach another process
// after the reap, as one by pid could. It waits on a pidfd through Go's
// poller (no thread per sandbox); the pid stays the child's until the reap.
func reapChild(pid int) (<-chan struct{}, func() error) {
	done := make(chan struct{})
	reap := func() {
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); !errors.Is(err, unix.EINTR) {
				break
			}
		}
		close(done)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		go reap() // no pidfd: a thread waits
		return done, nil
	}
	// The watch closes its pidfd once the child exits; the kill's copy is
	// closed under mu, so that a kill never uses a number the process has
	// given to another file since.
	var mu sync.Mutex
	sig, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		sig = -1
	}
	killable := sig >= 0 // sig is the watch's to change from here on, under mu
	exited := starter.WatchExit(os.NewFile(uintptr(fd), "pidfd"))
	go func() {
		<-exited
		mu.Lock()
		if sig >= 0 {
			unix.Close(sig)
			sig = -1
		}
		mu.Unlock()
		reap()
	}()
	if !killable {
		return done, nil
	}
	return done, func() error {
		mu.Lock()
		defer mu.Unlock()
		if sig < 0 {
			return nil // exited
		}
		if err := unix.PidfdSendSignal(sig, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("kill init: %w", err)
		}
		return nil
	}
}

// seccompBPF compiles the seccomp profile once: it is the same for every
// sandbox (seccompProfile), and libseccomp takes ≈ 1 ms for it.
func (b *Backend) seccompBPF(c *configs.Seccomp) ([]byte, error) {
	b.bpfOnce.Do(func() { b.bpf, b.bpfErr = spawn.CompileSeccomp(c) })
	return b.bpf, b.bpfErr
}

// envdOnHost turns a start whose envd binds its socket in the socket
// directory (--socket <path>, the directory bound at envdSocketDir) into
// one whose envd is handed the socket sandboxd bound on the host
// (--socket-fd 3, envdHostSocket): the arguments say so, and the config
// (a copy; cfg is left as it is, for libcontainer's start should
// sandboxd-spawn refuse it) loses the socket directory's bind mount, one
// mount a create less and one host directory fewer inside. sock says
// whether envd had a socket.
func envdOnHost(cfg *configs.Config, args []string) (_ *configs.Config, _ []string, sock bool, _ error) {
	i := slices.Index(args, "--socket")
	if i < 0 {
		return cfg, args, false, nil
	}
	if i+1 >= len(args) {
		return nil, nil, false, errors.New("envd's arguments: --socket without a path")
	}
	out := slices.Clone(args)
	out[i], out[i+1] = "--socket-fd", "3"
	c := *cfg
	c.Mounts = slices.DeleteFunc(slices.Clone(cfg.Mounts), func(m *configs.Mount) bool {
		return m.Destination == envdSocketDir
	})
	return &c, out, true, nil
}

// listenEnvd binds envd's socket in the sandbox's host directory dir, as
// envdHostSocket, sandboxd's to hand over, in place of one a previous start
// of the sandbox (a resume) left there. It binds through the directory's
// descriptor: a socket's path may not be longer than 107 bytes, and dir
// may be deep.
func listenEnvd(dir string) (*os.File, error) {
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("envd socket: %w", os.NewSyscallError("open", err))
	}
	defer unix.Close(d)
	if err := unix.Unlinkat(d, envdHostSocket, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("envd socket: %w", os.NewSyscallError("unlink", err))
	}
	path := fmt.Sprintf("/proc/self/fd/%d/%s", d, envdHostSocket)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("envd socket: %w", err)
	}
	// The file stays when the listener is closed: envd holds its copy.
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	l.Close()
	if err != nil {
		return nil, fmt.Errorf("envd socket: %w", err)
	}
	return f, nil
}
