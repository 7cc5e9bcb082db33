package incus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/loopback"
	"github.com/sandboxd/sandboxd/internal/netnsrun"
	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/egress/policy"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// Destroy removes sandbox id. It returns at once: the forced stop (which
// deletes the ephemeral instance) and the removal of its socket directory
// run in the background, with retries. From the return on, the sandbox is
// gone for every other call; a Create of the same id waits for the instance
// to be deleted. Idempotent.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil // cannot exist
	}
	b.mu.Lock()
	s := b.sbx[id]
	_, deleting := b.deleting[id]
	b.mu.Unlock()
	if s != nil {
		select {
		case <-s.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
		if !s.created {
			return nil // the failed Create undid itself
		}
		s.mu.Lock()
		b.mu.Lock()
		if b.sbx[id] == s {
			delete(b.sbx, id)
			b.startDelete(id, s.name, s.dir, "")
		}
		b.mu.Unlock()
		s.mu.Unlock()
		return nil
	}
	if deleting || b.lostSandbox(id) {
		return nil // a lost one is deleted when its member is back
	}
	// Unknown here: maybe a sandbox of an earlier process.
	in, err := b.c.Instance(ctx, b.instanceName(id))
	if errors.Is(err, runtime.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	if !b.ours(in) || in.Config[keyID] != id {
		return nil
	}
	b.mu.Lock()
	if b.sbx[id] == nil && b.deleting[id] == nil {
		b.startDelete(id, in.Name, b.sockDir(in.Name), "")
	}
	b.mu.Unlock()
	return nil
}

// startDelete deletes instance name of sandbox id in the background, after
// operation waitOp (a create being undone) when set. The caller holds b.mu.
func (b *Backend) startDelete(id, name, dir, waitOp string) {
	if _, ok := b.deleting[id]; ok {
		return
	}
	done := make(chan struct{})
	b.deleting[id] = done
	go b.finishDelete(id, name, dir, waitOp, done)
}

// Retries of a background deletion: about two minutes in all.
const (
	deleteAttempts = 12
	deleteMaxDelay = 15 * time.Second
)

func (b *Backend) finishDelete(id, name, dir, waitOp string, done chan struct{}) {
	defer func() {
		if err := removeSockDir(dir); err != nil {
			b.log.Warn("incus: remove socket dir", "sandbox", id, "err", err)
		}
		b.mu.Lock()
		if b.deleting[id] == done {
			delete(b.deleting, id)
		}
		b.mu.Unlock()
		close(done)
	}()
	if waitOp != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, _ = b.c.Wait(ctx, waitOp)
		cancel()
	}
	delay := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := b.removeInstance(id, name)
		if err == nil {
			b.releaseIPs(name)
			return
		}
		if attempt == deleteAttempts {
			b.log.Error("incus: giving up deleting sandbox instance; Reconcile retries it",
				"sandbox", id, "instance", name, "err", err)
			return
		}
		b.log.Warn("incus: delete sandbox instance; retrying", "sandbox", id, "instance", name,
			"attempt", attempt, "err", err)
		time.Sleep(delay)
		delay = min(delay*2, deleteMaxDelay)
	}
}

// releaseIPs frees the egress address of instance name, once it is gone
// (and its veth, address and route with it).
func (b *Backend) releaseIPs(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ip, n := range b.ips {
		if n == name {
			if b.cluster != nil {
				delete(b.ips, ip) // no host firewall: the members' is static
				continue
			}
			if err := b.egress.ClearPolicy(ip); err != nil {
				b.log.Warn("egress policy of a removed instance", "instance", name, "err", err)
			}
			delete(b.ips, ip)
		}
	}
}

// SetEgressPolicy implements runtime.EgressPolicer.
func (b *Backend) SetEgressPolicy(ctx context.Context, id string, p *policy.Policy) error {
	s, err := b.get(ctx, id)
	if err != nil {
		return err
	}
	if !s.ip.IsValid() || !s.spec.AllowInternet {
		if p.Empty() {
			return nil
		}
		return fmt.Errorf("egress policy of sandbox %s: %w: it has no internet access", id, runtime.ErrInvalidSpec)
	}
	if b.cluster != nil {
		if p.Empty() {
			return nil
		}
		return fmt.Errorf("egress policy of sandbox %s: %w: per-sandbox network rules on an Incus cluster", id, runtime.ErrUnsupported)
	}
	return b.egress.SetPolicy(ctx, id, s.ip, p)
}

// removeInstance stops instance name (force) and waits for it to be gone:
// an ephemeral instance is deleted by its stop hook, others are deleted
// here. An instance that is not sandbox id's is left alone.
func (b *Backend) removeInstance(id, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in, err := b.c.Instance(ctx, name)
	if errors.Is(err, runtime.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if !b.ours(in) || in.Config[keyID] != id {
		return nil
	}
	if in.Status != "Stopped" {
		err := b.c.SetState(ctx, name, StatePut{Action: "stop", Force: true, Timeout: -1})
		if err != nil && !errors.Is(err, runtime.ErrNotFound) && !errors.Is(err, runtime.ErrNotRunning) {
			return err
		}
	}
	// The ephemeral instance disappears about 20 ms after the stop.
	deadline := time.Now().Add(5 * time.Second)
	for {
		in, err := b.c.Instance(ctx, name)
		if errors.Is(err, runtime.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) || !in.Ephemeral {
			if in.Status != "Stopped" {
				return fmt.Errorf("instance %s is %s after a forced stop", name, in.Status)
			}
			err := b.c.DeleteInstance(ctx, name)
			if err == nil || errors.Is(err, runtime.ErrNotFound) {
				return nil
			}
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pausedDisk is keyPaused's value on a sandbox paused to disk.
const pausedDisk = "disk"

// Pause with PauseMemory freezes every process of the sandbox (cgroup
// freezer); memory stays. With PauseDisk the instance is made persistent
// (not ephemeral), marked with keyPaused and stopped: its processes end and
// their memory is released, its root stays on the storage pool (its
// copy-on-write snapshot of the image), and a later sandboxd adopts it as
// paused. Pausing a paused sandbox (either kind) returns nil.
func (b *Backend) Pause(ctx context.Context, id string, kind runtime.PauseKind) error {
	s, err := b.lockLive(ctx, id, "pause")
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.paused {
		return nil
	}
	if kind != runtime.PauseDisk {
		return b.freeze(ctx, s)
	}
	// Marked first: a sandboxd that dies between the two calls finds a
	// running instance (adopted as running) or a stopped, marked one
	// (adopted as paused to disk); never a stopped ephemeral one, which
	// Incus would have deleted with its files.
	persistent := false
	if err := b.c.PatchInstance(ctx, s.name, InstancePatch{
		Ephemeral: &persistent, Config: map[string]string{keyPaused: pausedDisk},
	}); err != nil {
		return fmt.Errorf("pause sandbox %s to disk: %w", id, err)
	}
	stopErr := b.c.SetState(ctx, s.name, StatePut{Action: "stop", Force: true, Timeout: -1})
	if stopErr != nil && !errors.Is(stopErr, runtime.ErrNotRunning) {
		// Still running? Then undo the mark and report; stopped after all
		// (the answer was lost) is a pause that worked.
		in, err := b.c.Instance(context.WithoutCancel(ctx), s.name)
		if err != nil || in.Status != "Stopped" {
			if err := b.unmarkDisk(context.WithoutCancel(ctx), s.name); err != nil {
				b.log.Warn("incus: undo the mark of a failed pause to disk", "sandbox", id, "err", err)
			}
			return fmt.Errorf("pause sandbox %s to disk: %w", id, stopErr)
		}
	}
	s.paused, s.onDisk = true, true
	// The socket directory's tmpfs holds only envd's dead socket; the
	// resume mounts a fresh one.
	if err := removeSockDir(s.dir); err != nil {
		b.log.Warn("incus: remove the socket dir of a sandbox paused to disk", "sandbox", id, "err", err)
	}
	return nil
}

// unmarkDisk makes instance name a running sandbox's again: ephemeral,
// without keyPaused (an empty value unsets a key).
func (b *Backend) unmarkDisk(ctx context.Context, name string) error {
	ephemeral := true
	return b.c.PatchInstance(ctx, name, InstancePatch{Ephemeral: &ephemeral, Config: map[string]string{keyPaused: ""}})
}

// Resume thaws a sandbox paused in memory, or starts one paused to disk
// again (restarted: envd is a new process, to be initialised again).
func (b *Backend) Resume(ctx context.Context, id string) (bool, error) {
	s, err := b.lockLive(ctx, id, "resume")
	if err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	if !s.paused {
		return false, nil
	}
	if s.onDisk {
		return b.resumeFromDisk(ctx, s)
	}
	if err := b.c.SetState(ctx, s.name, StatePut{Action: "unfreeze"}); err != nil && !errors.Is(err, errNotFrozen) {
		return false, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	s.paused = false
	return false, nil
}

// resumeFromDisk starts the stopped instance of s again; the caller holds
// s.mu.
func (b *Backend) resumeFromDisk(ctx context.Context, s *sandbox) (bool, error) {
	wrap := func(err error) error { return fmt.Errorf("resume sandbox %s from disk: %w", s.id, err) }
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.opts.StartTimeout)
		defer cancel()
	}
	if s.dir != "" {
		if err := makeSockDir(s.dir); err != nil {
			return false, wrap(fmt.Errorf("socket dir: %w", err))
		}
	}
	// Any failure from here leaves the instance stopped and marked: still
	// paused to disk, and a later Resume tries again.
	r := revert.New()
	defer r.Fail()
	r.Add(func() { _ = removeSockDir(s.dir) })
	r.Add(func() { // a start that failed half way may have started it
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if serr := b.c.SetState(sctx, s.name, StatePut{Action: "stop", Force: true, Timeout: -1}); serr != nil &&
			!errors.Is(serr, runtime.ErrNotRunning) {
			b.log.Warn("incus: stop a sandbox whose resume from disk failed", "sandbox", s.id, "err", serr)
		}
	})
	if err := b.c.SetState(ctx, s.name, StatePut{Action: "start"}); err != nil {
		return false, wrap(fmt.Errorf("start: %w", err))
	}
	if _, err := b.settle(ctx, s, nil); err != nil {
		return false, wrap(err)
	}
	// Ephemeral again only once it runs (a stopped ephemeral instance is
	// deleted): from here on it is an ordinary running sandbox.
	if err := b.unmarkDisk(ctx, s.name); err != nil {
		return false, wrap(fmt.Errorf("unmark: %w", err))
	}
	r.Success()
	s.paused, s.onDisk = false, false
	return true, nil
}

// freeze pauses s in memory; the caller holds s.mu.
func (b *Backend) freeze(ctx context.Context, s *sandbox) error {
	id := s.id
	if err := b.c.SetState(ctx, s.name, StatePut{Action: "freeze"}); err != nil && !errors.Is(err, errAlreadyFrozen) {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	s.paused = true
	return nil
}

// lockLive returns live sandbox id with its lock held, for lifecycle call
// op ("pause", …); the caller unlocks.
func (b *Backend) lockLive(ctx context.Context, id, op string) (*sandbox, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	s.mu.Lock()
	if b.gone(s) {
		s.mu.Unlock()
		return nil, fmt.Errorf("%s sandbox %s: %w", op, id, runtime.ErrNotFound)
	}
	return s, nil
}

// gone reports whether s was destroyed (no longer the map's entry).
func (b *Backend) gone(s *sandbox) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sbx[s.id] != s
}

// Dial connects to port on the sandbox's loopback: EnvdPort is envd's unix
// socket in the shared socket directory; other ports go through envd's
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
	paused, token := s.paused, s.spec.AccessToken
	s.mu.Unlock()
	if paused {
		return nil, fmt.Errorf("dial sandbox %s: %w", id, runtime.ErrPaused)
	}
	return envdconn.Dial(ctx, b.envdDialer(s), token, id, port)
}

// Stats reads the instance's state: CPU time, memory and processes from
// its cgroups, and the root volume's own usage (what the sandbox wrote, not
// the image it shares) against DiskSizeMB.
func (b *Backend) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("stats: %w", err)
	}
	s.mu.Lock()
	sp := s.spec
	s.mu.Unlock()
	if !b.opts.NoDiskSync {
		b.syncRoot(ctx, s.name)
	}
	st, err := b.c.InstanceState(ctx, s.name)
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("stats sandbox %s: %w", id, err)
	}
	out := runtime.Stats{
		CPUTime:          time.Duration(st.CPU.Usage),
		CPUCount:         sp.CPUCount,
		MemoryBytes:      uint64(max(st.Memory.Usage, 0)),
		MemoryLimitBytes: uint64(sp.MemoryMB) << 20,
		DiskLimitBytes:   uint64(sp.DiskSizeMB) << 20,
		Pids:             uint64(max(st.Processes, 0)),
		PidsLimit:        uint64(b.opts.PidsMax),
	}
	if st.Memory.Total > 0 {
		out.MemoryLimitBytes = uint64(st.Memory.Total)
	}
	if d, ok := st.Disk["root"]; ok {
		out.DiskBytes = uint64(max(d.Usage, 0))
	}
	return out, nil
}

// syncRoot commits the filesystem holding instance name's root, so that
// btrfs quota groups (which Incus reports as usage) count recent writes. In
// cluster mode the filesystem is the member's, synced from inside the
// sandbox (`sync -f /`, an Incus exec: tens of milliseconds); a failure
// leaves the usage as of btrfs' last commit (30 s at most by default).
func (b *Backend) syncRoot(ctx context.Context, name string) {
	if b.cluster != nil {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := b.c.Exec(sctx, name, []string{"sync", "-f", "/"}); err != nil {
			b.log.Debug("incus: sync of a sandbox's root before its stats", "instance", name, "err", err)
		}
		return
	}
	fd, err := unix.Open(filepath.Join(b.opts.IncusDir, "storage-pools", b.opts.Pool, "containers", name),
		unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	_ = unix.Syncfs(fd)
}

// Reconcile finishes what a crash interrupted: instances with a
// user.sandboxd.id that are not running or frozen (a Destroy that did not
// complete, a failed start) are deleted, socket directories without a
// live sandbox are removed, and so are the half-made layers and the
// snapshots of commits cut short (collectLayerLeftovers). It
// first waits for what Incus still does for an earlier process (see
// recover.go), and waits for the deletions it starts, as long as ctx
// allows.
func (b *Backend) Reconcile(ctx context.Context) error {
	b.awaitInstanceOps(ctx)
	all, err := b.c.Instances(ctx, keyID)
	if err != nil {
		return err
	}
	var waits []chan struct{}
	for _, in := range all {
		id := in.Config[keyID]
		if s := b.adopt(in); s != nil {
			if in.Status != "Stopped" && in.Config[keyPaused] == pausedDisk {
				// A crash between marking and stopping (pause) or between
				// starting and unmarking (resume) left a live instance
				// persistent and marked: were it to stop on its own, it would
				// be adopted as paused and never deleted by Incus.
				if err := b.unmarkDisk(ctx, in.Name); err != nil {
					b.log.Warn("incus: unmark a running sandbox marked as paused to disk", "sandbox", id, "err", err)
				}
			}
			continue
		}
		if b.isLostInstance(in) || !b.ours(in) {
			continue // a lost one is deleted when its member is back
		}
		b.mu.Lock()
		if b.sbx[id] == nil {
			b.startDelete(id, in.Name, b.sockDir(in.Name), "")
			if ch := b.deleting[id]; ch != nil {
				waits = append(waits, ch)
			}
		}
		b.mu.Unlock()
	}
	// Socket directories are named after instances.
	busy := map[string]bool{}
	b.mu.Lock()
	for _, s := range b.sbx {
		busy[s.name] = true
	}
	b.mu.Unlock()
	for _, in := range all {
		busy[in.Name] = true // live, or being deleted (which removes it)
	}
	var ents []os.DirEntry
	if b.cluster == nil {
		if ents, err = os.ReadDir(filepath.Join(b.opts.Root, "sandboxes")); err != nil {
			return err
		}
	}
	var errs []error
	if err := b.migrateLayerImages(ctx); err != nil {
		errs = append(errs, err)
	}
	// Commit snapshots of an earlier process are those of a Commit cut
	// short.
	stale, err := b.staleCommits(ctx, all)
	if err != nil {
		errs = append(errs, err)
	}
	if err := b.removeStaleCommits(ctx, stale); err != nil {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if busy[e.Name()] {
			continue
		}
		if err := removeSockDir(filepath.Join(b.opts.Root, "sandboxes", e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

// loopbackUp sets lo up in the network namespace of process pid (the
// container's init). Inside, envd cannot: the container has no
// CAP_NET_ADMIN. The thread that enters the namespace is returned to the
// host's, or discarded if that fails.
func loopbackUp(pid int) error {
	if pid <= 0 {
		return errors.New("instance has no init process")
	}
	return netnsrun.Run(pid, loopback.Up)
}

// WaitDeletes waits until the background deletions started so far are done,
// or ctx ends.
func (b *Backend) WaitDeletes(ctx context.Context) error {
	b.mu.Lock()
	var waits []chan struct{}
	for _, ch := range b.deleting {
		waits = append(waits, ch)
	}
	b.mu.Unlock()
	return waitClosed(ctx, waits)
}

// waitClosed waits until every channel of waits is closed, or ctx ends.
func waitClosed(ctx context.Context, waits []chan struct{}) error {
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Close stops the background work (Reconcile's clean-up, which the next
// start redoes; a cluster's member refresh and replicator, which gives up
// a copy under way and deletes its half-made instance), then waits, up to
// closeDeletesWait, for the background deletions, and stops the egress
// name filter; instances and their rules stay, for the next sandboxd to
// adopt. The replicator stops first: were the deletions waited for before,
// it would go on starting copies (30 s each on the test cluster) that the
// stop then has to wait out.
func (b *Backend) Close() error {
	b.close()
	b.background.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), closeDeletesWait)
	defer cancel()
	if err := b.WaitDeletes(ctx); err != nil {
		b.log.Warn("incus: deletions still under way at close; Reconcile finishes them", "err", err)
	}
	return b.egress.Close()
}

// closeDeletesWait bounds Close's wait for the background deletions.
const closeDeletesWait = 30 * time.Second
