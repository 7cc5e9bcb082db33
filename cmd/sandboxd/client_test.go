package main

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/sandboxd/sandboxd/jwtauth"
)

// tokenCreate runs the real `sandboxd token create`.
func tokenCreate(t *testing.T, dataDir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(e2eBinDir, "sandboxd"), append([]string{"token", "create", "--data-dir", dataDir}, args...)...)
	cmd.Env = e2eSandboxdEnviron()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", errors.New(errOut.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// cli runs `sandboxd sandbox ARGS...` in this process.
func cli(t *testing.T, url, token string, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	full := append([]string{args[0], "--url", url, "--token", token}, args[1:]...)
	err = runSandboxCmd(t.Context(), full, clientIO{in: strings.NewReader(stdin), out: &out, errOut: &errOut})
	return out.String(), errOut.String(), err
}

func TestTokenCreate(t *testing.T) {
	if e2eSkipReason != "" {
		t.Skip(e2eSkipReason)
	}
	dir := t.TempDir()
	tok, err := tokenCreate(t, dir, "--tenant", "acme", "--scope", "sandboxes:read", "--ttl", "10m")
	if err != nil {
		t.Fatal(err)
	}
	v, err := nativeJWT(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(tok)
	if err != nil || c.Tenant != "acme" || !c.Has(jwtauth.ScopeRead) || c.Has(jwtauth.ScopeWrite) {
		t.Errorf("Verify(token) = %+v, %v; want acme with read only", c, err)
	}
	for _, bad := range [][]string{{}, {"--tenant", "acme", "--scope", "sandboxes:admin"}, {"--tenant", "acme", "--ttl", "-1h"}} {
		if _, err := tokenCreate(t, dir, bad...); err == nil {
			t.Errorf("token create %v succeeded; want an error", bad)
		}
	}
}

// TestSandboxCLI drives every `sandboxd sandbox` subcommand against a real
// sandboxd (the e2e harness) with a token from `sandboxd token create`.
func TestSandboxCLI(t *testing.T) {
	e := newE2EEnv(t, "acme")
	s := e.start()
	tok, err := tokenCreate(t, e.dataDir, "--tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}

	out, _, err := cli(t, s.base, tok, "", "create", "--timeout", "600", "--memory-mb", "256", "--metadata", "via=cli", "--no-internet")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := strings.TrimSpace(out)
	e.track(id, e.keys["acme"])

	if out, _, err := cli(t, s.base, tok, "", "list"); err != nil || !strings.Contains(out, id) {
		t.Errorf("list = %q, %v; want %s", out, err, id)
	}
	if out, _, err := cli(t, s.base, tok, "", "get", id); err != nil || !strings.Contains(out, `"via": "cli"`) {
		t.Errorf("get = %q, %v; want its metadata", out, err)
	}

	out, errOut, err := cli(t, s.base, tok, "", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 5")
	var ee exitError
	if out != "out\n" || errOut != "err\n" || !errors.As(err, &ee) || ee.code != 5 {
		t.Errorf("exec = %q, %q, %v; want out, err, exit 5", out, errOut, err)
	}
	if out, _, err := cli(t, s.base, tok, "hello\nworld\n", "exec", "-i", id, "--", "cat"); err != nil || out != "hello\nworld\n" {
		t.Errorf("exec -i cat = %q, %v; want the input back", out, err)
	}
	if out, _, err := cli(t, s.base, tok, "", "exec", "--env", "A=1", "--cwd", "/tmp", id, "--", "sh", "-c", "echo $A $(pwd)"); err != nil || out != "1 /tmp\n" {
		t.Errorf("exec --env --cwd = %q, %v", out, err)
	}
	if out, _, err := cli(t, s.base, tok, "", "exec", "-t", id, "--", "tty"); err != nil || !strings.HasPrefix(out, "/dev/pts/") {
		t.Errorf("exec -t tty = %q, %v; want a /dev/pts path", out, err)
	}

	t.Run("tty resize on SIGWINCH", func(t *testing.T) { cliResize(t, s.base, tok, id) })

	// cp in and out.
	dir := t.TempDir()
	src := filepath.Join(dir, "src.bin")
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli(t, s.base, tok, "", "cp", src, id+":/tmp/in/src.bin"); err != nil {
		t.Fatalf("cp up: %v", err)
	}
	if _, _, err := cli(t, s.base, tok, "", "cp", id+":/tmp/in/src.bin", dir); err != nil {
		t.Fatalf("cp down: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "src.bin")); !bytes.Equal(got, data) {
		t.Errorf("cp round trip: %d bytes back, differing; want the 3 MiB sent", len(got))
	}
	if _, _, err := cli(t, s.base, tok, "piped", "cp", "-", id+":/tmp/piped"); err != nil {
		t.Fatalf("cp - up: %v", err)
	}
	if out, _, err := cli(t, s.base, tok, "", "cp", id+":/tmp/piped", "-"); err != nil || out != "piped" {
		t.Errorf("cp down to - = %q, %v", out, err)
	}
	if _, _, err := cli(t, s.base, tok, "", "cp", src, dir); err == nil {
		t.Error("cp local local succeeded; want an error")
	}

	// The real binary exits with the remote exit code.
	cmd := exec.Command(filepath.Join(e2eBinDir, "sandboxd"), "sandbox", "exec", id, "--", "sh", "-c", "exit 3")
	cmd.Env = append(e2eSandboxdEnviron(), "SANDBOXD_URL="+s.base, "SANDBOXD_TOKEN="+tok)
	if err := cmd.Run(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 3 {
		t.Errorf("sandboxd sandbox exec ... exit 3: %v; want exit status 3", err)
	}

	// A read-only token lists but cannot remove.
	ro, err := tokenCreate(t, e.dataDir, "--tenant", "acme", "--scope", "sandboxes:read")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli(t, s.base, ro, "", "rm", id); err == nil || !strings.Contains(err.Error(), "permission_denied") {
		t.Errorf("rm with a read-only token: %v; want permission_denied", err)
	}
	if _, _, err := cli(t, s.base, ro, "", "exec", id, "--", "true"); err == nil || !strings.Contains(err.Error(), "permission_denied") {
		t.Errorf("exec with a read-only token: %v; want permission_denied", err)
	}
	if out, _, err := cli(t, s.base, tok, "", "rm", id); err != nil || strings.TrimSpace(out) != id {
		t.Errorf("rm = %q, %v", out, err)
	}
	if _, _, err := cli(t, s.base, tok, "", "get", id); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Errorf("get after rm: %v; want not_found", err)
	}
	if _, _, err := cli(t, s.base, "", "", "list"); err == nil {
		t.Error("list without a token succeeded")
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// cliResize runs `exec -t` on a real local terminal (a pty pair): the
// remote PTY starts at the terminal's size and follows it on SIGWINCH.
func cliResize(t *testing.T, base, tok, id string) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 33, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	done := make(chan error, 1)
	go func() { // ends when the remote command exits
		args := []string{"exec", "--url", base, "--token", tok, "-t", id, "--", "sh", "-c", "stty size; read x; stty size"}
		done <- runSandboxCmd(t.Context(), args, clientIO{in: tty, out: &out, errOut: &out})
	}()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(out.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("output %q; want %q", out.String(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("33 120")
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	// The resize frame goes out from the SIGWINCH goroutine; give it a
	// moment before the newline, which takes another path.
	time.Sleep(300 * time.Millisecond)
	if _, err := ptmx.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	waitFor("40 100")
	if err := <-done; err != nil {
		t.Errorf("exec -t: %v; want exit 0", err)
	}
}
