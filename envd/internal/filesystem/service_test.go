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
	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
)

// env is one service behind a real HTTP server, reached through the
// generated client speaking Connect JSON, as E2B's SDKs do; or, with
// ENVD_TEST_BINARY set, an agent binary serving it (package agenttest).
type env struct {
	s        *Service          // in process only: use service
	defaults *execctx.Defaults // in process only: use setWorkdir
	agent    *agenttest.Agent  // against a binary only
	client   filesystemconnect.FilesystemClient
	url      string
	http     *http.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("envd's filesystem service runs as root; these tests need root")
	}
	if agenttest.Enabled() {
		a := agenttest.Start(t, agenttest.Options{DefaultUser: "root"})
		hc := &http.Client{Transport: &http.Transport{}}
		t.Cleanup(hc.CloseIdleConnections)
		return &env{
			agent:  a,
			client: filesystemconnect.NewFilesystemClient(hc, a.URL, connect.WithProtoJSON()),
			url:    a.URL,
			http:   hc,
		}
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

// service is the in-process Service, for what a test does to its Go
// internals; against a binary, which has none, it skips t (why says what
// the test needs them for).
func (e *env) service(t *testing.T, why string) *Service {
	t.Helper()
	agenttest.InProcessOnly(t, why)
	return e.s
}

// setWorkdir sets the default working directory: in process on the
// defaults, against a binary through POST /init, as sandboxd does.
func (e *env) setWorkdir(t *testing.T, dir string) {
	t.Helper()
	if e.agent != nil {
		e.agent.Init(t, map[string]any{"defaultWorkdir": dir})
		return
	}
	e.defaults.SetWorkdir(dir)
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

// sharedDir is a tempDir every user may write to, with parents every user
// may search: requests run with the request user's rights, and a test's
// temporary directories are root's 0700.
func sharedDir(t *testing.T) string {
	t.Helper()
	d := tempDir(t)
	if err := os.Chmod(d, 0o777); err != nil {
		t.Fatal(err)
	}
	for p := filepath.Dir(d); strings.HasPrefix(p, os.TempDir()+"/"); p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, fi.Mode().Perm()|0o055); err != nil {
			t.Fatal(err)
		}
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

// TestRPCsRunAsUser: every RPC works with the request user's rights, as a
// shell of theirs would: nobody cannot look into, list, watch, create in,
// move out of or remove from root's private directories.
func TestRPCsRunAsUser(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := sharedDir(t)
	private := filepath.Join(dir, "private") // like /root: root's, 0700
	writeFile(t, filepath.Join(private, "secret"), "x")
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	system := filepath.Join(dir, "system") // like /etc: root's, 0755
	writeFile(t, filepath.Join(system, "conf"), "x")
	secret, conf := filepath.Join(private, "secret"), filepath.Join(system, "conf")

	calls := []struct {
		name string
		call func(user string) error
	}{
		{"Stat", func(u string) error {
			_, err := e.client.Stat(ctx, request(&filesystem.StatRequest{Path: secret}, u))
			return err
		}},
		{"ListDir", func(u string) error {
			_, err := e.client.ListDir(ctx, request(&filesystem.ListDirRequest{Path: private}, u))
			return err
		}},
		{"CreateWatcher", func(u string) error {
			resp, err := e.client.CreateWatcher(ctx, request(&filesystem.CreateWatcherRequest{Path: private}, u))
			if err == nil {
				_, _ = e.client.RemoveWatcher(ctx, request(&filesystem.RemoveWatcherRequest{WatcherId: resp.Msg.GetWatcherId()}, u))
			}
			return err
		}},
		{"MakeDir", func(u string) error {
			_, err := e.client.MakeDir(ctx, request(&filesystem.MakeDirRequest{Path: filepath.Join(system, "d-"+u)}, u))
			return err
		}},
		{"Move", func(u string) error {
			_, err := e.client.Move(ctx, request(&filesystem.MoveRequest{Source: conf, Destination: filepath.Join(dir, "conf-"+u)}, u))
			if err == nil { // put it back for the next caller
				err = os.Rename(filepath.Join(dir, "conf-"+u), conf)
			}
			return err
		}},
		{"Remove", func(u string) error {
			_, err := e.client.Remove(ctx, request(&filesystem.RemoveRequest{Path: secret}, u))
			return err
		}},
	}
	for _, c := range calls {
		wantCode(t, c.name+" as nobody", c.call("nobody"), connect.CodePermissionDenied)
		if err := c.call("root"); err != nil {
			t.Errorf("%s as root: %v", c.name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(system, "d-nobody")); !os.IsNotExist(err) {
		t.Errorf("nobody made a directory in root's directory (stat err %v)", err)
	}
}
