package local

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs2"
	"github.com/opencontainers/cgroups/fscommon"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/cgstat"
)

// cgroupManager returns a manager for the cgroup at path (relative to each
// hierarchy's root), computing the same per-controller paths libcontainer
// does, without needing libcontainer's state.
func cgroupManager(path string) (cgroups.Manager, error) {
	return cgroupManagerFor(&cgroups.Cgroup{Path: path, Resources: &cgroups.Resources{}})
}

// cgroupManagerFor is cgroupManager for a config with resources (cg.Path
// absolute). Its per-controller directories are its parent's, computed
// once per parent, with its name added: computing them reads
// /proc/self/mountinfo, which holds a few lines per sandbox on the host,
// so that it took 0.2 ms a create on an idle host and grew with every
// sandbox, twice per sandbox (its start and its destroy).
func cgroupManagerFor(cg *cgroups.Cgroup) (cgroups.Manager, error) {
	paths, err := cgroupDirs(cg.Path)
	if err != nil {
		return nil, err
	}
	return manager.NewWithPaths(cg, paths)
}

// joinedControllers are the cgroup v1 controllers a sandbox that
// sandboxd-spawn starts joins: those sandboxd sets limits in or reads
// (memory, pids, cpu and cpuacct, devices), and freezer, which pauses and
// kills it. Each other hierarchy (cpuset, blkio, name=systemd, and where
// mounted net_cls, net_prio, perf_event, hugetlb, rdma, misc) cost every
// create a directory made, joined and removed, with nothing set in it, and
// cpuset a copy of its parent's CPUs and memory nodes besides. On cgroup v2
// the one directory ("") is all. Removal and the search for stray cgroups
// still go through every hierarchy (cgroupDirs): a sandbox that
// libcontainer started, or a build before this one, joined them all.
var joinedControllers = map[string]bool{
	"": true, "memory": true, "pids": true, "cpu": true, "cpuacct": true, "devices": true, "freezer": true,
}

// joinedCgroupDirs is cgroupDirs for the controllers a sandbox joins.
func joinedCgroupDirs(path string) (map[string]string, error) {
	dirs, err := cgroupDirs(path)
	if err != nil {
		return nil, err
	}
	maps.DeleteFunc(dirs, func(controller, _ string) bool { return !joinedControllers[controller] })
	return dirs, nil
}

// cgroupDirs maps the cgroup at path (absolute, relative to each
// hierarchy's root) to its directory in each controller's hierarchy ("" on
// cgroup v2), from its parent's, computed once.
func cgroupDirs(path string) (map[string]string, error) {
	parent := filepath.Dir(path)
	pp, ok := parentPaths.Load(parent)
	if !ok {
		m, err := manager.New(&cgroups.Cgroup{Path: parent, Resources: &cgroups.Resources{}})
		if err != nil {
			return nil, err
		}
		pp, _ = parentPaths.LoadOrStore(parent, m.GetPaths())
	}
	paths := map[string]string{}
	for k, p := range pp.(map[string]string) {
		paths[k] = filepath.Join(p, filepath.Base(path))
	}
	return paths, nil
}

// cgroupUsage is what Stats reports of a sandbox's cgroup.
type cgroupUsage struct {
	cpu     time.Duration
	memory  uint64 // bytes charged, the tmpfs disk included
	pids    uint64
	pidsMax uint64 // 0: no limit
}

// readUsage reads the CPU time, memory, tasks and pids limit of the cgroup
// at path: four small files. libcontainer's Stats reads every controller's
// statistics (per-CPU usage, NUMA, blkio, hugetlb and more), and the
// metrics pass asks it of every running sandbox each 5 s: at 3,600 idle
// sandboxes the pass took 5-10 s and ran back to back (benchmarks
// notebook, N16).
func readUsage(path string) (cgroupUsage, error) {
	dirs, err := cgroupDirs(path)
	if err != nil {
		return cgroupUsage{}, fmt.Errorf("cgroup %s: %w", path, err)
	}
	var u cgroupUsage
	read := func(controller, file string) uint64 {
		if err != nil {
			return 0
		}
		var v uint64
		v, err = fscommon.GetCgroupParamUint(dirs[controller], file)
		return v
	}
	if cgroups.IsCgroup2UnifiedMode() {
		var stat string
		if stat, err = cgroups.ReadFile(dirs[""], "cpu.stat"); err == nil {
			usec, ok := cgstat.Field(stat, "usage_usec")
			if !ok {
				err = errors.New("cpu.stat has no usage_usec")
			}
			u.cpu = time.Duration(usec) * time.Microsecond
		}
		u.memory = read("", "memory.current")
		u.pids = read("", "pids.current")
		u.pidsMax = read("", "pids.max")
	} else {
		u.cpu = time.Duration(read("cpuacct", "cpuacct.usage"))
		u.memory = read("memory", "memory.usage_in_bytes")
		u.pids = read("pids", "pids.current")
		u.pidsMax = read("pids", "pids.max")
	}
	if err != nil {
		return cgroupUsage{}, fmt.Errorf("cgroup %s: %w", path, err)
	}
	if u.pidsMax == math.MaxUint64 { // "max"
		u.pidsMax = 0
	}
	return u, nil
}

// parentPaths maps a cgroup path to its directories, by controller: they do
// not change while the hierarchies stay mounted where they are.
var parentPaths sync.Map

// sandboxCgroup is one sandbox's cgroup, with its per-controller paths
// computed once: building a manager costs ≈ 0.3 ms of CPU, and a destroy
// both kills and removes.
type sandboxCgroup struct {
	path string
	m    cgroups.Manager
	err  error // of computing the paths
}

func openCgroup(path string) sandboxCgroup {
	m, err := cgroupManager(path)
	return sandboxCgroup{path: path, m: m, err: err}
}

// dir is the cgroup's directory in controller's v1 hierarchy, "" if none.
func (c sandboxCgroup) dir(controller string) string {
	if c.err != nil {
		return ""
	}
	return c.m.GetPaths()[controller]
}

// kill SIGKILLs every process in the cgroup, thawing it first (a frozen
// task takes no signal), and waits briefly for them to go. It is for
// cleanup after a crash, when init may be gone but not its children (they
// die with init's pid namespace; this is belt and braces).
//
// On cgroup v2 the sandbox may have made child cgroups of its own
// (delegation): cgroup.kill signals the whole subtree at once, frozen
// children included, and GetAllPids walks every child for what is left.
func (c sandboxCgroup) kill() {
	m := c.m
	if c.err != nil || !m.Exists() {
		return
	}
	if cgroups.IsCgroup2UnifiedMode() {
		_ = cgroups.WriteFile(m.Path(""), "cgroup.kill", "1") // Linux ≥ 5.14
	}
	_ = m.Freeze(cgroups.Thawed)
	for i := 0; i < 100; i++ {
		pids, err := m.GetAllPids()
		if err != nil || len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
}

// remove removes the cgroup from every hierarchy, with the child cgroups a
// sandbox made in its delegated subtree, bottom-up (the manager's Destroy
// is cgroups.RemovePath, which recurses; TestCgroupDelegation checks it).
// Their processes must be gone (kill). A missing cgroup is no error.
func (c sandboxCgroup) remove() error {
	if c.err != nil {
		return fmt.Errorf("cgroup %s: %w", c.path, c.err)
	}
	if err := c.m.Destroy(); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", c.path, err)
	}
	return nil
}

// removeEmpty removes the cgroup's directories where they are empty, one
// rmdir each, without the retries and the walk of remove: it fails (and
// leaves the rest) at the first the kernel refuses, with a process or a
// child cgroup in it. The devices hierarchy goes last: kill finds the
// processes left through it. A missing directory is no error.
func (c sandboxCgroup) removeEmpty() error {
	if c.err != nil {
		return fmt.Errorf("cgroup %s: %w", c.path, c.err)
	}
	rmdir := func(p string) error {
		if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove cgroup %s: %w", p, err)
		}
		return nil
	}
	paths := c.m.GetPaths()
	for controller, p := range paths {
		if controller != "devices" {
			if err := rmdir(p); err != nil {
				return err
			}
		}
	}
	if p, ok := paths["devices"]; ok {
		return rmdir(p)
	}
	return nil
}

// setCPUShares sets the share of the CPU of cgroup dir (its directory in
// the cpu controller's hierarchy) against its siblings: cpu.shares on
// cgroup v1, on v2 the cpu.weight libcontainer derives from shares (so it
// matches what a start with those shares wrote).
func setCPUShares(dir string, shares uint64) error {
	var err error
	if cgroups.IsCgroup2UnifiedMode() {
		err = cgroups.WriteFile(dir, "cpu.weight", strconv.FormatUint(cgroups.ConvertCPUSharesToCgroupV2Value(shares), 10))
	} else {
		err = cgroups.WriteFile(dir, "cpu.shares", strconv.FormatUint(shares, 10))
	}
	if err != nil {
		return fmt.Errorf("cgroup %s: cpu share: %w", dir, err)
	}
	return nil
}

// Delegation limits: how many cgroups a sandbox may create below its own,
// and how deep. envd needs one for itself and one per running command (a
// sandbox's pids.max bounds those anyway); nested containers inside need a
// few levels. Without them root inside could make cgroups, which cost
// kernel memory, by the thousand.
const (
	delegateMaxDescendants = 256
	delegateMaxDepth       = 4
)

// cgroupDelegable reports whether this host can give sandboxes a delegated
// cgroup2 subtree: cgroup v2 alone (unified). On v1 and hybrid hosts the
// controllers live in v1 hierarchies, which cannot be delegated safely, and
// sandboxes get no cgroup mount, as before.
func cgroupDelegable() bool { return cgroups.IsCgroup2UnifiedMode() }

// delegateCgroup makes the cgroup at path (relative to the cgroup2 mount)
// ready for libcontainer to put a sandbox in, as a subtree the sandbox's
// root (host uid and gid owner) may organise, the way systemd's
// Delegate=yes does: it owns the directory (to make child cgroups),
// cgroup.procs and cgroup.threads (to move its processes between them) and
// cgroup.subtree_control (to enable controllers for them). Every other file,
// the limits libcontainer writes next (pids.max, memory.max, cpu.max, ...)
// and the caps on child cgroups written here, stays the host root's, so the
// sandbox cannot raise them; what it sets on its children can only lower
// them further. Child cgroups left by an earlier run of the sandbox (a
// restart) are removed first: their processes died with that run's pid
// namespace, and the new envd makes its own.
//
// libcontainer takes the existing directory as it is (fs2.CreateCgroupPath
// accepts it) and still writes the limits and enables the parents'
// controllers.
func delegateCgroup(path string, owner int) error {
	dir := filepath.Join(fs2.UnifiedMountpoint, path)
	if err := fs2.CreateCgroupPath(dir, &cgroups.Cgroup{Resources: &cgroups.Resources{}}); err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := cgroups.RemovePath(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("cgroup %s: stale child: %w", path, err)
			}
		}
	}
	if err := cgroups.WriteFile(dir, "cgroup.max.descendants", strconv.Itoa(delegateMaxDescendants)); err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	if err := cgroups.WriteFile(dir, "cgroup.max.depth", strconv.Itoa(delegateMaxDepth)); err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	for _, name := range []string{"", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"} {
		if err := os.Lchown(filepath.Join(dir, name), owner, owner); err != nil {
			return fmt.Errorf("cgroup %s: delegate: %w", path, err)
		}
	}
	return nil
}

// strayCgroups lists the child cgroups of parent in any hierarchy.
func strayCgroups(parent string) []string {
	m, err := cgroupManager(parent)
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, p := range m.GetPaths() {
		ents, err := os.ReadDir(p)
		if err != nil {
			continue // no such hierarchy, or no parent yet
		}
		for _, e := range ents {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// removeEmptyCgroup removes the cgroup at path from every hierarchy where
// it has no child cgroup and no process left (the kernel refuses the
// others, which is the point: it never takes a live sandbox's parent).
func removeEmptyCgroup(path string) {
	m, err := cgroupManager(path)
	if err != nil {
		return
	}
	for _, p := range m.GetPaths() {
		_ = os.Remove(p) // rmdir: EBUSY while it has children or tasks
	}
}

// cgroupRoots lists the cgroup hierarchies' mount points: /sys/fs/cgroup
// itself on a unified (v2 only) host; on a v1 or hybrid host the
// directories in it (one per v1 hierarchy, plus unified/ on hybrid hosts),
// not the symlinks (cpu -> cpu,cpuacct) that name one twice. A glob of
// /sys/fs/cgroup/* would list the root cgroup's files on a v2 host.
func cgroupRoots() []string {
	const mnt = "/sys/fs/cgroup"
	if cgroups.IsCgroup2UnifiedMode() {
		return []string{mnt}
	}
	ents, err := os.ReadDir(mnt)
	if err != nil {
		return []string{mnt}
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, filepath.Join(mnt, e.Name()))
		}
	}
	return out
}

// favorDynMods turns on the cgroup2 mount option favordynmods (Linux ≥ 6.0)
// unless it is on, and says what it found or did.
//
// Why: every sandbox start moves its init into the sandbox's cgroup (a write
// to cgroup.procs in each hierarchy). A move takes the kernel's global
// cgroup_threadgroup_rwsem for writing, a per-CPU rwsem whose writer waits
// for an RCU grace period unless another writer held it within the last
// grace period or two. So a start that followed no other by more than about
// 10 ms waited one, on a box otherwise idle: libcontainer starting
// /bin/true took 9 ms when the starts came within 10 ms of each other and
// 21-25 ms with 30 ms between them, and a sandbox create 15 ms right after
// another container start but 21 ms in the benchmark's loop and 25-28 ms
// after a 30 ms pause. favordynmods keeps the rwsem in its writer mode (from
// 6.18, it switches moves to a rwsem per thread group instead), so moves no
// longer wait. Forks and exits pay a little more, the trade the kernel's
// documentation describes for hosts that move tasks between cgroups often,
// as this one does at every create.
//
// It is a flag of the cgroup2 superblock, reached here with fspick, so the
// mount's own flags (nosuid, nodev, noexec) stay as they are; a reconfigure
// resets the superblock's other cgroup2 flags (nsdelegate,
// memory_recursiveprot, ...), so they are given again. Pure v1 hosts have no
// cgroup2 mount and cgroup v1 has no such option: nothing is done there.
// From 6.18 the kernel refuses to turn it off again; sandboxd leaves it on.
func favorDynMods() (string, error) {
	m, err := cgroup2Mount()
	if err != nil || m == nil {
		return "no cgroup2 mount (pure cgroup v1)", err
	}
	flags := cgroup2Flags(m)
	if slices.Contains(flags, "favordynmods") {
		return "already on at " + m.Mountpoint, nil
	}
	if err := reconfigureCgroup2(m.Mountpoint, append(flags, "favordynmods")); err != nil {
		return "", err
	}
	return "turned on at " + m.Mountpoint, nil
}

// cgroup2Mount finds the host's cgroup2 mount: /sys/fs/cgroup on v2,
// /sys/fs/cgroup/unified on hybrid hosts; nil on pure v1.
func cgroup2Mount() (*mountinfo.Info, error) {
	mounts, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return i.FSType != "cgroup2" || i.Root != "/", false
	})
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		if m.Mountpoint == "/sys/fs/cgroup" || m.Mountpoint == "/sys/fs/cgroup/unified" {
			return m, nil
		}
	}
	return nil, nil
}

// cgroup2Flags are the cgroup2 options of m's superblock (nsdelegate,
// favordynmods, memory_recursiveprot, ...), without rw/ro.
func cgroup2Flags(m *mountinfo.Info) []string {
	var flags []string
	for _, o := range strings.Split(m.VFSOptions, ",") {
		if o != "" && o != "rw" && o != "ro" {
			flags = append(flags, o)
		}
	}
	return flags
}

// reconfigureCgroup2 sets the cgroup2 superblock mounted at mountpoint to
// flags, which must name every flag it is to keep: a reconfigure clears
// the ones it is not given.
func reconfigureCgroup2(mountpoint string, flags []string) error {
	fd, err := unix.Fspick(unix.AT_FDCWD, mountpoint, unix.FSPICK_CLOEXEC|unix.FSPICK_NO_AUTOMOUNT)
	if err != nil {
		return fmt.Errorf("fspick %s: %w", mountpoint, err)
	}
	defer unix.Close(fd)
	for _, f := range flags {
		if err := unix.FsconfigSetFlag(fd, f); err != nil {
			return fmt.Errorf("%s: cgroup2 option %s: %w", mountpoint, f, err)
		}
	}
	if err := unix.FsconfigReconfigure(fd); err != nil {
		return fmt.Errorf("%s: reconfigure: %w", mountpoint, err)
	}
	return nil
}

// freezeWaits are the pauses between tries of a cgroup v1 freeze.
var freezeWaits = []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

// freeze freezes a running sandbox's processes (ctr.Pause). cgroup v1's
// freezer stays in FREEZING while a task sleeps uninterruptibly, as in disk
// I/O on a loaded host: libcontainer tries for some hundred milliseconds,
// thaws and gives up with "unable to freeze" (a template build's commit
// failed so in CI while VMs filled the disk queue). Tried again a moment
// later it succeeds, so on v1 a failure is tried again, spaced out by
// freezeWaits, while ctx lasts and the container still runs. v2's freezer
// waits for the freeze by itself (up to 10 s) and is not retried.
func freeze(ctx context.Context, ctr *libcontainer.Container) error {
	if cgroups.IsCgroup2UnifiedMode() {
		return ctr.Pause()
	}
	return retryFreeze(ctx, ctr.Pause, func() bool {
		st, err := ctr.Status()
		return err == nil && st == libcontainer.Running
	}, freezeWaits)
}

// retryFreeze calls pause until it succeeds, stillRunning says there is
// nothing to freeze, waits run out or ctx ends; it returns the last error.
func retryFreeze(ctx context.Context, pause func() error, stillRunning func() bool, waits []time.Duration) error {
	err := pause()
	for _, w := range waits {
		if err == nil || errors.Is(err, libcontainer.ErrNotRunning) || !stillRunning() {
			return err
		}
		t := time.NewTimer(w)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, context.Cause(ctx))
		case <-t.C:
		}
		err = pause()
	}
	return err
}
