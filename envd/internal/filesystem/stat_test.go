package filesystem

import (
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
)

func TestStat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := tempDir(t)
	writeFile(t, filepath.Join(dir, "f.txt"), "test")
	e.setWorkdir(t, dir)

	cases := []struct {
		name, path, user string
		wantPath         string
		wantType         filesystem.FileType
		wantCode         connect.Code // 0: success
	}{
		{"absolute file", filepath.Join(dir, "f.txt"), "root", filepath.Join(dir, "f.txt"), filesystem.FileType_FILE_TYPE_FILE, 0},
		{"default user", filepath.Join(dir, "f.txt"), "", filepath.Join(dir, "f.txt"), filesystem.FileType_FILE_TYPE_FILE, 0},
		{"empty path is the default workdir", "", "root", dir, filesystem.FileType_FILE_TYPE_DIRECTORY, 0},
		{"tilde is home", "~", "root", "/root", filesystem.FileType_FILE_TYPE_DIRECTORY, 0},
		{"unclean path", dir + "/./x/../f.txt", "root", filepath.Join(dir, "f.txt"), filesystem.FileType_FILE_TYPE_FILE, 0},
		{"missing", filepath.Join(dir, "missing"), "root", "", 0, connect.CodeNotFound},
		// Relative paths start at the user's home; nobody's is /nonexistent.
		{"relative to home", "x", "nobody", "", 0, connect.CodeNotFound},
		{"below a file", filepath.Join(dir, "f.txt", "x"), "root", "", 0, connect.CodeInvalidArgument},
	}
	for _, c := range cases {
		resp, err := e.client.Stat(ctx, request(&filesystem.StatRequest{Path: c.path}, c.user))
		if c.wantCode != 0 {
			wantCode(t, c.name, err, c.wantCode)
			continue
		}
		if err != nil {
			t.Errorf("%s: Stat(%q): %v", c.name, c.path, err)
			continue
		}
		if got := resp.Msg.GetEntry(); got.GetPath() != c.wantPath || got.GetType() != c.wantType {
			t.Errorf("%s: Stat(%q) = %s, %v; want %s, %v", c.name, c.path, got.GetPath(), got.GetType(), c.wantPath, c.wantType)
		}
	}
}
