package filesystem

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
)

func TestEntryInfo(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root for ownership")
	}
	dir := tempDir(t)
	file := filepath.Join(dir, "file.txt")
	writeFile(t, file, "Hello, World!")
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	if err := os.Chtimes(file, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(file, "user.e2b.k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(file, "user.other", []byte("ignored"), 0); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	mustSymlink(t, "file.txt", filepath.Join(dir, "link-file")) // relative target
	mustSymlink(t, sub, filepath.Join(dir, "link-dir"))
	mustSymlink(t, "nowhere", filepath.Join(dir, "dangling"))
	mustSymlink(t, "loop", filepath.Join(dir, "loop"))
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	nobody := filepath.Join(dir, "nobody.txt")
	writeFile(t, nobody, "")
	if err := os.Chown(nobody, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	numeric := filepath.Join(dir, "numeric.txt")
	writeFile(t, numeric, "")
	if err := os.Chown(numeric, 54321, 54322); err != nil { // no such user or group
		t.Fatal(err)
	}

	type want struct {
		typ         filesystem.FileType
		size        int64 // -1: don't check
		mode        uint32
		permissions string
		owner       string
		group       string
		target      *string
		metadata    map[string]string
	}
	str := func(s string) *string { return &s }
	cases := []struct {
		path string
		want want
	}{
		{file, want{filesystem.FileType_FILE_TYPE_FILE, 13, 0o644, "-rw-r--r--", "root", "root", nil, map[string]string{"k": "v"}}},
		{sub, want{filesystem.FileType_FILE_TYPE_DIRECTORY, -1, 0o755, "drwxr-xr-x", "root", "root", nil, nil}},
		// A link reports its target's type and mode (as E2B does) but its own
		// size and permission string, and the resolved absolute target.
		{filepath.Join(dir, "link-file"), want{filesystem.FileType_FILE_TYPE_FILE, int64(len("file.txt")), 0o644, "Lrwxrwxrwx", "root", "root", str(file), nil}},
		{filepath.Join(dir, "link-dir"), want{filesystem.FileType_FILE_TYPE_DIRECTORY, int64(len(sub)), 0o755, "Lrwxrwxrwx", "root", "root", str(sub), nil}},
		{filepath.Join(dir, "dangling"), want{filesystem.FileType_FILE_TYPE_SYMLINK, 7, 0, "Lrwxrwxrwx", "root", "root", str(filepath.Join(dir, "nowhere")), nil}},
		{filepath.Join(dir, "loop"), want{filesystem.FileType_FILE_TYPE_SYMLINK, 4, 0, "Lrwxrwxrwx", "root", "root", str(filepath.Join(dir, "loop")), nil}},
		{fifo, want{filesystem.FileType_FILE_TYPE_UNSPECIFIED, 0, 0o600, "prw-------", "root", "root", nil, nil}},
		{nobody, want{filesystem.FileType_FILE_TYPE_FILE, 0, 0o644, "-rw-r--r--", "nobody", "nogroup", nil, nil}},
		{numeric, want{filesystem.FileType_FILE_TYPE_FILE, 0, 0o644, "-rw-r--r--", "54321", "54322", nil, nil}},
	}
	for _, c := range cases {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			t.Parallel()
			got, err := EntryInfo(c.path)
			if err != nil {
				t.Fatalf("EntryInfo(%s): %v", c.path, err)
			}
			w := c.want
			if got.GetName() != filepath.Base(c.path) || got.GetPath() != c.path {
				t.Errorf("name, path = %q, %q; want %q, %q", got.GetName(), got.GetPath(), filepath.Base(c.path), c.path)
			}
			if got.GetType() != w.typ {
				t.Errorf("type = %v; want %v", got.GetType(), w.typ)
			}
			if w.size >= 0 && got.GetSize() != w.size {
				t.Errorf("size = %d; want %d", got.GetSize(), w.size)
			}
			if got.GetMode() != w.mode || got.GetPermissions() != w.permissions {
				t.Errorf("mode, permissions = %o, %q; want %o, %q", got.GetMode(), got.GetPermissions(), w.mode, w.permissions)
			}
			if got.GetOwner() != w.owner || got.GetGroup() != w.group {
				t.Errorf("owner, group = %q, %q; want %q, %q", got.GetOwner(), got.GetGroup(), w.owner, w.group)
			}
			switch {
			case w.target == nil && got.SymlinkTarget != nil:
				t.Errorf("symlink target = %q; want none", got.GetSymlinkTarget())
			case w.target != nil && got.GetSymlinkTarget() != *w.target:
				t.Errorf("symlink target = %q; want %q", got.GetSymlinkTarget(), *w.target)
			}
			if len(got.GetMetadata()) != len(w.metadata) {
				t.Errorf("metadata = %v; want %v", got.GetMetadata(), w.metadata)
			}
			for k, v := range w.metadata {
				if got.GetMetadata()[k] != v {
					t.Errorf("metadata[%q] = %q; want %q", k, got.GetMetadata()[k], v)
				}
			}
			if got.GetModifiedTime() == nil {
				t.Error("no modified time")
			}
		})
	}

	got, err := EntryInfo(file)
	if err != nil {
		t.Fatal(err)
	}
	if mt := got.GetModifiedTime().AsTime(); !mt.Equal(mtime) {
		t.Errorf("modified time = %v; want %v", mt, mtime)
	}
}

func TestEntryInfoMissing(t *testing.T) {
	t.Parallel()
	_, err := EntryInfo(filepath.Join(t.TempDir(), "missing"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("EntryInfo(missing) = %v; want fs.ErrNotExist", err)
	}
}

// TestEntryInfoNotUTF8 checks that names and metadata that are not UTF-8, legal
// on Linux, still produce an entry protobuf can marshal.
func TestEntryInfoNotUTF8(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	p := filepath.Join(dir, "bad\xff\xfename")
	writeFile(t, p, "x")
	if err := unix.Setxattr(p, "user.e2b.bin", []byte{0xff, 0x00, 0xfe}, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "user.e2b.ok", []byte("fine"), 0); err != nil {
		t.Fatal(err)
	}
	e, err := EntryInfo(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proto.Marshal(e); err != nil {
		t.Errorf("proto.Marshal: %v", err)
	}
	if _, err := protojson.Marshal(e); err != nil {
		t.Errorf("protojson.Marshal: %v", err)
	}
	if _, ok := e.GetMetadata()["bin"]; ok || e.GetMetadata()["ok"] != "fine" {
		t.Errorf("metadata = %q; want only ok=fine", e.GetMetadata())
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
