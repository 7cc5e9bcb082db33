package local

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// envdFSSource names the tmpfs at <Root>/envd that holds the backend's copy
// of envd (copyEnvd).
const envdFSSource = "sandboxd-envd"

// copyEnvd copies the envd binary at src onto a read-only tmpfs of its own
// at dir, mounted with huge=always, and returns the copy's path: the one
// sandboxes bind-mount. Every sandbox's first act is envd's start, and a
// binary in huge pages is mapped by a handful of faults instead of one per
// 16 pages (fault-around): 100 fewer page faults at each start, 0.2-0.3 ms
// less per create here (BENCHMARKS.md). It also pins the envd that new
// sandboxes run for the life of the backend, whatever happens to src.
//
// A mount left at dir by an earlier process is detached first; sandboxes
// that bind-mounted a file from it keep it through their own mounts. Where
// the tmpfs cannot be mounted (a kernel without transparent huge pages for
// tmpfs, a backend without the right to mount), it returns src, to be used
// as it is, and why in skipped.
func copyEnvd(dir, src string) (path string, skipped, err error) {
	if err := unmountEnvdCopy(dir); err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	in, err := os.Open(src)
	if err != nil {
		return "", nil, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return "", nil, err
	}
	// Room for the binary rounded up to whole huge pages, and one more.
	const huge = 2 << 20
	size := (st.Size()/huge + 2) * huge
	opts := fmt.Sprintf("mode=0755,size=%d,huge=always", size)
	if err := unix.Mount(envdFSSource, dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return src, fmt.Errorf("mount a tmpfs with huge pages at %s: %w", dir, err), nil
	}
	dst := filepath.Join(dir, "envd")
	if err := writeCopy(dst, in, st.Size()); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return "", nil, err
	}
	// Read-only from here: nothing, root on the host included, can change
	// the binary sandboxes start from without remounting.
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return "", nil, fmt.Errorf("remount %s read-only: %w", dir, err)
	}
	return dst, nil, nil
}

// writeCopy writes size bytes of in to a new file at dst, mode 0555.
func writeCopy(dst string, in *os.File, size int64) error {
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o555)
	if err != nil {
		return err
	}
	if err := copyData(in, out, size); err != nil {
		out.Close()
		return fmt.Errorf("copy envd: %w", err)
	}
	return out.Close()
}

// unmountEnvdCopy detaches copyEnvd's tmpfs at dir, if it is there.
func unmountEnvdCopy(dir string) error {
	for {
		if ours, err := topMountIs(dir, envdFSSource); !ours {
			return err // nothing there, or not ours: leave it
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
}
