// Package localtest runs the real local backend for the tests of the
// packages above it (server, mcp): whether the host can, the envd binary,
// and one backend per test under a run dir and cgroup parent of its own,
// whose cleanup destroys what is left and removes both.
package localtest

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// Main is a TestMain's body for tests that create sandboxes: it sets
// *envd to the envd binary (runtimetest.EnvdBinary) and *skip to why
// sandboxes cannot run here ("" when they can), runs the tests and removes
// what it built. local.Init must have run first.
func Main(m *testing.M, envd, skip *string) int {
	switch {
	case os.Geteuid() != 0:
		*skip = "the local backend needs root"
	case !exists("/sys/fs/cgroup"):
		*skip = "the local backend needs cgroups"
	}
	if *skip != "" {
		return m.Run()
	}
	bin, cleanup, err := runtimetest.EnvdBinary("localtest-envd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	*envd = bin
	return m.Run()
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// New starts a local backend for t that runs envd, its state under
// /run/<name>/ and its cgroup parent /<name>-..., sandboxes with internet
// on subnet; each of with may change its options first.
func New(t testing.TB, name, envd string, subnet netip.Prefix, log *slog.Logger, with ...func(*local.Options)) *local.Backend {
	t.Helper()
	root := filepath.Join("/run", name, fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()))
	cg := "/" + name + "-" + filepath.Base(root)
	opts := local.Options{Root: root, EnvdPath: envd, CgroupParent: cg, Log: log, EgressSubnet: subnet}
	for _, f := range with {
		f(&opts)
	}
	be, err := local.New(context.Background(), opts)
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() {
		l, _ := be.List(context.Background())
		for _, s := range l {
			_ = be.Destroy(context.Background(), s.ID)
		}
		if err := be.Close(); err != nil { // its mounts go
			t.Errorf("local backend Close: %v", err)
		}
		_ = os.RemoveAll(root)
		_ = os.Remove(filepath.Dir(root)) // the package's last backend removes it
		hier, _ := filepath.Glob("/sys/fs/cgroup/*")
		for _, h := range hier {
			_ = os.Remove(filepath.Join(h, cg))
		}
		_ = os.Remove(filepath.Join("/sys/fs/cgroup", cg))
	})
	return be
}
