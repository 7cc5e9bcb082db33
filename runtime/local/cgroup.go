package local

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"golang.org/x/sys/unix"
)

// cgroupManager returns a manager for the cgroup at path (relative to each
// hierarchy's root), computing the same per-controller paths libcontainer
// does, without needing libcontainer's state.
func cgroupManager(path string) (cgroups.Manager, error) {
	return manager.New(&cgroups.Cgroup{Path: path, Resources: &cgroups.Resources{}})
}

// killCgroup SIGKILLs every process in the cgroup at path, thawing it first
// (a frozen task takes no signal), and waits briefly for them to go. It is
// for cleanup after a crash, when init may be gone but not its children
// (they die with init's pid namespace; this is belt and braces).
func killCgroup(path string) {
	m, err := cgroupManager(path)
	if err != nil || !m.Exists() {
		return
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

// removeCgroup removes the cgroup at path from every hierarchy. A missing
// cgroup is no error.
func removeCgroup(path string) error {
	m, err := cgroupManager(path)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	if err := m.Destroy(); err != nil {
		return fmt.Errorf("remove cgroup %s: %w", path, err)
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
