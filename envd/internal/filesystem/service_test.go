package filesystem

import (
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/api/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
)

// env is one service behind a real HTTP server, reached through the
// generated client speaking Connect JSON, as E2B's SDKs do.
type env struct {
	s        *Service
	defaults *execctx.Defaults
	client   filesystemconnect.FilesystemClient
	url      string
	http     *http.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("envd's filesystem service runs as root; these tests need root")
	}
	defaults := execctx.New("root")
	s := New(slog.New(slog.NewTextHandler(io.Discard, nil)), defaults)
	mux := http.NewServeMux()
	mux.Handle(s.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(s.Close) // runs first: ends open streams so srv.Close does not wait on them
	return &env{
		s:        s,
		defaults: defaults,
		client:   filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, connect.WithProtoJSON()),
		url:      srv.URL,
		http:     srv.Client(),
	}
}

// request wraps msg, choosing user the way the SDKs do (no header means the
// default user).
func request[T any](msg *T, user string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	if user != "" {
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	return r
}

// testCtx bounds a test that waits on the filesystem so a bug hangs for
// seconds, not for the whole test binary timeout. It is a guard, not an
// assertion about speed.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// tempDir is t.TempDir with symlinks resolved, so it can be compared with
// paths the service reports.
func tempDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, what string, err error, want connect.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error; want %v", what, want)
	}
	if got := connect.CodeOf(err); got != want {
		t.Fatalf("%s: code %v (%v); want %v", what, got, err, want)
	}
}

// TestUnknownUserAndBadPaths checks the identity and path errors every RPC
// shares: an unknown user is unauthenticated, a NUL byte or "~other" is
// invalid_argument.
func TestUnknownUserAndBadPaths(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := tempDir(t)

	calls := map[string]func(path, user string) error{
		"Stat": func(p, u string) error {
			_, err := e.client.Stat(ctx, request(&filesystem.StatRequest{Path: p}, u))
			return err
		},
		"ListDir": func(p, u string) error {
			_, err := e.client.ListDir(ctx, request(&filesystem.ListDirRequest{Path: p}, u))
			return err
		},
		"MakeDir": func(p, u string) error {
			_, err := e.client.MakeDir(ctx, request(&filesystem.MakeDirRequest{Path: p}, u))
			return err
		},
		"MoveSource": func(p, u string) error {
			_, err := e.client.Move(ctx, request(&filesystem.MoveRequest{Source: p, Destination: filepath.Join(dir, "dst")}, u))
			return err
		},
		"MoveDestination": func(p, u string) error {
			src := filepath.Join(dir, "src")
			writeFile(t, src, "x")
			_, err := e.client.Move(ctx, request(&filesystem.MoveRequest{Source: src, Destination: p}, u))
			return err
		},
		"Remove": func(p, u string) error {
			_, err := e.client.Remove(ctx, request(&filesystem.RemoveRequest{Path: p}, u))
			return err
		},
		"WatchDir": func(p, u string) error {
			st, err := e.client.WatchDir(ctx, request(&filesystem.WatchDirRequest{Path: p}, u))
			if err != nil {
				return err
			}
			defer st.Close()
			for st.Receive() {
			}
			return st.Err()
		},
		"CreateWatcher": func(p, u string) error {
			_, err := e.client.CreateWatcher(ctx, request(&filesystem.CreateWatcherRequest{Path: p}, u))
			return err
		},
	}
	cases := []struct {
		name, path, user string
		want             connect.Code
	}{
		{"unknown user", dir, "no-such-user-xyz", connect.CodeUnauthenticated},
		{"NUL byte", dir + "/a\x00b", "root", connect.CodeInvalidArgument},
		{"other user's home", "~nobody/x", "root", connect.CodeInvalidArgument},
	}
	for _, c := range cases {
		for rpc, call := range calls {
			wantCode(t, c.name+": "+rpc, call(c.path, c.user), c.want)
		}
	}
}

// TestWireJSON checks the bytes an SDK sees: Connect unary JSON with
// lowerCamelCase keys, int64 as a string and enums by name.
func TestWireJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := tempDir(t)
	writeFile(t, filepath.Join(dir, "f.txt"), "hello")

	body := strings.NewReader(`{"path":"` + dir + `/f.txt"}`)
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, e.url+"/filesystem.Filesystem/Stat", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Basic cm9vdDo=") // root
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	for _, want := range []string{`"size":"5"`, `"type":"FILE_TYPE_FILE"`, `"modifiedTime":"`, `"permissions":"-rw-r--r--"`, `"mode":420`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("Stat body %s lacks %s", raw, want)
		}
	}

	// A missing file is a Connect error body with HTTP 404.
	req, _ = http.NewRequestWithContext(testCtx(t), http.MethodPost, e.url+"/filesystem.Filesystem/Stat",
		strings.NewReader(`{"path":"`+dir+`/missing"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err = e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(raw), `"code":"not_found"`) {
		t.Errorf("missing file: status %d body %s; want 404 not_found", resp.StatusCode, raw)
	}
}
