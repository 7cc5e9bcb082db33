package runtimetest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
)

// VolumeBackend is a backend that keeps volumes.
type VolumeBackend interface {
	runtime.Backend
	runtime.VolumeStore
}

// Volumes checks a VolumeStore with real sandboxes: a volume mounted
// read-write in two sandboxes at once; files written on either side
// (OpenVolume, inside) seen on the other with the owners the sandboxes see;
// its size enforced for root inside too; a sandbox's symlink out of the
// volume not followed by OpenVolume's root; the mount kept over a pause to
// disk (where the backend has it); a volume mounted by a live sandbox not
// deleted; and, once its sandboxes are destroyed, deleted at once and no
// longer listed. It uses volume id and 32 MiB.
func Volumes(t *testing.T, b VolumeBackend, id string) {
	ctx := ctxFor(t)
	if err := b.CreateVolume(ctx, id, 32); err != nil {
		t.Fatal(err)
	}
	// Not ctx: it is cancelled when the cleanups run.
	t.Cleanup(func() { _ = b.DeleteVolume(context.Background(), id) })
	if err := b.CreateVolume(ctx, id, 32); !errors.Is(err, runtime.ErrAlreadyExists) {
		t.Errorf("CreateVolume(existing) = %v; want ErrAlreadyExists", err)
	}
	if vs, err := b.Volumes(ctx); err != nil || !slices.Contains(vs, id) {
		t.Errorf("Volumes() = %v, %v; want it to hold %s", vs, err, id)
	}
	root, err := b.OpenVolume(ctx, id)
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

	var sbx []string
	for range 2 {
		sb := createSpec(t, b, Finish(runtime.Spec{ID: NewID(), MemoryMB: 256, DiskSizeMB: 64, CPUCount: 1,
			Mounts: []runtime.Mount{{Volume: id, Path: "/mnt/v"}}}))
		sbx = append(sbx, sb.ID)
	}
	a, c := sbx[0], sbx[1]
	if res := mustSh(t, b, a, "user", "cat /mnt/v/hello && stat -c %u /mnt/v/hello && echo from a > /mnt/v/a"); res.Stdout != "from host\n1000\n" {
		t.Errorf("in the sandbox: %v; want the host's file, owned by 1000", res)
	}
	if res := mustSh(t, b, c, "user", "cat /mnt/v/a"); res.Stdout != "from a\n" {
		t.Errorf("the second sandbox reads %q; want the first's file", res.Stdout)
	}
	if fi, err := root.Stat("a"); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("the host sees a: %v; want owned by 1000", err)
	}
	if res, err := sh(ctx, b, a, "root", "head -c 64000000 /dev/zero > /mnt/v/big"); err != nil || res.ExitCode == 0 ||
		!(strings.Contains(res.Stderr, "No space left") || strings.Contains(res.Stderr, "quota exceeded")) {
		t.Errorf("filling the volume: %v, %v; want ENOSPC (or EDQUOT)", res, err)
	}
	mustSh(t, b, a, "root", "rm -f /mnt/v/big && ln -s /etc/shadow /mnt/v/shadow")
	if _, err := root.ReadFile("shadow"); err == nil {
		t.Error("OpenVolume's root followed a sandbox's symlink out of the volume")
	}
	if err := b.DeleteVolume(ctx, id); !errors.Is(err, runtime.ErrInUse) {
		t.Errorf("DeleteVolume(mounted) = %v; want ErrInUse", err)
	}
	switch err := b.Pause(ctx, a, runtime.PauseDisk); {
	case errors.Is(err, runtime.ErrUnsupported):
	case err != nil:
		t.Fatal(err)
	default:
		if err := b.DeleteVolume(ctx, id); !errors.Is(err, runtime.ErrInUse) {
			t.Errorf("DeleteVolume(mounted by a paused sandbox) = %v; want ErrInUse", err)
		}
		if _, err := b.Resume(ctx, a); err != nil {
			t.Fatal(err)
		}
		if res := mustSh(t, b, a, "user", "cat /mnt/v/a"); res.Stdout != "from a\n" {
			t.Errorf("after a resume from disk: %v; want the volume mounted", res)
		}
	}
	for _, s := range sbx {
		if err := b.Destroy(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	root.Close()
	// At once: a backend that destroys in the background waits for it.
	if err := b.DeleteVolume(ctx, id); err != nil {
		t.Fatalf("DeleteVolume = %v", err)
	}
	if vs, _ := b.Volumes(ctx); slices.Contains(vs, id) {
		t.Errorf("Volumes() after the delete = %v; want without %s", vs, id)
	}
	if err := b.DeleteVolume(ctx, id); err != nil {
		t.Errorf("DeleteVolume(deleted) = %v; want nil", err)
	}
}
