package filesystem

import (
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
)

// TestListDirDepth mirrors E2B's SDK list test: lexical order, parents before
// children, depth 0 meaning 1, and depth beyond the tree being harmless.
func TestListDirDepth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := tempDir(t)
	for _, d := range []string{"subdir1/subdir1_1", "subdir1/subdir1_2", "subdir2/subdir2_1", "subdir2/subdir2_2"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "file1.txt"), "Hello, world!")

	level1 := []string{"file1.txt", "subdir1", "subdir2"}
	level2 := []string{"file1.txt", "subdir1", "subdir1/subdir1_1", "subdir1/subdir1_2", "subdir2", "subdir2/subdir2_1", "subdir2/subdir2_2"}
	cases := []struct {
		depth uint32
		want  []string
	}{
		{0, level1},
		{1, level1},
		{2, level2},
		{3, level2},
		{math.MaxUint32, level2},
	}
	for _, c := range cases {
		resp, err := e.client.ListDir(ctx, request(&filesystem.ListDirRequest{Path: dir, Depth: c.depth}, "root"))
		if err != nil {
			t.Fatalf("ListDir(depth %d): %v", c.depth, err)
		}
		var got []string
		for _, en := range resp.Msg.GetEntries() {
			rel, _ := filepath.Rel(dir, en.GetPath())
			got = append(got, rel)
			if en.GetName() != filepath.Base(en.GetPath()) {
				t.Errorf("entry %s named %q", en.GetPath(), en.GetName())
			}
			wantType := filesystem.FileType_FILE_TYPE_DIRECTORY
			if en.GetName() == "file1.txt" {
				wantType = filesystem.FileType_FILE_TYPE_FILE
			}
			if en.GetType() != wantType {
				t.Errorf("entry %s type %v; want %v", rel, en.GetType(), wantType)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("ListDir(depth %d) = %q; want %q", c.depth, got, c.want)
		}
	}
}

// TestListDirSymlinks: links are listed (with their target) but never walked
// into, so a link cycle is harmless; a link to a directory can itself be
// listed, with entries reported under the link's path.
func TestListDirSymlinks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := tempDir(t)
	writeFile(t, filepath.Join(dir, "real", "inner.txt"), "x")
	mustSymlink(t, filepath.Join(dir, "real"), filepath.Join(dir, "link"))
	mustSymlink(t, ".", filepath.Join(dir, "real", "self")) // cycle
	mustSymlink(t, "gone", filepath.Join(dir, "dangling"))

	resp, err := e.client.ListDir(ctx, request(&filesystem.ListDirRequest{Path: dir, Depth: 10}, "root"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*filesystem.EntryInfo{}
	for _, en := range resp.Msg.GetEntries() {
		rel, _ := filepath.Rel(dir, en.GetPath())
		got[rel] = en
	}
	want := []string{"dangling", "link", "real", "real/inner.txt", "real/self"}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
		t.Fatalf("entries %q; want %q", keys, want)
	}
	if l := got["link"]; l.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || l.GetSymlinkTarget() != filepath.Join(dir, "real") {
		t.Errorf("link: type %v target %q; want directory -> %s", l.GetType(), l.GetSymlinkTarget(), filepath.Join(dir, "real"))
	}
	if d := got["dangling"]; d.GetType() != filesystem.FileType_FILE_TYPE_SYMLINK {
		t.Errorf("dangling: type %v; want symlink", d.GetType())
	}

	// Listing through the link reports paths under the link.
	resp, err = e.client.ListDir(ctx, request(&filesystem.ListDirRequest{Path: filepath.Join(dir, "link")}, "root"))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, en := range resp.Msg.GetEntries() {
		paths = append(paths, en.GetPath())
	}
	if want := []string{filepath.Join(dir, "link", "inner.txt"), filepath.Join(dir, "link", "self")}; !slices.Equal(paths, want) {
		t.Errorf("ListDir(link) paths %q; want %q", paths, want)
	}
}

func TestListDirErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := tempDir(t)
	writeFile(t, filepath.Join(dir, "file"), "x")
	mustSymlink(t, "file", filepath.Join(dir, "link-to-file"))

	cases := []struct {
		name, path string
		want       connect.Code
	}{
		{"missing", filepath.Join(dir, "missing"), connect.CodeNotFound},
		{"file", filepath.Join(dir, "file"), connect.CodeInvalidArgument},
		{"link to a file", filepath.Join(dir, "link-to-file"), connect.CodeInvalidArgument},
	}
	for _, c := range cases {
		_, err := e.client.ListDir(ctx, request(&filesystem.ListDirRequest{Path: c.path}, "root"))
		wantCode(t, c.name, err, c.want)
	}

	// An empty path lists the default workdir.
	e.setWorkdir(t, dir)
	resp, err := e.client.ListDir(ctx, request(&filesystem.ListDirRequest{}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.Msg.GetEntries()); n != 2 {
		t.Errorf("ListDir(\"\") = %d entries; want the 2 in the workdir", n)
	}
}

func TestMakeDir(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := sharedDir(t)
	writeFile(t, filepath.Join(dir, "file"), "x")
	mustSymlink(t, "nowhere", filepath.Join(dir, "dangling"))
	if err := os.Mkdir(filepath.Join(dir, "exists"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustSymlink(t, "exists", filepath.Join(dir, "link-to-dir"))

	// Created directories, parents included, belong to the request user.
	for _, c := range []struct{ user, path string }{{"nobody", "a/b/c"}, {"root", "r/s"}} {
		p := filepath.Join(dir, c.path)
		resp, err := e.client.MakeDir(ctx, request(&filesystem.MakeDirRequest{Path: p}, c.user))
		if err != nil {
			t.Fatalf("MakeDir(%s) as %s: %v", p, c.user, err)
		}
		en := resp.Msg.GetEntry()
		if en.GetPath() != p || en.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || en.GetOwner() != c.user {
			t.Errorf("MakeDir(%s) entry = %s %v owner %s; want directory owned by %s", p, en.GetPath(), en.GetType(), en.GetOwner(), c.user)
		}
		for d := p; d != dir; d = filepath.Dir(d) {
			fi, err := os.Stat(d)
			if err != nil {
				t.Fatal(err)
			}
			uid := fi.Sys().(*syscall.Stat_t).Uid
			if want := map[string]uint32{"nobody": 65534, "root": 0}[c.user]; uid != want {
				t.Errorf("%s owned by uid %d; want %d", d, uid, want)
			}
		}
	}
	if fi, _ := os.Stat(dir); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("MakeDir changed the owner of an existing parent")
	}

	cases := []struct {
		name, path string
		want       connect.Code
	}{
		{"existing directory", "exists", connect.CodeAlreadyExists},
		{"symlink to a directory", "link-to-dir", connect.CodeAlreadyExists},
		{"existing file", "file", connect.CodeInvalidArgument},
		{"dangling symlink", "dangling", connect.CodeInvalidArgument},
		{"below a file", "file/sub", connect.CodeInvalidArgument},
	}
	for _, c := range cases {
		_, err := e.client.MakeDir(ctx, request(&filesystem.MakeDirRequest{Path: filepath.Join(dir, c.path)}, "root"))
		wantCode(t, c.name, err, c.want)
	}
}
