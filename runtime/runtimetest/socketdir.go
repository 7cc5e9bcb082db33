package runtimetest

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// CheckSocketDir checks what root inside sandbox id can do to /run/envd, the
// directory where envd listens on envd.sock when it binds its socket itself
// (the Incus backend, and the local one's libcontainer start; sandboxd-spawn
// hands envd a socket on the host instead): writing fillMB MiB there must
// fail with ENOSPC (the directory is bounded, by the backend's own means),
// and a symlink to a host socket planted as envd.sock must not lead the
// backend to connect to that host socket: Dial(EnvdPort) then fails, or
// reaches the sandbox's envd where its socket is not in the directory. It
// may leave envd unreachable.
func CheckSocketDir(t *testing.T, b runtime.Backend, id string, fillMB int) {
	t.Helper()
	ctx := t.Context()
	res, err := Exec(ctx, b, id, "root", "/bin/sh", "-c",
		fmt.Sprintf("dd if=/dev/zero of=/run/envd/fill bs=1M count=%d; rm -f /run/envd/fill", fillMB))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Stderr, "No space left on device") {
		t.Errorf("filling /run/envd with %d MiB: %v; want ENOSPC", fillMB, res)
	}

	hostSock := filepath.Join(t.TempDir(), "host.sock")
	ln, err := net.Listen("unix", hostSock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() { // ends when ln is closed
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	res, err = Exec(ctx, b, id, "root", "/bin/sh", "-c", "rm -f /run/envd/envd.sock && ln -s "+hostSock+" /run/envd/envd.sock")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("plant symlink: %v, %v", res, err)
	}
	if c, err := b.Dial(ctx, id, runtime.EnvdPort); err == nil {
		dial := func(context.Context) (net.Conn, error) { return c, nil }
		if status, _, err := envdconn.Ask(ctx, dial, "GET", "/health", nil); err != nil || status/100 != 2 {
			t.Errorf("Dial(envd) with a symlink planted succeeded, and /health there answered %d, %v; want envd's answer", status, err)
		}
		c.Close()
	}
	select {
	case <-accepted:
		t.Errorf("sandboxd connected to the host socket the sandbox's symlink named")
	case <-time.After(100 * time.Millisecond):
	}
}
