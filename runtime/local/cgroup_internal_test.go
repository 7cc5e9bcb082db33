package local

import (
	"testing"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
)

// TestCgroupManagerPaths: the directories cgroupManager derives from its
// parent's are those opencontainers/cgroups computes for the path itself,
// on this host's layout, for a first and a second child of one parent.
func TestCgroupManagerPaths(t *testing.T) {
	for _, path := range []string{"/sandboxd-test-paths/a", "/sandboxd-test-paths/b", "/sandboxd-test-paths2/c"} {
		got, err := cgroupManager(path)
		if err != nil {
			t.Fatal(err)
		}
		want, err := manager.New(&cgroups.Cgroup{Path: path, Resources: &cgroups.Resources{}})
		if err != nil {
			t.Fatal(err)
		}
		g, w := got.GetPaths(), want.GetPaths()
		if len(w) == 0 || len(g) != len(w) {
			t.Fatalf("%s: paths %v, want %v", path, g, w)
		}
		for k, p := range w {
			if g[k] != p {
				t.Errorf("%s: %q at %s, want %s", path, k, g[k], p)
			}
		}
	}
}
