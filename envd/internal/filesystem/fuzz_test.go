package filesystem

import (
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
)

// FuzzListDir throws arbitrary paths, users and depths at ListDir and Stat
// (called in process, without HTTP, to run fast): nothing may panic, errors
// must carry one of the codes clients branch on, and every answer must be
// marshalable JSON with entries below the listed directory.
func FuzzListDir(f *testing.F) {
	agenttest.InProcessOnly(f, "calls ListDir and Stat in process, without HTTP")
	if os.Geteuid() != 0 {
		f.Skip("needs root")
	}
	dir, err := filepath.EvalSymlinks(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range []string{"a/b/c/d", "a/x.txt", "bad\xffname/f", "e/f"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o644); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink(".", filepath.Join(dir, "a", "loop")); err != nil {
		f.Fatal(err)
	}
	defaults := execctx.New("root")
	defaults.SetWorkdir(dir)
	s := New(slog.New(slog.NewTextHandler(io.Discard, nil)), defaults)
	f.Cleanup(s.Close)

	for _, seed := range []struct {
		path  string
		user  string
		depth uint32
	}{
		{"", "", 0},
		{dir, "root", math.MaxUint32},
		{dir + "/a", "nobody", 3},
		{dir + "/a/x.txt", "root", 1},
		{dir + "/a/loop/loop/loop", "root", 100},
		{"~", "root", 1},
		{"~nobody", "root", 1},
		{"~/../../..", "root", 1},
		{"relative/../..", "nobody", 2},
		{"a\x00b", "root", 1},
		{"\xff\xfe", "root", 1},
		{strings.Repeat("x/", 3000), "root", 1},
		{dir, "no-such-user", 1},
		{dir, "", 1},
		{dir, "\xff:", 1},
	} {
		f.Add(seed.path, seed.user, seed.depth)
	}

	f.Fuzz(func(t *testing.T, path, user string, depth uint32) {
		// Outside the fixture tree, stay shallow: listing / to unlimited
		// depth is legal but would make each run walk the whole machine.
		listReq := request(&filesystem.ListDirRequest{Path: path}, user)
		resolved, _, _ := s.resolve(listReq.Header(), path)
		if resolved != dir && !strings.HasPrefix(resolved, dir+"/") {
			depth %= 2
		}
		listReq.Msg.Depth = depth
		list, err := s.ListDir(t.Context(), listReq)
		checkFuzzResult(t, "ListDir", err)
		if err == nil {
			for _, en := range list.Msg.GetEntries() {
				if !strings.HasPrefix(en.GetPath(), resolved) || !utf8.ValidString(en.GetPath()) {
					t.Errorf("ListDir(%q) entry %q is not a valid path below %q", path, en.GetPath(), resolved)
				}
			}
			if _, err := protojson.Marshal(list.Msg); err != nil {
				t.Errorf("ListDir(%q) answer does not marshal: %v", path, err)
			}
		}
		stat, err := s.Stat(t.Context(), request(&filesystem.StatRequest{Path: path}, user))
		checkFuzzResult(t, "Stat", err)
		if err == nil {
			if _, err := protojson.Marshal(stat.Msg); err != nil {
				t.Errorf("Stat(%q) answer does not marshal: %v", path, err)
			}
		}
	})
}

func checkFuzzResult(t *testing.T, rpc string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	switch connect.CodeOf(err) {
	case connect.CodeNotFound, connect.CodeInvalidArgument, connect.CodeUnauthenticated, connect.CodePermissionDenied:
	default:
		t.Errorf("%s: unexpected %v", rpc, err)
	}
}
