package local_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/sys/mountinfo"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

func vsh(t *testing.T, b runtime.Backend, id, user, script string) runtimetest.Result {
	t.Helper()
	res, err := runtimetest.Exec(t.Context(), b, id, user, "/bin/sh", "-c", script)
	if err != nil {
		t.Fatalf("%s in %s: %v", script, id, err)
	}
	return res
}

// TestVolumes: a volume mounted read-write into two sandboxes at once, its
// files written inside readable through OpenVolume and the other way
// round, owners as the sandbox sees them, its size enforced by the kernel,
// mounted again on a resume from disk, not deleted while mounted, and
// nothing left (mounts, loop devices, directories) once deleted.
func TestVolumes(t *testing.T) {
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			env := newEnv(t)
			b := env.openMode(t, m)
			t.Cleanup(func() { b.Close() })
			ctx := t.Context()
			vol := "vol-" + randHex()
			if err := b.CreateVolume(ctx, vol, 16); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.DeleteVolume(ctx, vol) })
			if err := b.CreateVolume(ctx, vol, 16); !errors.Is(err, runtime.ErrAlreadyExists) {
				t.Errorf("CreateVolume(existing) = %v; want ErrAlreadyExists", err)
			}
			root, err := b.OpenVolume(ctx, vol)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { root.Close() })
			if err := root.WriteFile("hello", []byte("from host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := root.Chown("hello", 1000, 1000); err != nil {
				t.Fatal(err)
			}

			var ids []string
			for range 2 {
				id := runtimetest.NewID()
				spec := runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64,
					Mounts: []runtime.Mount{{Volume: vol, Path: "/mnt/v"}, {Volume: vol, Path: "/mnt/v/again"}}})
				if _, err := b.Create(ctx, spec); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = b.Destroy(ctx, id) })
				ids = append(ids, id)
			}
			a, c := ids[0], ids[1]
			if res := vsh(t, b, a, "user", "cat /mnt/v/hello && stat -c %u /mnt/v/hello && echo from a > /mnt/v/a"); res.ExitCode != 0 || res.Stdout != "from host\n1000\n" {
				t.Fatalf("in sandbox: %+v; want the host's file, owned by 1000", res)
			}
			if res := vsh(t, b, c, "user", "cat /mnt/v/a /mnt/v/again/hello"); res.Stdout != "from a\nfrom host\n" {
				t.Errorf("second sandbox reads %q; want the first's file", res.Stdout)
			}
			if fi, err := root.Stat("a"); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
				t.Errorf("host sees a: %v, %v; want owned by 1000", fi, err)
			}
			// The size holds for everyone, root inside included.
			if res := vsh(t, b, a, "root", "head -c 32000000 /dev/zero > /mnt/v/big"); res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left") {
				t.Errorf("filling the volume: %+v; want ENOSPC", res)
			}
			vsh(t, b, a, "root", "rm -f /mnt/v/big")
			// No escape through a symlink a sandbox makes: the host's view
			// (os.Root) refuses it.
			vsh(t, b, a, "root", "ln -s /etc/shadow /mnt/v/shadow")
			if _, err := root.ReadFile("shadow"); err == nil {
				t.Error("OpenVolume's root followed a sandbox's symlink out of the volume")
			}
			if err := b.DeleteVolume(ctx, vol); !errors.Is(err, runtime.ErrInUse) {
				t.Errorf("DeleteVolume(mounted) = %v; want ErrInUse", err)
			}
			// A resume from disk mounts the volume again.
			if err := b.Pause(ctx, a, runtime.PauseDisk); err != nil {
				t.Fatal(err)
			}
			if err := b.DeleteVolume(ctx, vol); !errors.Is(err, runtime.ErrInUse) {
				t.Errorf("DeleteVolume(mounted by a paused sandbox) = %v; want ErrInUse", err)
			}
			if _, err := b.Resume(ctx, a); err != nil {
				t.Fatal(err)
			}
			if res := vsh(t, b, a, "user", "cat /mnt/v/a"); res.Stdout != "from a\n" {
				t.Errorf("after resume from disk: %+v; want the volume mounted", res)
			}
			for _, id := range ids {
				if err := b.Destroy(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			root.Close()
			// A reboot unmounts the image: the next use mounts it again, the
			// files intact.
			mnt := filepath.Join(env.root, "volumes", vol, "mnt")
			for _, p := range []string{filepath.Join(env.root, "volumes", vol, "view"), mnt} {
				_ = syscall.Unmount(p, 0)
			}
			if root, err = b.OpenVolume(ctx, vol); err != nil {
				t.Fatal(err)
			}
			if got, err := root.ReadFile("a"); err != nil || string(got) != "from a\n" {
				t.Errorf("after remount: %q, %v", got, err)
			}
			root.Close()
			if err := b.DeleteVolume(ctx, vol); err != nil {
				t.Fatal(err)
			}
			if mounted, _ := mountinfo.Mounted(mnt); mounted {
				t.Error("DeleteVolume left the image mounted")
			}
			if _, err := os.Stat(filepath.Join(env.root, "volumes", vol)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("DeleteVolume left its directory: %v", err)
			}
			if err := b.DeleteVolume(ctx, vol); err != nil {
				t.Errorf("DeleteVolume(gone) = %v; want nil", err)
			}
		})
	}
}

// A create naming a volume that does not exist fails and leaves nothing.
func TestVolumeMissing(t *testing.T) {
	env := newEnv(t)
	b := env.open(t)
	t.Cleanup(func() { b.Close() })
	id := runtimetest.NewID()
	_, err := b.Create(t.Context(), runtimetest.Finish(runtime.Spec{ID: id, Mounts: []runtime.Mount{{Volume: "nope", Path: "/mnt/v"}}}))
	if !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("Create(missing volume) = %v; want ErrInvalidSpec", err)
	}
	if l := list(t, b); len(l) != 0 {
		t.Errorf("sandboxes after the failed create: %v", l)
	}
	if vs, _ := b.Volumes(t.Context()); len(vs) != 0 {
		t.Errorf("Volumes() = %v; want none", vs)
	}
}

var _ runtime.VolumeStore = (*local.Backend)(nil)
