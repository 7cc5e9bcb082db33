// Package agenttest lets envd's HTTP-level tests run against an agent
// binary instead of the handlers built in process, so that one set of
// assertions checks both agents (bin/envd and envd-rs):
//
//	ENVD_TEST_BINARY=/abs/path/to/envd-rs go test -count=1 ./envd/...
//
// Without the variable nothing changes: each package's fixture builds its
// handlers in process. With it, the fixture calls Start for a fresh agent
// per test, on loopback and a free port, and reaches it over the wire only.
// Tests (or parts of them) that reach into Go internals skip with
// InProcessOnly; packages that hold only unit tests of Go internals skip
// whole with Main.
package agenttest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Env names the variable that holds the agent binary's absolute path.
const Env = "ENVD_TEST_BINARY"

// Binary is the agent binary the tests run against; empty: in process.
func Binary() string { return os.Getenv(Env) }

// Enabled says whether the tests run against an agent binary.
func Enabled() bool { return Binary() != "" }

// InProcessOnly skips t when the tests run against a binary: what follows
// needs the in-process server's Go internals, which a binary does not have.
// reason says which.
func InProcessOnly(t testing.TB, reason string) {
	t.Helper()
	if Enabled() {
		t.Skip("in-process only: " + reason)
	}
}

// Main is TestMain for a package whose tests are all unit tests of Go
// internals, with nothing an agent binary serves: against a binary it runs
// none of them and says why; otherwise it runs them.
func Main(m *testing.M, reason string) {
	if Enabled() {
		fmt.Printf("agenttest: no test here runs against %s: %s\n", Binary(), reason)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Options configure an agent the way the in-process fixture configures its
// server.
type Options struct {
	DefaultUser string   // --default-user; empty: the current user
	Workdir     string   // --workdir; empty: none (the user's home)
	Disk        string   // --disk; empty: the agent's default
	Args        []string // further flags
}

// Agent is one running agent binary.
type Agent struct {
	URL string // http://127.0.0.1:PORT
	Pid int
	Dir string // the agent's working directory, a temporary one
	Log string // its stdout and stderr

	cmd   *exec.Cmd
	exit  chan struct{} // closed once the process has been waited for
	token string        // the access token Init last set
}

// startTimeout bounds the wait for a new agent's first /health answer.
const startTimeout = 15 * time.Second

// Start runs the agent binary for t, loopback only, on a free port, with
// cgroups off, in a temporary working directory. t.Cleanup stops it
// (SIGTERM, then SIGKILL) and removes its files; if t failed, its log is
// logged first.
func Start(t testing.TB, o Options) *Agent {
	t.Helper()
	bin := Binary()
	if !filepath.IsAbs(bin) {
		t.Fatalf("%s=%q: want an absolute path", Env, bin)
	}
	// Besides the clear error, the stat puts the binary's size and mtime
	// into go test's cache key: a rebuilt agent is tested again.
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("%s=%q: not a file (%v)", Env, bin, err)
	}
	if o.DefaultUser == "" {
		cur, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		o.DefaultUser = cur.Username
	}
	dir := t.TempDir()
	var lastErr error
	// The port is free when chosen but might be taken before the agent
	// binds it: try again with another.
	for range 3 {
		a, err := start(t, bin, dir, o)
		if err == nil {
			return a
		}
		lastErr = err
	}
	t.Fatalf("starting %s: %v", bin, lastErr)
	return nil
}

func start(t testing.TB, bin, dir string, o Options) (*Agent, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{"--listen", addr, "--cgroup", "off", "--log-level", "debug", "--default-user", o.DefaultUser}
	if o.Workdir != "" {
		args = append(args, "--workdir", o.Workdir)
	}
	if o.Disk != "" {
		args = append(args, "--disk", o.Disk)
	}
	args = append(args, o.Args...)

	logPath := filepath.Join(dir, fmt.Sprintf("agent-%d.log", port))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	a := &Agent{URL: "http://" + addr, Pid: cmd.Process.Pid, Dir: dir, Log: logPath, cmd: cmd, exit: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(a.exit) }()
	if err := a.waitHealthy(); err != nil {
		a.stop()
		return nil, fmt.Errorf("%w; log:\n%s", err, a.logText())
	}
	t.Cleanup(func() {
		a.stop()
		if t.Failed() {
			t.Logf("agent %s (pid %d) log:\n%s", bin, a.Pid, a.logText())
		}
	})
	return a, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (a *Agent) waitHealthy() error {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-a.exit:
			return fmt.Errorf("agent exited before answering: %v", a.cmd.ProcessState)
		default:
		}
		resp, err := client.Get(a.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("agent did not answer GET /health in time")
}

// stop ends the agent: SIGTERM lets it end its processes and watchers as it
// does on shutdown; SIGKILL if it takes too long.
func (a *Agent) stop() {
	select {
	case <-a.exit:
		return
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exit:
	case <-time.After(10 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exit
	}
}

func (a *Agent) logText() string {
	b, err := os.ReadFile(a.Log)
	if err != nil {
		return err.Error()
	}
	const max = 64 << 10
	if len(b) > max {
		b = append([]byte("...\n"), b[len(b)-max:]...)
	}
	return string(b)
}

// Init sends POST /init with body (JSON-encoded), as sandboxd does, with the
// access token an earlier Init set, and fails t unless it is accepted. An
// accessToken in body becomes the token for later Inits.
func (a *Agent) Init(t testing.TB, body map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, a.URL+"/init", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if a.token != "" {
		req.Header.Set("X-Access-Token", a.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /init: %v", err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /init %s = %d %s; want 204", b, resp.StatusCode, rb)
	}
	if tok, ok := body["accessToken"].(string); ok {
		a.token = tok
	}
}
