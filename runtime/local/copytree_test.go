package local

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyTreeDeep: a layer whose paths are longer than PATH_MAX on the
// host (a sandbox makes them by relative steps) is copied whole, with the
// metadata of its deepest entries.
func TestCopyTreeDeep(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("copyTree keeps ownership and trusted.* xattrs: needs root")
	}
	src := filepath.Join(t.TempDir(), "upper")
	dst := filepath.Join(t.TempDir(), "copy")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("d", 250)
	const depth = 20 // 20 × 251 bytes: beyond PATH_MAX (4096) on its own
	// Build the chain one directory fd at a time, as a sandbox could.
	walk := func(root string, mk bool) int {
		t.Helper()
		fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for range depth {
			if mk {
				if err := unix.Mkdirat(fd, name, 0o750); err != nil {
					t.Fatal(err)
				}
			}
			next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
			unix.Close(fd)
			if err != nil {
				t.Fatal(err)
			}
			fd = next
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	deep := walk(src, true)
	f, err := unix.Openat(deep, "file", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(f, []byte("deep")); err != nil {
		t.Fatal(err)
	}
	unix.Close(f)
	if err := unix.Fchownat(deep, "file", 1000, 1000, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Linkat(deep, "file", deep, "link", 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Symlinkat("file", deep, "sym"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknodat(deep, "whiteout", unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkdirat(deep, "opaque", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr("/proc/self/fd/"+itoa(deep)+"/opaque", "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}

	if err := copyTree(src, dst); err != nil {
		t.Fatalf("copyTree: %v", err)
	}

	got := walk(dst, false)
	var st, lst unix.Stat_t
	if err := unix.Fstatat(got, "file", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 1000 || st.Mode&0o7777 != 0o640 || st.Size != 4 || st.Nlink != 2 {
		t.Errorf("deep file: uid %d mode %o size %d nlink %d; want 1000 640 4 2", st.Uid, st.Mode&0o7777, st.Size, st.Nlink)
	}
	if err := unix.Fstatat(got, "link", &lst, unix.AT_SYMLINK_NOFOLLOW); err != nil || lst.Ino != st.Ino {
		t.Errorf("hard link: %v, ino %d; want %d", err, lst.Ino, st.Ino)
	}
	buf := make([]byte, 16)
	if n, err := unix.Readlinkat(got, "sym", buf); err != nil || string(buf[:n]) != "file" {
		t.Errorf("symlink: %q, %v", buf[:n], err)
	}
	if err := unix.Fstatat(got, "whiteout", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout: mode %o rdev %d, %v", st.Mode, st.Rdev, err)
	}
	n, err := unix.Getxattr("/proc/self/fd/"+itoa(got)+"/opaque", "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr: %q, %v", buf[:n], err)
	}
	if err := unix.Fstatat(got, "..", &st, 0); err != nil || st.Mode&0o7777 != 0o750 {
		t.Errorf("deep directory mode %o, %v; want 750", st.Mode&0o7777, err)
	}
}

func itoa(fd int) string { return strconv.Itoa(fd) }
