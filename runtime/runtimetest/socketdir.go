package runtimetest

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

// CheckSocketDir checks what root inside sandbox id can do to /run/envd, the
// directory where envd listens on envd.sock and that the host dials into:
// writing fillMB MiB there must fail with ENOSPC (the directory is bounded,
// by the backend's own means), and a symlink to a host socket planted as
// envd.sock must neither let Dial(EnvdPort) succeed nor lead the backend to
// connect to that host socket. It leaves envd.sock replaced: the sandbox's
// envd is no longer reachable.
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
	res, err = Exec(ctx, b, id, "root", "/bin/sh", "-c", "rm /run/envd/envd.sock && ln -s "+hostSock+" /run/envd/envd.sock")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("plant symlink: %v, %v", res, err)
	}
	if c, err := b.Dial(ctx, id, runtime.EnvdPort); err == nil {
		c.Close()
		t.Errorf("Dial(envd) through a planted symlink succeeded")
	}
	select {
	case <-accepted:
		t.Errorf("sandboxd connected to the host socket the sandbox's symlink named")
	case <-time.After(100 * time.Millisecond):
	}
}
