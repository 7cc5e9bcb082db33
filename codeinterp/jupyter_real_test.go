package codeinterp

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// realVenv is a Python venv with the template's jupyter-server, ipykernel
// and bash_kernel: CODEINTERP_TEST_VENV names one, or with
// SANDBOXD_E2E_PYPI=1 the test makes one (pip from PyPI, a minute or two,
// once: it is kept in the user's cache directory).
func realVenv(t testing.TB) string {
	t.Helper()
	if v := os.Getenv("CODEINTERP_TEST_VENV"); v != "" {
		return v
	}
	if os.Getenv("SANDBOXD_E2E_PYPI") != "1" {
		t.Skip("needs a Python venv with jupyter-server, ipykernel and bash_kernel: set CODEINTERP_TEST_VENV, or SANDBOXD_E2E_PYPI=1 to make one from PyPI")
	}
	var pkgs []string
	for _, p := range Packages {
		if name, _, _ := strings.Cut(p, "=="); name == "jupyter-server" || name == "ipykernel" || name == "bash_kernel" {
			pkgs = append(pkgs, p)
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(strings.Join(pkgs, " ")))
	venv := filepath.Join(cache, "sandboxd-test", fmt.Sprintf("codeinterp-venv-%x", sum[:6]))
	if _, err := os.Stat(filepath.Join(venv, ".complete")); err == nil {
		return venv
	}
	_ = os.RemoveAll(venv)
	for _, argv := range [][]string{
		{"python3", "-m", "venv", venv},
		append([]string{venv + "/bin/pip", "install", "--disable-pip-version-check", "--progress-bar", "off"}, pkgs...),
		{venv + "/bin/python", "-m", "bash_kernel.install", "--sys-prefix"},
	} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(venv, ".complete"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return venv
}

// startJupyter runs a Jupyter Server from venv as the template's start.sh
// does (its config file, no token, loopback), on a free port, and returns
// its URL and runtime directory.
func startJupyter(t testing.TB, venv string) (string, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := t.TempDir()
	runtime := filepath.Join(dir, "runtime")
	config, err := filepath.Abs("assets/jupyter_server_config.py")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(venv+"/bin/jupyter", "server", "--config="+config,
		"--ServerApp.ip=127.0.0.1", "--ServerApp.port="+strconv.Itoa(port), "--ServerApp.port_retries=0",
		"--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
		"--ServerApp.root_dir=/", "--ServerApp.open_browser=False", "--allow-root")
	cmd.Env = append(os.Environ(), "JUPYTER_RUNTIME_DIR="+runtime, "JUPYTER_PLATFORM_DIRS=1",
		"JUPYTER_CONFIG_DIR="+filepath.Join(dir, "config"), "JUPYTER_DATA_DIR="+filepath.Join(dir, "data"),
		"IPYTHONDIR="+filepath.Join(dir, "ipython"))
	cmd.Dir = dir
	log, err := os.Create(filepath.Join(dir, "jupyter.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so that the kernels it started go with it;
	// killed with the test binary too (its kernels follow their parent).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		log.Close()
		if t.Failed() || testing.Verbose() {
			raw, _ := os.ReadFile(log.Name())
			t.Logf("jupyter's log:\n%s", raw)
		}
	})
	return "http://127.0.0.1:" + strconv.Itoa(port), runtime
}

// realServer is a Server on a real Jupyter Server, started, and its
// HTTP surface.
func realServer(t testing.TB, ctx context.Context) (*Server, *httptest.Server) {
	venv := realVenv(t)
	jurl, runtime := startJupyter(t, venv)
	srv, err := New(Config{Jupyter: jurl, RuntimeDir: runtime, Cwd: t.TempDir(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return srv, hs
}

// BenchmarkRealExecute is /execute of 1+1 on loopback against a real
// ipykernel: the server and the kernel, without a sandbox, proxy or SDK.
func BenchmarkRealExecute(b *testing.B) {
	ctx := context.Background()
	_, hs := realServer(b, ctx)
	for range 5 {
		runCode(b, ctx, hs.URL, map[string]any{"code": "1+1"})
	}
	for b.Loop() {
		if got := summary(runCode(b, ctx, hs.URL, map[string]any{"code": "1+1"})); got != "result:2 end" {
			b.Fatal(got)
		}
	}
}

// runCode posts code to /execute and returns its lines.
func runCode(t testing.TB, ctx context.Context, url string, req map[string]any) []Line {
	t.Helper()
	body, _ := json.Marshal(req)
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/execute", strings.NewReader(string(body)))
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("/execute: %s: %s", resp.Status, raw)
	}
	var lines []Line
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 128<<20)
	for sc.Scan() {
		var l Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
	return lines
}

// summary is what a test compares of an execution's lines: the results'
// text, stdout, stderr and the error's name, in order.
func summary(lines []Line) string {
	var b strings.Builder
	for _, l := range lines {
		switch l["type"] {
		case typeResult:
			fmt.Fprintf(&b, "result:%v ", l["text"])
		case typeStdout, typeStderr:
			fmt.Fprintf(&b, "%v:%q ", l["type"], l["text"])
		case typeError:
			fmt.Fprintf(&b, "error:%v ", l["name"])
		case typeEnd:
			b.WriteString("end")
		}
	}
	return b.String()
}

// The server against a real Jupyter Server and real kernels, over ZeroMQ:
// results, state, env vars, an interrupt, a kernel that dies, 50 MB of
// output, Bash, a context's restart.
func TestRealKernels(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, hs := realServer(t, ctx)

	for _, tc := range []struct {
		name string
		req  map[string]any
		want string
	}{
		{"result", map[string]any{"code": "1+1"}, "result:2 end"},
		{"state and stdout", map[string]any{"code": "x = 41\nprint('x is', x)\nx + 1"}, `stdout:"x is 41\n" result:42 end`},
		{"call env vars", map[string]any{"code": "import os; os.environ['SBX_CALL']", "env_vars": map[string]string{"SBX_CALL": "yes"}}, "result:yes end"},
		{"call env vars undone", map[string]any{"code": "os.environ.get('SBX_CALL', 'unset')"}, "result:unset end"},
		{"error", map[string]any{"code": "1/0"}, "error:ZeroDivisionError end"},
	} {
		if got := summary(runCode(t, ctx, hs.URL, tc.req)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}

	// A client that leaves interrupts the kernel: the next call runs.
	lctx, lcancel := context.WithTimeout(ctx, time.Second)
	runCode(t, lctx, hs.URL, map[string]any{"code": "while True: pass"})
	lcancel()
	if got := summary(runCode(t, ctx, hs.URL, map[string]any{"code": "x"})); got != "result:41 end" {
		t.Errorf("after an interrupt: %s, want the state kept", got)
	}

	// A kernel that dies is an error; the next call gets a fresh one.
	if got := summary(runCode(t, ctx, hs.URL, map[string]any{"code": "import os; os._exit(1)"})); got != "error:DeadKernelError end" {
		t.Errorf("a dying kernel: %s", got)
	}
	if got := summary(runCode(t, ctx, hs.URL, map[string]any{"code": "'x' in dir(), 1+1"})); got != "result:(False, 2) end" {
		t.Errorf("after the kernel died: %s, want a fresh kernel", got)
	}

	// 50 MB of output, in one message.
	var n int
	for _, l := range runCode(t, ctx, hs.URL, map[string]any{"code": "print('x' * 50_000_000)"}) {
		if l["type"] == typeStdout {
			n += len(l["text"].(string))
		}
	}
	if n != 50_000_001 {
		t.Errorf("50 MB print: %d bytes of stdout", n)
	}

	if srv.supported("bash") {
		if got := summary(runCode(t, ctx, hs.URL, map[string]any{"code": "echo hi | tr a-z A-Z", "language": "bash"})); got != `stdout:"HI\n" end` {
			t.Errorf("bash: %s", got)
		}
	} else {
		t.Error("no bash kernel in the venv")
	}

	// Deno's kernel speaks ZeroMQ through another implementation (Rust's
	// zeromq crate): where the venv has it, as the template does.
	if srv.supported("javascript") {
		for _, tc := range []struct{ code, want string }{
			{`console.log("to", "stdout"); "a" + "b"`, `stdout:"to stdout\n" result:ab end`},
			{`throw new TypeError("bad input")`, "error:TypeError end"},
			{`const n: number = 41; n + 1`, "result:42 end"},
		} {
			if got := summary(runCode(t, ctx, hs.URL, map[string]any{"code": tc.code, "language": "ts"})); got != tc.want {
				t.Errorf("deno: %s: %s, want %s", tc.code, got, tc.want)
			}
		}
	} else {
		t.Log("no deno kernel in the venv: JavaScript left out")
	}

	// A context of its own, restarted: its state is gone, the default
	// context's is not.
	resp, err := http.Post(hs.URL+"/contexts", "application/json", strings.NewReader(`{"language":"python"}`))
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ ID string }
	_ = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	runCode(t, ctx, hs.URL, map[string]any{"code": "y = 1", "context_id": c.ID})
	if resp, err = http.Post(hs.URL+"/contexts/"+c.ID+"/restart", "application/json", nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("restart: %v %v", resp, err)
	}
	resp.Body.Close()
	if got := summary(runCode(t, ctx, hs.URL, map[string]any{"code": "'y' in dir()", "context_id": c.ID})); got != "result:False end" {
		t.Errorf("after a restart: %s", got)
	}
	if got := summary(runCode(t, ctx, hs.URL, map[string]any{"code": "1+2"})); got != "result:3 end" {
		t.Errorf("the default context: %s", got)
	}
}
