package filesystem

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
)

func TestMove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := sharedDir(t)
	writeFile(t, filepath.Join(dir, "old.txt"), "content")

	// Missing destination parents are created for the request user.
	dst := filepath.Join(dir, "new", "deeper", "new.txt")
	resp, err := e.client.Move(ctx, request(&filesystem.MoveRequest{Source: filepath.Join(dir, "old.txt"), Destination: dst}, "nobody"))
	if err != nil {
		t.Fatal(err)
	}
	if en := resp.Msg.GetEntry(); en.GetPath() != dst || en.GetName() != "new.txt" || en.GetType() != filesystem.FileType_FILE_TYPE_FILE {
		t.Errorf("Move entry = %s %s %v; want file %s", en.GetPath(), en.GetName(), en.GetType(), dst)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "content" {
		t.Errorf("destination holds %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "old.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("source still there: %v", err)
	}
	for _, d := range []string{filepath.Join(dir, "new"), filepath.Join(dir, "new", "deeper")} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
			t.Errorf("created parent %s owned by uid %d; want nobody", d, uid)
		}
	}
	// The moved file keeps its owner: envd moves, it does not chown.
	if fi, _ := os.Stat(dst); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("moved file changed owner")
	}

	// A missing source is not_found and creates nothing.
	_, err = e.client.Move(ctx, request(&filesystem.MoveRequest{Source: filepath.Join(dir, "missing"), Destination: filepath.Join(dir, "nope", "x")}, "root"))
	wantCode(t, "Move(missing)", err, connect.CodeNotFound)
	if _, err := os.Lstat(filepath.Join(dir, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed move created destination parents: %v", err)
	}

	// os.Rename's rules, as in E2B: a file replaces a file; nothing
	// replaces a directory, even an empty one.
	writeFile(t, filepath.Join(dir, "a"), "A")
	writeFile(t, filepath.Join(dir, "b"), "B")
	if _, err := e.client.Move(ctx, request(&filesystem.MoveRequest{Source: filepath.Join(dir, "a"), Destination: filepath.Join(dir, "b")}, "root")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "b")); string(b) != "A" {
		t.Errorf("b = %q after moving a onto it; want A", b)
	}
	writeFile(t, filepath.Join(dir, "d1", "x"), "x")
	writeFile(t, filepath.Join(dir, "d2", "y"), "y")
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"d2", "empty"} {
		_, err = e.client.Move(ctx, request(&filesystem.MoveRequest{Source: filepath.Join(dir, "d1"), Destination: filepath.Join(dir, target)}, "root"))
		wantCode(t, "Move(dir onto "+target+")", err, connect.CodeAlreadyExists)
	}
	if _, err := os.Stat(filepath.Join(dir, "d1", "x")); err != nil {
		t.Errorf("failed move lost the source: %v", err)
	}
	_, err = e.client.Move(ctx, request(&filesystem.MoveRequest{Source: filepath.Join(dir, "d1"), Destination: filepath.Join(dir, "d1", "inside")}, "root"))
	wantCode(t, "Move(dir into itself)", err, connect.CodeInvalidArgument)
	_, err = e.client.Move(ctx, request(&filesystem.MoveRequest{Source: filepath.Join(dir, "b"), Destination: filepath.Join(dir, "b", "below")}, "root"))
	wantCode(t, "Move(below a file)", err, connect.CodeInvalidArgument)
}

// TestMoveAcrossFilesystems moves a tree from tmpfs (/dev/shm) to the test's
// temp dir, which rename(2) refuses with EXDEV, and checks it arrives whole:
// content, owner, mode bits, symlinks, xattrs and times.
func TestMoveAcrossFilesystems(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dst := tempDir(t)
	src, err := os.MkdirTemp("/dev/shm", "sandboxd-move-test-")
	if err != nil {
		t.Skipf("no tmpfs to move from: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(src) })
	var a, b unix.Stat_t
	if unix.Stat(src, &a) != nil || unix.Stat(dst, &b) != nil || a.Dev == b.Dev {
		t.Skip("/dev/shm is not a separate filesystem here")
	}

	tree := filepath.Join(src, "tree")
	writeFile(t, filepath.Join(tree, "sub", "f.txt"), "payload")
	f := filepath.Join(tree, "sub", "f.txt")
	if err := os.Chown(f, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o4750|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(f, "user.e2b.k", []byte("v"), 0); err != nil {
		t.Skipf("tmpfs without user xattrs: %v", err)
	}
	mustSymlink(t, "sub/f.txt", filepath.Join(tree, "link"))
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(f, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(tree, "fifo"), 0o640); err != nil {
		t.Fatal(err)
	}

	moved := filepath.Join(dst, "moved")
	resp, err := e.client.Move(ctx, request(&filesystem.MoveRequest{Source: tree, Destination: moved}, "root"))
	if err != nil {
		t.Fatalf("Move across filesystems: %v", err)
	}
	if resp.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY {
		t.Errorf("entry type %v; want directory", resp.Msg.GetEntry().GetType())
	}
	if _, err := os.Lstat(tree); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("source still there: %v", err)
	}
	g := filepath.Join(moved, "sub", "f.txt")
	en, err := EntryInfo(g)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(g); string(b) != "payload" {
		t.Errorf("content %q; want payload", b)
	}
	if en.GetOwner() != "nobody" || en.GetPermissions() != "urwxr-x---" || en.GetMetadata()["k"] != "v" {
		t.Errorf("moved file: owner %s permissions %s metadata %v; want nobody urwxr-x--- k=v", en.GetOwner(), en.GetPermissions(), en.GetMetadata())
	}
	if !en.GetModifiedTime().AsTime().Equal(mtime) {
		t.Errorf("mtime %v; want %v", en.GetModifiedTime().AsTime(), mtime)
	}
	if target, err := os.Readlink(filepath.Join(moved, "link")); err != nil || target != "sub/f.txt" {
		t.Errorf("link -> %q, %v; want sub/f.txt", target, err)
	}
	if fi, err := os.Lstat(filepath.Join(moved, "fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("fifo not recreated: %v %v", fi, err)
	}
	// No staging directory is left behind.
	if des, _ := os.ReadDir(dst); len(des) != 1 {
		t.Errorf("destination dir holds %d entries; want only the moved tree", len(des))
	}
}

func TestMoveAcrossRefusesItself(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	err := moveAcross(context.Background(), dir, filepath.Join(dir, "sub"))
	if !errors.Is(err, unix.EINVAL) {
		t.Errorf("moveAcross into itself = %v; want EINVAL", err)
	}
}
