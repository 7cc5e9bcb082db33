package incus_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
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

// TestVolumes: an Incus custom volume mounted in two sandboxes, owners as
// the sandboxes see them through OpenVolume, its size enforced, kept over
// a pause to disk, not deleted while attached, and listed by Volumes.
func TestVolumes(t *testing.T) {
	b, _ := newBackend(t)
	ctx := t.Context()
	vol := "vol-" + randHex()
	if err := b.CreateVolume(ctx, vol, 32); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.DeleteVolume(ctx, vol) })
	if vs, err := b.Volumes(ctx); err != nil || len(vs) != 1 || vs[0] != vol {
		t.Errorf("Volumes() = %v, %v; want [%s]", vs, err, vol)
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
		if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, CPUCount: 1,
			Mounts: []runtime.Mount{{Volume: vol, Path: "/mnt/v"}}})); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Destroy(ctx, id) })
		ids = append(ids, id)
	}
	a, c := ids[0], ids[1]
	if res := vsh(t, b, a, "user", "cat /mnt/v/hello && stat -c %u /mnt/v/hello && echo from a > /mnt/v/a"); res.ExitCode != 0 || res.Stdout != "from host\n1000\n" {
		t.Fatalf("in sandbox: %+v; want the host's file, owned by 1000", res)
	}
	if res := vsh(t, b, c, "user", "cat /mnt/v/a"); res.Stdout != "from a\n" {
		t.Errorf("second sandbox reads %q; want the first's file", res.Stdout)
	}
	if fi, err := root.Stat("a"); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("host sees a: %v, %v; want owned by 1000", fi.Sys(), err)
	}
	if res := vsh(t, b, a, "root", "head -c 64000000 /dev/zero > /mnt/v/big"); res.ExitCode == 0 ||
		!(strings.Contains(res.Stderr, "No space left") || strings.Contains(res.Stderr, "quota exceeded")) {
		t.Errorf("filling the volume: %+v; want ENOSPC or EDQUOT", res)
	}
	vsh(t, b, a, "root", "rm -f /mnt/v/big")
	if err := b.DeleteVolume(ctx, vol); !errors.Is(err, runtime.ErrInUse) {
		t.Errorf("DeleteVolume(attached) = %v; want ErrInUse", err)
	}
	if err := b.Pause(ctx, a, runtime.PauseDisk); err != nil && !errors.Is(err, runtime.ErrUnsupported) {
		t.Fatal(err)
	} else if err == nil {
		if _, err := b.Resume(ctx, a); err != nil {
			t.Fatal(err)
		}
		if res := vsh(t, b, a, "user", "cat /mnt/v/a"); res.Stdout != "from a\n" {
			t.Errorf("after resume from disk: %+v; want the volume mounted", res)
		}
	}
	for _, id := range ids {
		if err := b.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// At once: the deletions in the background are waited for.
	if err := b.DeleteVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	if vs, _ := b.Volumes(ctx); len(vs) != 0 {
		t.Errorf("Volumes() after delete = %v; want none", vs)
	}
}
