package volume

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/errdefs"
)

func TestClean(t *testing.T) {
	for _, tc := range []struct{ in, abs, rel string }{
		{"", "/", "."},
		{"/", "/", "."},
		{"a.txt", "/a.txt", "a.txt"},
		{"/a/b/../c", "/a/c", "a/c"},
		{"../../etc/passwd", "/etc/passwd", "etc/passwd"},
		{"//x//y/", "/x/y", "x/y"},
	} {
		abs, rel, err := Clean(tc.in)
		if err != nil || abs != tc.abs || rel != tc.rel {
			t.Errorf("Clean(%q) = %q, %q, %v; want %q, %q, nil", tc.in, abs, rel, err, tc.abs, tc.rel)
		}
	}
	if _, _, err := Clean("a\x00b"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Clean(NUL) = %v; want invalid argument", err)
	}
}

// openRoot is a volume root in a temporary directory, with a file outside
// it that no operation may reach.
func openRoot(t *testing.T) (*os.Root, string) {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "secret"), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return root, dir
}

func TestWriteReadStat(t *testing.T) {
	root, dir := openRoot(t)
	e, err := WriteFile(root, "/a.txt", strings.NewReader("hello"), Owner{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "a.txt" || e.Path != "/a.txt" || e.Type != "file" || e.Size != 5 || e.Mode != DefaultFileMode || e.UID != DefaultUID || e.GID != DefaultGID {
		t.Errorf("WriteFile entry = %+v; want a.txt, file, 5 bytes, 0666, 1000:1000", e)
	}
	// Without force an existing file is a conflict, as on E2B.
	if _, err := WriteFile(root, "/a.txt", strings.NewReader("x"), Owner{}, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("WriteFile(existing, no force) = %v; want conflict", err)
	}
	mode, uid := 0o640, 0
	if e, err = WriteFile(root, "/a.txt", strings.NewReader("hi"), Owner{UID: &uid, Mode: &mode}, true); err != nil || e.Size != 2 || e.Mode != 0o640 || e.UID != 0 {
		t.Errorf("WriteFile(force) = %+v, %v; want 2 bytes, 0640, uid 0", e, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a.txt")); string(b) != "hi" {
		t.Errorf("file = %q; want hi", b)
	}
	if _, err := WriteFile(root, "/x/y/z.txt", strings.NewReader("deep"), Owner{}, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("WriteFile(missing parent, no force) = %v; want not found", err)
	}
	if _, err := WriteFile(root, "/x/y/z.txt", strings.NewReader("deep"), Owner{}, true); err != nil {
		t.Errorf("WriteFile(missing parent, force) = %v", err)
	}
	if st, err := Stat(root, "/x/y"); err != nil || st.Type != "directory" || st.UID != DefaultUID {
		t.Errorf("Stat(made parent) = %+v, %v; want a directory of 1000", st, err)
	}
	f, e, err := OpenFile(root, "x/y/z.txt")
	if err != nil || e.Size != 4 {
		t.Fatalf("OpenFile = %+v, %v", e, err)
	}
	f.Close()
	if _, err := Stat(root, "/nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stat(missing) = %v; want not found", err)
	}
	if _, _, err := OpenFile(root, "/x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("OpenFile(dir) = %v; want invalid argument", err)
	}
	if _, err := Stat(root, "/a.txt/sub"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Stat(through a file) = %v; want invalid argument (E2B's 400)", err)
	}
}

// A sandbox's root can put any symlink or FIFO in a volume it mounts: the
// content API must neither leave the volume nor hang on a FIFO.
func TestHostileEntries(t *testing.T) {
	root, dir := openRoot(t)
	for name, target := range map[string]string{"abs": "/etc/passwd", "up": "../secret", "dirup": ".."} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/abs", "/up", "/dirup/secret"} {
		if f, _, err := OpenFile(root, p); err == nil {
			f.Close()
			t.Errorf("OpenFile(%s) succeeded; want refused", p)
		}
		if _, err := WriteFile(root, p, strings.NewReader("x"), Owner{}, true); err == nil {
			t.Errorf("WriteFile(%s) succeeded; want refused", p)
		}
	}
	if _, err := MakeDir(root, "/dirup/new", Owner{}, true); err == nil {
		t.Error("MakeDir through a symlink out of the volume succeeded")
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(dir), "secret")); string(b) != "host" {
		t.Errorf("the host file outside the volume is now %q", b)
	}
	if st, err := Stat(root, "/up"); err != nil || st.Type != "symlink" || st.Target != "../secret" {
		t.Errorf("Stat(symlink) = %+v, %v; want a symlink to ../secret", st, err)
	}
	if _, _, err := OpenFile(root, "/fifo"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("OpenFile(fifo) = %v; want invalid argument (and no hang)", err)
	}
	if _, err := WriteFile(root, "/fifo", strings.NewReader("x"), Owner{}, true); err == nil {
		t.Error("WriteFile(fifo) succeeded; want refused")
	}
	// Removing a symlink removes the link, not its target.
	if err := Remove(root, "/up"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "secret")); err != nil {
		t.Errorf("Remove(symlink) removed its target: %v", err)
	}
}

func TestMakeDirListRemove(t *testing.T) {
	root, _ := openRoot(t)
	if _, err := MakeDir(root, "/a/b", Owner{}, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("MakeDir(no parent) = %v; want not found", err)
	}
	e, err := MakeDir(root, "/a/b", Owner{}, true)
	if err != nil || e.Type != "directory" || e.Mode != DefaultDirMode {
		t.Fatalf("MakeDir(force) = %+v, %v", e, err)
	}
	if _, err := MakeDir(root, "/a/b", Owner{}, true); err != nil {
		t.Errorf("MakeDir(existing, force) = %v; want nil", err)
	}
	if _, err := MakeDir(root, "/a/b", Owner{}, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("MakeDir(existing) = %v; want conflict", err)
	}
	if _, err := WriteFile(root, "/a/b/f", strings.NewReader("1"), Owner{}, false); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		depth int
		want  []string
	}{{0, []string{"/a"}}, {1, []string{"/a"}}, {3, []string{"/a", "/a/b", "/a/b/f"}}} {
		es, err := List(root, "/", tc.depth)
		var got []string
		for _, e := range es {
			got = append(got, e.Path)
		}
		if err != nil || strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("List(/, %d) = %v, %v; want %v", tc.depth, got, err, tc.want)
		}
	}
	if _, err := List(root, "/", MaxListDepth+1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("List(depth 11) = %v; want invalid argument", err)
	}
	if _, err := List(root, "/a/b/f", 1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("List(file) = %v; want invalid argument", err)
	}
	mode, gid := 0o700, 5
	if e, err := Update(root, "/a", Owner{GID: &gid, Mode: &mode}); err != nil || e.Mode != 0o700 || e.GID != 5 || e.UID != DefaultUID {
		t.Errorf("Update = %+v, %v; want 0700, gid 5, uid kept", e, err)
	}
	bad := 70000
	if _, err := Update(root, "/a", Owner{UID: &bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Update(uid 70000) = %v; want invalid argument", err)
	}
	if err := Remove(root, "/"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Remove(/) = %v; want invalid argument", err)
	}
	if err := Remove(root, "/a"); err != nil {
		t.Fatal(err)
	}
	if err := Remove(root, "/a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Remove(removed) = %v; want not found", err)
	}
}

// A full volume is ErrNoSpace (507), not a 500.
func TestWriteFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	_, err = WriteFile(root, "/big", strings.NewReader(strings.Repeat("x", 1<<20)), Owner{}, false)
	if !errors.Is(err, errdefs.ErrNoSpace) {
		t.Errorf("WriteFile(1 MiB into 64 KiB) = %v; want ErrNoSpace", err)
	}
	if _, err := root.Stat("big"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed write left its file: %v", err)
	}
}
