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
