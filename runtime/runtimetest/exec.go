package runtimetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// Result is what a command run through envd produced.
type Result struct {
	Stdout, Stderr string
	// ExitCode is the exit status, -1 for a death by signal.
	ExitCode int
	// Status is envd's description, such as "exit status 1" or
	// "signal: killed".
	Status string
}

func (r Result) String() string {
	return fmt.Sprintf("exit %d (%s), stdout %q, stderr %q", r.ExitCode, r.Status, trim(r.Stdout), trim(r.Stderr))
}

func trim(s string) string {
	if len(s) > 2000 {
		return s[:1000] + "…" + s[len(s)-1000:]
	}
	return s
}

// EnvdClient returns an HTTP client whose every connection is a Dial of
// envd in sandbox id, so any URL host reaches envd.
func EnvdClient(b runtime.Backend, id string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return b.Dial(ctx, id, runtime.EnvdPort)
		},
		DisableKeepAlives: true,
	}}
}

// Exec runs name with args in sandbox id as user (empty: envd's default
// user) through envd's Process service, and waits for it to end.
func Exec(ctx context.Context, b runtime.Backend, id, user, name string, args ...string) (Result, error) {
	c := envdconn.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id, runtime.EnvdPort) }, "", user)
	defer c.Close()
	var stdout, stderr strings.Builder
	x, err := c.Run(ctx, envdconn.Command{Cmd: name, Args: args}, func(o, e []byte) {
		stdout.Write(o)
		stderr.Write(e)
	})
	res := Result{Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: x.ExitCode, Status: x.Status}
	return res, err
}

// sh runs a shell script in sandbox id as user, with a deadline.
func sh(ctx context.Context, b runtime.Backend, id, user, script string) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, Within(2*time.Minute))
	defer cancel()
	return Exec(ctx, b, id, user, "/bin/sh", "-c", script)
}

// EnvdBinary returns the envd binary a backend's tests run in their
// sandboxes, for their TestMain: $SANDBOXD_ENVD if set, else cmd/envd built
// (static, CGO_ENABLED=0) into a new temporary directory named after
// tmpPattern (as os.MkdirTemp takes it). cleanup removes that directory; it
// is never nil.
func EnvdBinary(tmpPattern string) (path string, cleanup func(), err error) {
	return buildBinary("SANDBOXD_ENVD", tmpPattern, "envd", "CGO_ENABLED=0", "build", "-trimpath")
}

// InitBinary is EnvdBinary for the local backend's helper, sandboxd-init
// (cgo, with libseccomp), or $SANDBOXD_INIT when set.
func InitBinary(tmpPattern string) (path string, cleanup func(), err error) {
	return buildBinary("SANDBOXD_INIT", tmpPattern, "sandboxd-init", "CGO_ENABLED=1", "build", "-tags", "seccomp", "-trimpath")
}

// SpawnBinary is EnvdBinary for the local backend's sandboxd-spawn, a C
// program built with the host's cc (BuildSpawn), or $SANDBOXD_SPAWN when
// set; "none" there gives no path (libcontainer starts every sandbox).
func SpawnBinary(tmpPattern string) (path string, cleanup func(), err error) {
	switch p := os.Getenv("SANDBOXD_SPAWN"); p {
	case "none":
		return "", func() {}, nil
	case "":
	default:
		return p, func() {}, nil
	}
	dir, err := os.MkdirTemp("", tmpPattern)
	if err != nil {
		return "", func() {}, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	path = filepath.Join(dir, "sandboxd-spawn")
	if err := BuildSpawn(path); err != nil {
		cleanup()
		return "", func() {}, err
	}
	return path, cleanup, nil
}

// BuildSpawn builds sandboxd-spawn (cmd/sandboxd-spawn) at path with the
// host's cc, static and with the Makefile's flags.
func BuildSpawn(path string) error {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("build sandboxd-spawn: go env GOMOD: %w", err)
	}
	src := filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), "cmd", "sandboxd-spawn", "spawn.c")
	if out, err := exec.Command("cc", "-O2", "-Wall", "-Werror", "-static", "-o", path, src).CombinedOutput(); err != nil {
		return fmt.Errorf("build sandboxd-spawn: %v\n%s", err, out)
	}
	return nil
}

func buildBinary(envVar, tmpPattern, name, cgo string, args ...string) (path string, cleanup func(), err error) {
	if p := os.Getenv(envVar); p != "" {
		return p, func() {}, nil
	}
	dir, err := os.MkdirTemp("", tmpPattern)
	if err != nil {
		return "", func() {}, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	path = filepath.Join(dir, name)
	cmd := exec.Command("go", append(args, "-o", path, "github.com/sandboxd/sandboxd/cmd/"+name)...)
	cmd.Env = append(os.Environ(), cgo)
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", func() {}, fmt.Errorf("build %s: %v\n%s", name, err, out)
	}
	return path, cleanup, nil
}
