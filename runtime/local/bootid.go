package local

import (
	"crypto/rand"
	"fmt"
	"os"
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// bootIDPath is where Linux gives every boot a random id. Tools (and E2B's
// tests) read it to tell a reboot from a long uptime; a sandbox shares the
// host's kernel and so its id, which never changes across a pause to disk,
// although the resumed sandbox starts afresh like a rebooted machine.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// bindBootID mounts a fresh boot id over bootIDPath in the mount namespace
// of the sandbox whose init is pid: every start, cold or from disk, is a
// boot of its own. libcontainer refuses a bind mount under /proc in a
// container's config (only lxcfs's few files pass), so it is added once
// init runs: the file is cloned as a detached mount here (open_tree), and
// attached from a thread that joined the sandbox's mount namespace
// (move_mount). The file is unlinked at once: nothing inside the sandbox can
// reach it but through the read-only mount.
func bindBootID(dir string, pid int) error {
	f, err := os.CreateTemp(dir, ".boot_id-")
	if err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(newBootID() + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o444)
	}
	if err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, f.Name(), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("boot id: open_tree: %w", err)
	}
	defer unix.Close(tree)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("boot id: mount_setattr: %w", err)
	}
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	defer unix.Close(ns)
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread joins the sandbox's mount namespace
		// and must end with this goroutine instead of running others
		// there. setns into a mount namespace needs a thread that shares
		// no filesystem context (cwd, root) with the others: unshare it.
		goruntime.LockOSThread()
		done <- func() error {
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return fmt.Errorf("unshare(CLONE_FS): %w", err)
			}
			if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("setns: %w", err)
			}
			if err := unix.MoveMount(tree, "", unix.AT_FDCWD, bootIDPath, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return fmt.Errorf("move_mount: %w", err)
			}
			return nil
		}()
	}()
	if err := <-done; err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	return nil
}

// newBootID returns a random (version 4) UUID, the form of the kernel's.
func newBootID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails on Linux
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
