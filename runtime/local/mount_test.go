package local

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMountsUnder: the walk finds what mountinfo finds at and below a
// directory (a tmpfs, two stacked on one point, a bind-mounted file, the
// directory itself), and removeDir leaves none of them behind.
func TestMountsUnder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts: needs root")
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
	}{
		{"none", func(t *testing.T, dir string) {
			mkdirs(t, dir, "a/b")
		}},
		{"tmpfs below", func(t *testing.T, dir string) {
			mkdirs(t, dir, "disk", "rootfs")
			mustMount(t, "tmpfs", filepath.Join(dir, "disk"), "tmpfs", 0, "size=1m")
			mkdirs(t, filepath.Join(dir, "disk"), "upper/deep") // not walked: behind a mount
		}},
		{"stacked", func(t *testing.T, dir string) {
			mkdirs(t, dir, "x")
			mustMount(t, "tmpfs", filepath.Join(dir, "x"), "tmpfs", 0, "size=1m")
			mustMount(t, "tmpfs", filepath.Join(dir, "x"), "tmpfs", 0, "size=1m")
		}},
		{"file bind", func(t *testing.T, dir string) {
			mkdirs(t, dir, "etc")
			f := filepath.Join(dir, "etc", "hosts")
			if err := os.WriteFile(f, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			mustMount(t, "/etc/hostname", f, "", unix.MS_BIND, "")
		}},
		{"dir itself", func(t *testing.T, dir string) {
			mustMount(t, "tmpfs", dir, "tmpfs", 0, "size=1m")
			mkdirs(t, dir, "a")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "sandbox")
			mkdirs(t, dir)
			t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
			tt.setup(t, dir)
			got, err := mountsUnder(dir)
			if err != nil {
				t.Fatal(err)
			}
			want, err := mountsFromMountinfo(dir)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(got)
			want = slices.Compact(slices.Sorted(slices.Values(want))) // stacked: one point
			if !slices.Equal(got, want) {
				t.Fatalf("mountsUnder = %q; mountinfo says %q", got, want)
			}
			if err := removeDir(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(dir); !os.IsNotExist(err) {
				t.Fatalf("after removeDir: %v", err)
			}
			if left, _ := mountsFromMountinfo(dir); len(left) > 0 {
				t.Fatalf("still mounted after removeDir: %q", left)
			}
		})
	}
}

func mkdirs(t *testing.T, dir string, rel ...string) {
	t.Helper()
	for _, r := range append([]string{""}, rel...) {
		if err := os.MkdirAll(filepath.Join(dir, r), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func mustMount(t *testing.T, src, dst, fstype string, flags uintptr, data string) {
	t.Helper()
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for unix.Unmount(dst, unix.MNT_DETACH) == nil {
		}
	})
}

// TestStateFS: an empty state directory on a disk gets the tmpfs, one that
// holds sandboxes does not (mounting over them would hide them), and the
// tmpfs goes at Close only once it is empty.
func TestStateFS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts: needs root")
	}
	isTmpfs := func(dir string) bool {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		return st.Type == unix.TMPFS_MAGIC
	}
	base := t.TempDir()
	if isTmpfs(base) {
		t.Skip("the test directory is on tmpfs already")
	}
	busy := filepath.Join(base, "busy")
	mkdirs(t, busy, "sandbox1")
	if err := mountStateFS(busy); err != nil {
		t.Fatal(err)
	}
	if isTmpfs(busy) {
		_ = unix.Unmount(busy, unix.MNT_DETACH)
		t.Fatal("mounted over a directory that holds a sandbox")
	}

	dir := filepath.Join(base, "sandboxes")
	mkdirs(t, dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := mountStateFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if !isTmpfs(dir) {
		t.Fatal("no tmpfs at an empty state directory on a disk")
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o711 {
		t.Fatalf("tmpfs root mode = %v, %v; want the directory's 0711", fi.Mode(), err)
	}
	if err := mountStateFS(dir); err != nil { // an earlier process's: kept
		t.Fatal(err)
	}
	mkdirs(t, dir, "sandbox2")
	if err := unmountStateFS(dir); err != nil || !isTmpfs(dir) {
		t.Fatalf("unmountStateFS with a sandbox in it: %v, tmpfs %v; want it kept", err, isTmpfs(dir))
	}
	if err := os.Remove(filepath.Join(dir, "sandbox2")); err != nil {
		t.Fatal(err)
	}
	if err := unmountStateFS(dir); err != nil || isTmpfs(dir) {
		t.Fatalf("unmountStateFS when empty: %v, tmpfs %v; want it gone", err, isTmpfs(dir))
	}
	if left, _ := mountsFromMountinfo(dir); len(left) > 0 {
		t.Fatalf("mounts left: %q", left)
	}
}
