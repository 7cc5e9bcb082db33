package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// numCPU is the most CPUs a sandbox may use: all but one of the host's, so
// that however busy its sandboxes are (a fork bomb burns all it is given),
// the host keeps a CPU for sandboxd, envd's answers and ssh. A one-CPU host
// gives it all.
func numCPU() int { return max(1, goruntime.NumCPU()-1) }

// Destroy kills the sandbox and removes everything it held. It is
// idempotent, and also removes the leftovers of a sandbox whose init died.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil // cannot exist
	}
	dir := filepath.Join(b.sandboxesDir(), id)
	b.mu.Lock()
	s := b.sbx[id]
	if s == nil {
		// Unknown here: maybe a dead sandbox of an earlier process. Hold
		// the id while cleaning up, so that a concurrent Create of the
		// same id fails (ErrAlreadyExists) instead of racing the cleanup.
		hold := &sandbox{id: id, dir: dir, ready: make(chan struct{})}
		b.sbx[id] = hold
		b.mu.Unlock()
		deleteLinks(id)
		err := errors.Join(b.cleanup(id, dir), b.removeSaved(id))
		b.mu.Lock()
		delete(b.sbx, id)
		b.mu.Unlock()
		close(hold.ready)
		if err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", id, err)
		}
		return nil
	}
	b.mu.Unlock()
	select {
	case <-s.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !s.created {
		return nil // the failed Create undid itself
	}

	// From here on, ctx is not consulted: a destroy runs to the end even
	// if the caller gives up.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return nil
	}
	b.disarmWriters(s, false)
	// SIGKILL to init kills the whole pid namespace, and nothing outside
	// it is in the sandbox's cgroup. A sandbox this process started
	// (exited is set while it runs or is paused in memory) is killed
	// through init's pidfd, or by its cgroup, which thaws a paused one
	// first (a frozen task dies only once thawed) but walks and reads the
	// cgroup for it: libcontainer's handle, whose load costs more than the
	// rest of the kill, is not needed. An adopted one goes through
	// libcontainer. Should anything be left in the cgroup, its removal
	// kills it (removeKilled).
	release := func() error { return b.cleanup(id, dir) }
	if s.exited != nil {
		cg := openCgroup(b.cgroupPath(id))
		if s.frozen || s.killInit == nil || s.killInit() != nil {
			cg.kill()
		}
		if err := s.waitExit(); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", id, err)
		}
		release = func() error { return b.removeKilled(cg, dir) } // nothing left to kill
	} else {
		switch ctr, err := s.container(); {
		case err != nil:
			// No handle: cleanup kills what is in the cgroups.
			b.log.Warn("destroy: kill", "sandbox", id, "err", err)
		case ctr != nil: // nil: paused to disk, nothing runs
			if err := ctr.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
				b.log.Warn("destroy: kill", "sandbox", id, "err", err)
			}
			if err := s.waitExit(); err != nil {
				return fmt.Errorf("destroy sandbox %s: %w", id, err)
			}
		}
	}
	if err := errors.Join(release(), b.removeSaved(id)); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	s.gone = true
	b.mu.Lock()
	if b.sbx[id] == s {
		delete(b.sbx, id)
		if s.meta.Net != nil {
			b.releaseNet(id, s.meta.Net.IP)
		}
	}
	b.mu.Unlock()
	return nil
}

// releaseNet frees the egress address of destroyed sandbox id once its host
// veth end is gone. Called with b.mu held.
//
// The pair goes by itself with the sandbox's network namespace, which the
// kernel tears down in the background once the last process in it died
// (15-30 ms here). Deleting the host end ourselves takes as long, in an RCU
// wait: it was most of a destroy with internet (20 ms of 23). So Destroy
// returns without it, and the address stays taken until the link is gone,
// so that no new sandbox gets a route that clashes with it. A link still
// there after linkGoneWait is deleted here. Close waits for these.
func (b *Backend) releaseNet(id string, ip netip.Addr) {
	b.releasing.Add(1)
	go func() {
		defer b.releasing.Done()
		host, _ := linkNames(id)
		deadline := time.Now().Add(linkGoneWait)
		for linkExists(host) {
			if time.Now().After(deadline) {
				deleteLinks(id)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := b.egress.ClearPolicy(ip); err != nil {
			b.log.Warn("egress policy of a destroyed sandbox", "sandbox", id, "err", err)
		}
		b.mu.Lock()
		delete(b.ips, ip)
		b.mu.Unlock()
	}()
}

// linkGoneWait bounds the wait for the kernel to remove a destroyed
// sandbox's veth with its network namespace.
const linkGoneWait = 2 * time.Second

// waitExit waits for init to be gone after a SIGKILL: through the reaper for
// a sandbox this process started, by polling for one adopted from an earlier
// process (whose init is reaped by its new parent).
func (s *sandbox) waitExit() error {
	if s.exited != nil {
		select {
		case <-s.exited:
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("init did not exit after SIGKILL")
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := s.ctr.Status()
		if err != nil || st == libcontainer.Stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("init did not exit after SIGKILL")
		}
		time.Sleep(time.Millisecond)
	}
}

// cleanup removes what sandbox id holds on the host, whatever state it is
// in, but its saved layer (see removeSaved) and its veth (deleteLinks or
// releaseNet): it kills any process left in
// its cgroups, unmounts everything under dir, removes dir and removes the
// cgroups. Mounts go before cgroups so that the tmpfs's pages are freed
// while they are still charged to the sandbox.
func (b *Backend) cleanup(id, dir string) error {
	cg := openCgroup(b.cgroupPath(id))
	cg.kill()
	return b.removeKilled(cg, dir)
}

// removeKilled is cleanup once the processes of cgroup cg are gone. Its
// memory cgroup is parked for a later create where it may be (memcgSpares).
// A cgroup the kernel refuses to remove at once (a process left in it, or
// on cgroup v2 child cgroups the sandbox made) is killed, then removed with
// its children.
func (b *Backend) removeKilled(cg sandboxCgroup, dir string) error {
	var errs []error
	if err := removeDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if p := cg.dir("memory"); p != "" {
		b.memcgs.park(p) // after removeDir: the disk's pages are uncharged
	}
	if cg.removeEmpty() != nil {
		cg.kill()
		if err := cg.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Dial connects to port on the sandbox's loopback. EnvdPort is envd's unix
// socket in the sandbox's socket directory; other ports go through envd's
// CONNECT tunnel (envdapi.Dial), so a closed port fails with an error that
// errors.Is envdapi.ErrPortNotOpen.
func (b *Backend) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	if err := envdconn.CheckPort(id, port); err != nil {
		return nil, err
	}
	s, err := b.get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	s.mu.Lock()
	info, err := s.info()
	gone := s.gone
	s.mu.Unlock()
	switch {
	case gone:
		return nil, fmt.Errorf("dial sandbox %s: %w", id, runtime.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("dial sandbox %s: %w", id, err)
	case info.State == runtime.StatePaused:
		return nil, fmt.Errorf("dial sandbox %s: %w", id, runtime.ErrPaused)
	}
	return envdconn.Dial(ctx, s.dialEnvd, s.meta.Spec.AccessToken, id, port)
}

var _ runtime.LivenessChecker = (*Backend)(nil)

// Alive reports whether sandbox id runs from its handle alone (its init's
// exit and its freeze, as sandbox.state reads them): a claim asks it of a
// warm member without waking the member's envd.
func (b *Backend) Alive(ctx context.Context, id string) error {
	s, err := b.lockLive(ctx, id)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	switch st, err := s.state(); {
	case err != nil:
		return err
	case st == runtime.StatePaused:
		return fmt.Errorf("sandbox %s: %w", id, runtime.ErrPaused)
	}
	return nil
}

var _ runtime.LocalEnvdChannel = (*Backend)(nil)

// LocalEnvdChannel reports that envd's channel is a unix socket on this
// host: a connection to an envd that exited fails at once.
func (b *Backend) LocalEnvdChannel() bool { return true }

// dialEnvd connects to envd's unix socket (see envdconn.DialSocket: root
// inside can plant a symlink where envd binds it itself).
func (s *sandbox) dialEnvd(ctx context.Context) (net.Conn, error) {
	return envdconn.DialSocket(ctx, s.envdSocket(), s.id)
}

// envdHostSocket is the name, in a sandbox's host directory, of the socket
// sandboxd binds and hands to envd (started by sandboxd-spawn). Sockets
// bound in the sandboxes' disks all had one inode number (each disk is a
// tmpfs of its own, envd bound after the same files), and the kernel finds
// a path socket through a table hashed by inode number alone: every connect
// walked every sandbox's socket, 228 µs for the oldest of 5,000 against
// 10 µs (the benchmarks notebook, N16). The host's run directory numbers
// its inodes in one sequence, and the sandbox no longer sees the socket.
const envdHostSocket = "envd.sock"

// envdSocket is the host path of envd's socket: envdHostSocket, or, for
// a sandbox started through libcontainer, the one envd binds in the disk.
func (s *sandbox) envdSocket() string {
	if s.envdOnHost.Load() {
		return filepath.Join(s.dir, envdHostSocket)
	}
	return filepath.Join(s.dir, "disk", "envd", "envd.sock")
}

// Stats reads the sandbox's cgroup counters and its disk's usage.
func (b *Backend) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	s, err := b.lockLive(ctx, id)
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("stats: %w", err)
	}
	defer s.mu.Unlock()
	if s.meta.Paused == pausedDisk {
		// Nothing runs and nothing is charged: only the limits hold.
		return runtime.Stats{
			CPUCount:         s.meta.Spec.CPUCount,
			MemoryLimitBytes: uint64(s.meta.Spec.MemoryMB) << 20,
			DiskLimitBytes:   uint64(s.meta.Spec.DiskSizeMB) << 20,
			PidsLimit:        uint64(b.opts.PidsMax),
		}, nil
	}
	u, err := readUsage(b.cgroupPath(id))
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("stats sandbox %s: %w", id, err)
	}
	out := runtime.Stats{
		CPUTime:          u.cpu,
		CPUCount:         s.meta.Spec.CPUCount,
		MemoryBytes:      u.memory,
		MemoryLimitBytes: uint64(s.meta.Spec.MemoryMB) << 20,
		Pids:             u.pids,
		PidsLimit:        u.pidsMax,
	}
	if used, total, err := dirUsage(filepath.Join(s.dir, "disk")); err == nil {
		out.DiskBytes, out.DiskLimitBytes = used, total
		// The cgroup is also charged for the tmpfs disk (see ociSpec);
		// memory is what the processes use.
		out.MemoryBytes -= min(out.MemoryBytes, used)
	}
	return out, nil
}

// reconcileDead destroys sandboxes in the map whose init died on its own.
func (b *Backend) reconcileDead(ctx context.Context) error {
	b.mu.Lock()
	all := make([]*sandbox, 0, len(b.sbx))
	for _, s := range b.sbx {
		all = append(all, s)
	}
	b.mu.Unlock()
	var dead []string
	for _, s := range all {
		select {
		case <-s.ready:
		default:
			continue
		}
		s.mu.Lock()
		if s.created && !s.gone {
			if _, err := s.info(); errors.Is(err, runtime.ErrNotRunning) {
				dead = append(dead, s.id)
			}
		}
		s.mu.Unlock()
	}
	var errs []error
	for _, id := range dead {
		if err := b.Destroy(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
