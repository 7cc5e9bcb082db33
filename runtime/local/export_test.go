package local

import (
	"errors"
	goruntime "runtime"

	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime"
)

// HostInterface is the name of sandbox id's host veth end, for tests.
func HostInterface(id string) string {
	host, _ := linkNames(id)
	return host
}

// CgroupRoots is cgroupRoots, for tests: where a cgroup path lives on this
// host's layout.
func CgroupRoots() []string { return cgroupRoots() }

// StateFSSource is the source name of the tmpfs for state directories.
const StateFSSource = stateFSSource

// Cgroup2Mount is the host's cgroup2 mount point, its superblock's cgroup2
// flags and its mount options, for tests; ok is false on pure v1.
func Cgroup2Mount() (mountpoint string, flags []string, options string, ok bool) {
	m, err := cgroup2Mount()
	if err != nil || m == nil {
		return "", nil, "", false
	}
	return m.Mountpoint, cgroup2Flags(m), m.Options, true
}

// SetCgroup2Flags sets the cgroup2 superblock's flags, for tests.
func SetCgroup2Flags(flags []string) error {
	mp, _, _, ok := Cgroup2Mount()
	if !ok {
		return nil
	}
	return reconfigureCgroup2(mp, flags)
}

// EgressReady reports whether the backend has set up egress already.
func (b *Backend) EgressReady() bool { return b.egress.Ready() }

// StarterPid is the pid of the backend's sandboxd-init, or 0.
func (b *Backend) StarterPid() int {
	if b.starter == nil {
		return 0
	}
	return b.starter.Pid()
}

// FailContainerLoad makes sandbox id's libcontainer handle a failed load
// (see loadLater), for tests.
func (b *Backend) FailContainerLoad(id string) {
	b.mu.Lock()
	s := b.sbx[id]
	b.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctr, s.ctrRoot, s.ctrErr = nil, "", errors.New("load container: test")
}

// EnvdPath is where sandboxes see envd.
const EnvdPath = envdPath

// EnvdFSSource names the tmpfs that holds the backend's copy of envd.
const EnvdFSSource = envdFSSource

// SetMaxWriterPaths sets the bound of a sandbox's record of writers until
// the end of t.
func SetMaxWriterPaths(t interface{ Cleanup(func()) }, n int) {
	old := maxWriterPaths
	maxWriterPaths = n
	t.Cleanup(func() { maxWriterPaths = old })
}

// CPUShare is what sandbox id's cgroup holds as its share of the CPU:
// cpu.shares on cgroup v1, cpu.weight on v2, for tests.
func (b *Backend) CPUShare(id string) (string, error) {
	m, err := cgroupManager(b.cgroupPath(id))
	if err != nil {
		return "", err
	}
	if cgroups.IsCgroup2UnifiedMode() {
		return cgroups.ReadFile(m.Path(""), "cpu.weight")
	}
	return cgroups.ReadFile(m.Path("cpu"), "cpu.shares")
}

// OCICPUShares is the CPU shares a sandbox of spec starts with, for tests.
func OCICPUShares(spec runtime.Spec) uint64 {
	return *ociSpec(specInput{spec: spec, tpl: &template{}}).Linux.Resources.CPU.Shares
}

// SpawnMountPoints lists the mount points of the mount namespace
// sandboxd-spawn clones sandboxes from (newSpawnMountNS), read from a
// thread that enters it and then ends.
func (b *Backend) SpawnMountPoints() ([]string, error) {
	if b.spawnNS == nil {
		return nil, errors.New("no spawn mount namespace")
	}
	type result struct {
		mps []string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends in the namespace
		var r result
		defer func() { ch <- r }()
		if r.err = unix.Unshare(unix.CLONE_FS); r.err != nil {
			return
		}
		if r.err = unix.Setns(int(b.spawnNS.Fd()), unix.CLONE_NEWNS); r.err != nil {
			return
		}
		ms, err := threadMounts()
		for _, m := range ms {
			r.mps = append(r.mps, m.Mountpoint)
		}
		r.err = err
	}()
	r := <-ch
	return r.mps, r.err
}

// EnvdPid is the host pid of sandbox id's envd (its init), or 0.
func (b *Backend) EnvdPid(id string) int {
	b.mu.Lock()
	s := b.sbx[id]
	b.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.initPid
}
