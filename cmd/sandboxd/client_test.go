package main

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
