package local

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// The mount namespace sandboxd-spawn clones each sandbox's from.
//
// A sandbox's init makes its mount namespace by copying its parent's, every
// mount of it, then leaves the copy at its pivot_root. In sandboxd's own
// namespace every live sandbox has two mounts (its disk and its root), so
// that each create copied, and each init detached, 2 × N mounts: with 200
// idle sandboxes beside it, ≈ 1 ms of CPU a create (copy_mnt_ns and the old
// root's unmount), growing with every sandbox. The spawner clones from this
// namespace instead, made once per backend: a private copy of sandboxd's
// that holds only what the spawner and the init reach by path — the root,
// the mounts on the way to the sandboxes' directory, /proc, /sys and the
// cgroup hierarchies — and none of the sandboxes' mounts (the spawner hands
// the init its root as a detached copy, open_tree, as it does bind sources).
//
// Nothing else is kept, so that the namespace pins no mount that its owner
// unmounts later (a template's view, the envd copy, a volume, a host's
// removable disk): private propagation would not carry that unmount here.

// newSpawnMountNS makes the spawner's namespace for b's sandboxes.
func (b *Backend) newSpawnMountNS() (*os.File, error) {
	dir, err := filepath.EvalSymlinks(b.sandboxesDir())
	if err != nil {
		return nil, fmt.Errorf("spawn mount namespace: %w", err)
	}
	return newSpawnMountNS(dir)
}

// newSpawnMountNS makes the namespace and returns a handle on it (an nsfs
// file, for setns), which keeps it alive until closed. keep lists the
// directories whose mounts (and those on their way) must stay: the
// sandboxes' directory.
func newSpawnMountNS(keep ...string) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread, the only one in the new namespace,
		// ends with this goroutine instead of going back to Go's pool.
		runtime.LockOSThread()
		f, err := func() (*os.File, error) {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return nil, fmt.Errorf("unshare: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
				return nil, fmt.Errorf("private: %w", err)
			}
			ms, err := threadMounts()
			if err != nil {
				return nil, err
			}
			drop := spawnNSDrop(ms, keep)
			for _, mp := range drop {
				// Each of the mounts stacked there; EINVAL once none is
				// left (or its parent's detach took it along).
				for {
					err := unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
					if err == unix.EINVAL || err == unix.ENOENT {
						break
					}
					if err != nil {
						return nil, fmt.Errorf("detach %s: %w", mp, err)
					}
				}
			}
			return os.Open("/proc/thread-self/ns/mnt")
		}()
		ch <- result{f, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("spawn mount namespace: %w", r.err)
	}
	return r.f, nil
}

// spawnNSDrop lists the mount points of ms that newSpawnMountNS detaches,
// deepest first: all but "/", those on the way to a directory of keep (or
// at it), /proc, /sys, /sys/fs/cgroup and the hierarchies right below it.
func spawnNSDrop(ms []*mountinfo.Info, keep []string) []string {
	need := append([]string{"/proc", "/sys/fs/cgroup"}, keep...)
	kept := func(mp string) bool {
		if filepath.Dir(mp) == "/sys/fs/cgroup" {
			return true
		}
		for _, p := range need {
			if mp == "/" || mp == p || strings.HasPrefix(p, mp+"/") {
				return true
			}
		}
		return false
	}
	var drop []string
	for _, m := range ms {
		if !kept(m.Mountpoint) && !slices.Contains(drop, m.Mountpoint) {
			drop = append(drop, m.Mountpoint)
		}
	}
	slices.SortStableFunc(drop, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return drop
}

// threadMounts lists the mounts of the calling thread's mount namespace,
// which a locked thread may have of its own: /proc/self is the main
// thread's, in sandboxd's namespace.
func threadMounts() ([]*mountinfo.Info, error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return mountinfo.GetMountsFromReader(f, nil)
}
