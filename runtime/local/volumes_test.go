package local_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/moby/sys/mountinfo"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// TestVolumes: the volume suite in both user namespace modes, and nothing
// of the volume left (mounts, loop devices through them, directories).
func TestVolumes(t *testing.T) {
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			env := newEnv(t)
			b := env.openMode(t, m)
			t.Cleanup(func() { b.Close() })
			vol := "vol-" + randHex()
			runtimetest.Volumes(t, b, vol)
			dir := filepath.Join(env.root, "volumes", vol)
			if mounted, _ := mountinfo.Mounted(filepath.Join(dir, "mnt")); mounted {
				t.Error("DeleteVolume left the image mounted")
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("DeleteVolume left its directory: %v", err)
			}
		})
	}
}

// TestVolumeRemountAndNesting: a volume whose image is no longer mounted
// (a reboot) is mounted again on use with its files, and one volume may be
// mounted at nested paths of a sandbox (the deeper one over the other,
// whatever their order in the spec).
func TestVolumeRemountAndNesting(t *testing.T) {
	env := newEnv(t)
	b := env.open(t)
	t.Cleanup(func() { b.Close() })
	ctx := t.Context()
	vol := "vol-" + randHex()
	if err := b.CreateVolume(ctx, vol, 16); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.DeleteVolume(context.Background(), vol) })
	root, err := b.OpenVolume(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	if err := root.WriteFile("f", []byte("kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root.Close()
	for _, p := range []string{"view", "mnt"} {
		_ = syscall.Unmount(filepath.Join(env.root, "volumes", vol, p), 0)
	}
	id := runtimetest.NewID()
	spec := runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64,
		Mounts: []runtime.Mount{{Volume: vol, Path: "/mnt/v/inner"}, {Volume: vol, Path: "/mnt/v"}}})
	if _, err := b.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	res, err := runtimetest.Exec(ctx, b, id, "user", "/bin/cat", "/mnt/v/f", "/mnt/v/inner/f")
	if err != nil || res.Stdout != "kept\nkept\n" {
		t.Errorf("cat in the sandbox = %v, %v; want the file at both mounts", res, err)
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
