package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/opencontainers/cgroups"
)

// cpuGroupSuffix names the cpu cgroup of sandboxd itself after its
// sandboxes' parent: /sandboxd.daemon beside /sandboxd, one per run dir as
// the parent is.
const cpuGroupSuffix = ".daemon"

// cpuGroup is where Options.OwnCPUGroup put this process.
type cpuGroup struct {
	// grouped: this process's cpu cgroup is not its hierarchy's root (it
	// moved, or another placed it: systemd, a container runtime).
	grouped bool
	// leave moves it back to the root and removes the group it made; nil
	// when it did not move.
	leave func() error
}

// joinCPUGroup moves this process, when it runs in the root of the cpu
// controller's hierarchy, into the cpu cgroup name (a child of the root),
// weighted as procs processes at nice 0 are. A process somewhere else was
// put there by someone (systemd's unit, a container), and stays.
//
// Why: in the root each of this process's threads weighs as much as the
// sandboxes' whole parent does, so the CPU the kernel gives sandboxd grows
// with the threads it runs. With 2 Go processors on 2 CPUs a thread the
// kernel preempts while it holds one stalls half of sandboxd: while one
// tenant floods, another's claim from the spare pool took 13-21 ms at p50
// (2 alone). More processors end that, but from the root they also took the
// CPU a burst's sandboxes needed to start (issue 24: 200 creates against a
// spare pool of 50, p99 1.22-1.32 s with 8 processors, 0.94-0.96 with 2). In
// a group its share stays that of procs threads whatever it runs.
func joinCPUGroup(name string, procs int) (cpuGroup, error) {
	cur, err := ownCPUCgroup()
	if err != nil {
		return cpuGroup{}, err
	}
	if cur != "/" {
		return cpuGroup{grouped: true}, nil
	}
	if filepath.Dir(name) != "/" {
		return cpuGroup{}, fmt.Errorf("cpu group %s: not a child of the root", name)
	}
	m, err := cgroupManager(name)
	if err != nil {
		return cpuGroup{}, fmt.Errorf("cpu group %s: %w", name, err)
	}
	dir := m.Path("cpu")
	if dir == "" {
		return cpuGroup{}, fmt.Errorf("cpu group %s: no cpu controller", name)
	}
	root := strings.TrimSuffix(dir, name)
	if cgroups.IsCgroup2UnifiedMode() {
		// The sandboxes' parent needs it too; the root may take processes
		// and controllers at once.
		if err := cgroups.WriteFile(root, "cgroup.subtree_control", "+cpu"); err != nil {
			return cpuGroup{}, fmt.Errorf("cpu group %s: %w", name, err)
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return cpuGroup{}, fmt.Errorf("cpu group %s: %w", name, err)
	}
	pid := strconv.Itoa(os.Getpid())
	err = setCPUShares(dir, 1024*uint64(max(procs, 1)))
	if err == nil {
		// cgroup.procs moves every thread (v1 and v2 alike); later threads
		// and children start in the group.
		err = cgroups.WriteFile(dir, "cgroup.procs", pid)
	}
	if err != nil {
		_ = os.Remove(dir)
		return cpuGroup{}, fmt.Errorf("cpu group %s: %w", name, err)
	}
	return cpuGroup{grouped: true, leave: sync.OnceValue(func() error {
		if err := cgroups.WriteFile(root, "cgroup.procs", pid); err != nil {
			return fmt.Errorf("leave cpu group %s: %w", name, err)
		}
		// EBUSY while a child still runs in it; the next start reuses it.
		if err := os.Remove(dir); err != nil {
			return fmt.Errorf("remove cpu group %s: %w", name, err)
		}
		return nil
	})}, nil
}

// ownCPUCgroup is this process's cgroup in the cpu controller's hierarchy
// (the unified one on a cgroup v2 host), relative to its root.
func ownCPUCgroup() (string, error) {
	paths, err := cgroups.ParseCgroupFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("own cgroup: %w", err)
	}
	key := "cpu"
	if cgroups.IsCgroup2UnifiedMode() {
		key = ""
	}
	p, ok := paths[key]
	if !ok {
		return "", errors.New("own cgroup: no cpu hierarchy")
	}
	return p, nil
}
