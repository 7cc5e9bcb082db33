package filesystem

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
)

func TestRemove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := sharedDir(t)
	writeFile(t, filepath.Join(dir, "file"), "x")
	writeFile(t, filepath.Join(dir, "rootfile"), "x")
	writeFile(t, filepath.Join(dir, "tree", "a", "b", "c"), "x")
	writeFile(t, filepath.Join(dir, "target"), "x")
	mustSymlink(t, filepath.Join(dir, "target"), filepath.Join(dir, "link"))

	cases := []struct {
		name, path, user string
	}{
		{"file", "file", "root"},
		// With the user's rights, as rm would: root's file, but in a
		// directory open to all.
		{"root's file as nobody", "rootfile", "nobody"},
		{"directory tree", "tree", "root"},
		{"symlink, not its target", "link", "root"},
		{"missing path succeeds", "missing", "root"},
	}
	for _, c := range cases {
		p := filepath.Join(dir, c.path)
		if _, err := e.client.Remove(ctx, request(&filesystem.RemoveRequest{Path: p}, c.user)); err != nil {
			t.Errorf("%s: Remove(%s): %v", c.name, p, err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %s still there (%v)", c.name, p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "target")); err != nil {
		t.Errorf("removing the link removed its target: %v", err)
	}

	// Not from root's own directory: that needs root's rights.
	guarded := filepath.Join(dir, "guarded", "f")
	writeFile(t, guarded, "x")
	_, err := e.client.Remove(ctx, request(&filesystem.RemoveRequest{Path: guarded}, "nobody"))
	wantCode(t, "Remove from root's directory as nobody", err, connect.CodePermissionDenied)
	if _, err := os.Stat(guarded); err != nil {
		t.Errorf("nobody removed a file from root's directory (stat err %v)", err)
	}

	writeFile(t, filepath.Join(dir, "plain"), "x")
	_, err = e.client.Remove(ctx, request(&filesystem.RemoveRequest{Path: filepath.Join(dir, "plain", "below")}, "root"))
	wantCode(t, "Remove below a file", err, connect.CodeInvalidArgument)
}
