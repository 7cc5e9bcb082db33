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
	"github.com/opencontainers/cgroups/fscommon"
	"golang.org/x/sys/unix"
)

// memcgSpares keeps the memory cgroups of destroyed sandboxes for the next
// creates, on a host whose memory controller is on cgroup v1. A memory
// cgroup is the dearest directory a create makes: making and removing one
// costs about 2 ms of CPU (benchmarks notebook, N17), most of it after the
// rmdir, in the kernel's workers that take it offline (its pages, list
// LRUs and shrinker counts moved to the parent) and free it. Renaming one
// within its parent, which cgroup v1 allows (cgroup v2 does not rename),
// costs tens of microseconds. A sandbox's other cgroups are not parked: a
// rename costs about what their mkdir or rmdir does, and parking all five
// measured ≈ 0.1 ms a create (N19) for counters to reset and a frozen
// freezer to refuse.
//
// What a parked cgroup carries over, and why that is safe to hand to
// another tenant's sandbox:
//   - No process: park refuses a cgroup with one left (a rename, unlike an
//     rmdir, would not), and a sandbox on cgroup v1 gets no delegated
//     subtree, so there is no child cgroup either.
//   - Its limits: the next start writes its own (libcontainer's Set), and
//     every sandbox's spec sets the same files (limit and memory+swap).
//   - Pages still charged to it, such as the page cache of the template's
//     files the sandbox read first: they count against the next sandbox's
//     limit and show in its usage. They are reclaimable, and park refuses a
//     cgroup holding more than memcgSpareMaxCharge, so the disk's tmpfs
//     (freed before, as cleanup unmounts before it removes cgroups) or
//     anything else unexpected is never passed on.
//   - Its high-water mark and failure count: take resets them.
//   - Its cumulative event counters (memory.stat's page faults, the OOM
//     kill count): sandboxd reads none of them, and a sandbox does not see
//     its cgroup on v1 (no cgroup mount inside; /sys is read-only sysfs).
//
// A parked cgroup is named memcgSpareName plus a number, which no sandbox
// id can be (runtime.ValidID), so Reconcile's sweep of stray sandboxes
// never takes one; the first use adopts those an earlier process left
// (after a crash), and Close removes them.
type memcgSpares struct {
	parent string // CgroupParent's directory in the memory hierarchy; "": off
	max    int    // parked at most

	once  sync.Once // adopt
	mu    sync.Mutex
	names []string // parked, in parent
	seq   int      // the next name's number
}

const (
	memcgSpareName = ".memcg-spare-"
	// memcgSparesMax bounds the parked cgroups (each ≈ 0.8 MiB of kernel
	// memory on the test host, more with more filesystems mounted: its
	// per-superblock lists): enough for a steady stream of destroys and
	// creates, and most of a burst's.
	memcgSparesMax = 64
	// memcgSpareMaxCharge is the most a parked cgroup may have charged.
	memcgSpareMaxCharge = 8 << 20
)

// newMemcgSpares returns the spares of the sandboxes under the cgroup
// parent, off (every method a no-op) unless the memory controller is on
// cgroup v1 and sandboxes get a cgroup below a parent of their own.
func newMemcgSpares(parent string) *memcgSpares {
	if parent == "/" || cgroups.IsCgroup2UnifiedMode() {
		return &memcgSpares{}
	}
	dirs, err := cgroupDirs(parent)
	if err != nil || dirs["memory"] == "" {
		return &memcgSpares{}
	}
	return &memcgSpares{parent: dirs["memory"], max: memcgSparesMax}
}

// adopt takes over the cgroups an earlier process parked, as many as fit,
// and removes the rest (and any it may not take).
func (m *memcgSpares) adopt() {
	ents, err := os.ReadDir(m.parent)
	if err != nil {
		return // no parent yet: nothing parked
	}
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), memcgSpareName)
		if !ok || !e.IsDir() {
			continue
		}
		dir := filepath.Join(m.parent, e.Name())
		if seq, err := strconv.Atoi(n); err == nil && seq >= m.seq {
			m.seq = seq + 1
		}
		if len(m.names) < m.max && parkable(dir) == nil {
			m.names = append(m.names, e.Name())
			continue
		}
		_ = unix.Rmdir(dir)
	}
}

// holds reports whether dir is a child of the parent whose cgroups m
// parks (never when off), having adopted an earlier process's first.
func (m *memcgSpares) holds(dir string) bool {
	if m == nil || m.parent == "" || filepath.Dir(dir) != m.parent {
		return false
	}
	m.once.Do(m.adopt)
	return true
}

// take renames a parked cgroup to dir, the memory cgroup of a sandbox about
// to start (a child of parent), and resets its high-water marks. It
// reports whether it did; if not, the start makes dir as before.
func (m *memcgSpares) take(dir string) bool {
	if !m.holds(dir) {
		return false
	}
	for {
		m.mu.Lock()
		n := len(m.names)
		if n == 0 {
			m.mu.Unlock()
			return false
		}
		name := m.names[n-1]
		m.names = m.names[:n-1]
		m.mu.Unlock()
		if err := os.Rename(filepath.Join(m.parent, name), dir); err != nil {
			if errors.Is(err, os.ErrExist) { // dir is there already: use it
				m.mu.Lock()
				m.names = append(m.names, name)
				m.mu.Unlock()
				return false
			}
			continue // gone (someone removed it): the next
		}
		for _, f := range []string{"memory.max_usage_in_bytes", "memory.failcnt", "memory.memsw.max_usage_in_bytes", "memory.memsw.failcnt"} {
			_ = cgroups.WriteFile(dir, f, "0") // memsw's are absent without swap accounting
		}
		return true
	}
}

// park keeps dir, a destroyed sandbox's memory cgroup, for a later take,
// if there is room and parkable allows. It reports whether it did; if not,
// the caller removes dir as before.
func (m *memcgSpares) park(dir string) bool {
	if !m.holds(dir) {
		return false
	}
	m.mu.Lock()
	if len(m.names) >= m.max {
		m.mu.Unlock()
		return false
	}
	name := memcgSpareName + strconv.Itoa(m.seq)
	m.seq++
	m.mu.Unlock()
	if parkable(dir) != nil || os.Rename(dir, filepath.Join(m.parent, name)) != nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.names) >= m.max { // filled while this one renamed
		_ = unix.Rmdir(filepath.Join(m.parent, name))
		return true // removed all the same
	}
	m.names = append(m.names, name)
	return true
}

// parkable says why the memory cgroup at dir may not be parked, if it may
// not: a process left in it, or more than memcgSpareMaxCharge charged.
func parkable(dir string) error {
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return err
	}
	if len(procs) != 0 {
		return errors.New("processes left")
	}
	charged, err := fscommon.GetCgroupParamUint(dir, "memory.usage_in_bytes")
	if err != nil {
		return err
	}
	if charged > memcgSpareMaxCharge {
		return fmt.Errorf("%d bytes charged", charged)
	}
	return nil
}

// close removes the parked cgroups.
func (m *memcgSpares) close() {
	if m == nil || m.parent == "" {
		return
	}
	m.once.Do(m.adopt)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, name := range m.names {
		_ = unix.Rmdir(filepath.Join(m.parent, name))
	}
	m.names = nil
}
