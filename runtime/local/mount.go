package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime"
)

// mountTmpfs mounts a tmpfs of sizeMB at dir: the sandbox's whole writable
// layer, so its size is the disk limit. Pages written to it are charged to
// the memory cgroup of the writer, that is the sandbox.
func mountTmpfs(dir string, sizeMB int) error {
	opts := fmt.Sprintf("size=%dm,mode=0755", sizeMB)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount tmpfs at %s: %w", dir, err)
	}
	return nil
}

// mountOverlay mounts lowers (read-only, top first) with upper and work at
// dir: with mount(2) where the options fit in its page, else one layer at
// a time (mountOverlayLayers).
func mountOverlay(dir string, lowers []string, upper, work string) error {
	opts, err := overlayOptions(lowers, upper, work)
	if err != nil {
		return err
	}
	if opts == "" {
		return mountOverlayLayers(dir, lowers, upper, work)
	}
	if err := unix.Mount("overlay", dir, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", dir, err)
	}
	return nil
}

// maxLowers is overlayfs's limit on lower layers (OVL_MAX_STACK).
const maxLowers = 500

// overlayOptions returns the mount(2) options of an overlay of lowers (top
// first) with upper and work, "" when they do not fit in the one page
// mount(2) passes (the kernel cuts them there) but the kernel takes the
// layers one at a time, or runtime.ErrInvalidSpec where overlayfs would
// refuse the stack: more lower layers than it stacks, or options too long
// for a kernel that cannot.
func overlayOptions(lowers []string, upper, work string) (string, error) {
	if len(lowers) > maxLowers {
		return "", fmt.Errorf("%w: %d lower layers; overlayfs stacks at most %d", runtime.ErrInvalidSpec, len(lowers), maxLowers)
	}
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upper + ",workdir=" + work
	if len(opts) < unix.Getpagesize() {
		return opts, nil
	}
	if !appendLayers() {
		return "", fmt.Errorf("%w: %d lower layers make overlay mount options of %d bytes, more than a page: "+
			"this kernel cannot take them one at a time (Linux 6.8 can)", runtime.ErrInvalidSpec, len(lowers), len(opts))
	}
	for _, p := range append([]string{upper, work}, lowers...) {
		if len(p) > maxFsconfigString {
			return "", fmt.Errorf("%w: overlay layer path %s longer than %d bytes", runtime.ErrInvalidSpec, p, maxFsconfigString)
		}
	}
	return "", nil
}

// maxFsconfigString bounds a string value of fsconfig(2): the kernel
// copies at most 256 bytes with the terminating NUL.
const maxFsconfigString = 255

// appendLayers reports whether overlayfs takes lower layers one at a time
// through the new mount API ("lowerdir+", Linux 6.8), with no page limit
// on the whole.
var appendLayers = sync.OnceValue(func() bool {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.FsconfigSetString(fd, "lowerdir+", "/") == nil
})

// mountOverlayLayers mounts the overlay of mountOverlay with the new mount
// API, one lower layer per fsconfig call (top first, as in lowerdir=).
func mountOverlayLayers(dir string, lowers []string, upper, work string) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("mount overlay at %s: fsopen: %w", dir, err)
	}
	defer unix.Close(fd)
	set := func(key, val string) error {
		if err := unix.FsconfigSetString(fd, key, val); err != nil {
			return fmt.Errorf("mount overlay at %s: %s %s: %w", dir, key, val, err)
		}
		return nil
	}
	for _, l := range lowers {
		if err := set("lowerdir+", l); err != nil {
			return err
		}
	}
	if err := errors.Join(set("upperdir", upper), set("workdir", work)); err != nil {
		return err
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", dir, err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("mount overlay at %s: fsmount: %w", dir, err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount overlay at %s: move_mount: %w", dir, err)
	}
	return nil
}

// unmount unmounts dir if it is a mount point. A busy mount is retried
// briefly, then detached: by the time we unmount, the sandbox's processes are
// gone, and a lingering reference (a process still closing files) must not
// make destroy fail.
func unmount(dir string) error {
	for i := 0; ; i++ {
		err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue // stacked mounts: repeat until EINVAL
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more)
		case errors.Is(err, unix.EBUSY) && i < 5:
			time.Sleep(time.Duration(1<<i) * time.Millisecond)
		case errors.Is(err, unix.EBUSY):
			if err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %w", dir, err)
			}
			return nil
		default:
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
}

// mountsUnder returns the mount points at or below dir, deepest first.
//
// It walks dir and compares each entry's mount id with its directory's,
// without entering a mount. The usual tree is a sandbox's directory (a few
// files beside its tmpfs and overlay), so that costs a few statx calls
// where reading /proc/self/mountinfo costs time in proportion to every
// mount on the host: two mounts per sandbox, so destroys got slower as the
// host filled up. A mount point's own submounts are not listed: unmount
// detaches those with it. Kernels without statx's mount id (before 5.8)
// read mountinfo.
func mountsUnder(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	parent, err := mountID(filepath.Dir(dir))
	if errors.Is(err, errNoMountID) {
		return mountsFromMountinfo(dir)
	} else if err != nil {
		return nil, err
	}
	var out []string
	var walk func(path string, parent uint64, isDir bool) error
	walk = func(path string, parent uint64, isDir bool) error {
		id, err := mountID(path)
		if err != nil {
			return err
		}
		if id != parent {
			out = append(out, path)
			return nil
		}
		if !isDir {
			return nil
		}
		ents, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range ents {
			err := walk(filepath.Join(path, e.Name()), id, e.IsDir())
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		return nil
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	if err := walk(dir, parent, st.IsDir()); err != nil {
		return nil, err
	}
	return out, nil
}

var errNoMountID = errors.New("statx: no mount id")

// mountID returns the id of the mount that path (not followed) is on.
func mountID(path string) (uint64, error) {
	var st unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &st)
	if err != nil {
		return 0, &fs.PathError{Op: "statx", Path: path, Err: err}
	}
	if st.Mask&unix.STATX_MNT_ID == 0 {
		return 0, errNoMountID
	}
	return st.Mnt_id, nil
}

func mountsFromMountinfo(dir string) ([]string, error) {
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Mountpoint)
	}
	// Deepest first, so that nested mounts go before their parents.
	slices.SortStableFunc(out, func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	return out, nil
}

// removeDir unmounts everything at or below dir, then removes it. It refuses
// to remove anything while a mount remains below dir, so a failed unmount can
// never make it delete through a mount into a template or the host.
func removeDir(dir string) error {
	ms, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := unmount(m); err != nil {
			return err
		}
	}
	if ms, err := mountsUnder(dir); err != nil {
		return err
	} else if len(ms) > 0 {
		return fmt.Errorf("remove %s: still mounted: %v", dir, ms)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// dirUsage returns the used and total bytes of the filesystem at dir.
func dirUsage(dir string) (used, total uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Clean(dir), &st); err != nil {
		return 0, 0, err
	}
	bs := uint64(st.Bsize)
	return (st.Blocks - st.Bfree) * bs, st.Blocks * bs, nil
}

// stateFSSource names the tmpfs that mountStateFS puts at <Root>/sandboxes.
const stateFSSource = "sandboxd-state"

// mountStateFS puts the sandboxes' state directories (meta, libcontainer
// state, socket directory, mount points) on a tmpfs of their own when dir,
// <Root>/sandboxes, is on a disk filesystem, as /run is on some hosts (these
// machines among them). Every create makes and every destroy removes a
// dozen inodes there, and on ext4 that cost 4-5 ms of CPU per create in a
// burst (inode allocation scanning for recently deleted inodes), 15% of the
// whole. The state is worth nothing after a reboot anyway: the sandboxes
// are gone; those paused to disk keep theirs in SaveDir. A dir that holds
// sandboxes already (an earlier process's, on the disk) is left alone:
// mounting over it would hide them.
func mountStateFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		return nil // in memory already: ours from an earlier process, or /run's
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	// Small files only: each sandbox's writable layer and envd's log are on
	// the sandbox's own tmpfs, mounted below. The mode is the directory's
	// (0711 with user namespaces: their root must get through it).
	opts := fmt.Sprintf("mode=%o,size=256m", fi.Mode().Perm())
	if err := unix.Mount(stateFSSource, dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount state tmpfs at %s: %w", dir, err)
	}
	return nil
}

// unmountStateFS unmounts mountStateFS's tmpfs at dir if no sandbox is left
// in it, so that a clean stop leaves no mount behind.
func unmountStateFS(dir string) error {
	if ours, err := topMountIs(dir, stateFSSource); !ours {
		return err
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return err
	}
	if err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("unmount state tmpfs at %s: %w", dir, err)
	}
	return nil
}

// topMountIs reports whether the mount on top at dir has source: one of the
// backend's own tmpfs mounts (stateFSSource, envdFSSource), not someone
// else's.
func topMountIs(dir, source string) (bool, error) {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(dir))
	if err != nil {
		return false, err
	}
	return len(ms) > 0 && ms[len(ms)-1].Source == source, nil
}
