package local

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

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

// TestCgroupUsage: readUsage, which the metrics pass calls for every running
// sandbox, reads what libcontainer's full Stats reports for the same cgroup
// on this host's layout: the tasks, the pids limit ("max" as 0), CPU time
// and memory.
func TestCgroupUsage(t *testing.T) {
	// Last, after each cgroup's Destroy: the parent they were made in.
	t.Cleanup(func() { removeEmptyCgroup("/sandboxd-test-usage") })
	for _, limit := range []int64{42, -1} {
		path := fmt.Sprintf("/sandboxd-test-usage/%d-%d", os.Getpid(), limit+1)
		m, err := cgroupManagerFor(&cgroups.Cgroup{Path: path, Resources: &cgroups.Resources{PidsLimit: &limit}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Apply(-1); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Destroy() })
		if err := m.Set(&cgroups.Resources{PidsLimit: &limit}); err != nil {
			t.Fatal(err)
		}
		// The shell waits for its line until it is in the cgroup, then
		// spends CPU and memory there (charges stay where they were made).
		cmd := exec.Command("sh", "-c", `read go; x=$(head -c 4000000 /dev/zero | tr '\0' a); i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; echo done; exec sleep 30`)
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if err := m.Apply(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(in, "go\n"); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(out).ReadString('\n'); line != "done\n" {
			t.Fatalf("the shell said %q, %v", line, err)
		}
		want, err := m.GetStats()
		if err != nil {
			t.Fatal(err)
		}
		got, err := readUsage(path)
		if err != nil {
			t.Fatal(err)
		}
		wantMax := uint64(limit)
		if limit < 0 {
			wantMax = 0
		}
		if got.pids != want.PidsStats.Current || got.pids != 1 || got.pidsMax != want.PidsStats.Limit || got.pidsMax != wantMax {
			t.Errorf("limit %d: pids %d of %d; libcontainer %d of %d, want 1 of %d", limit, got.pids, got.pidsMax, want.PidsStats.Current, want.PidsStats.Limit, wantMax)
		}
		// Read after libcontainer's: CPU time only grows; memory moves a little.
		if lc := time.Duration(want.CpuStats.CpuUsage.TotalUsage); got.cpu < lc || got.cpu <= 0 {
			t.Errorf("limit %d: CPU time %v; libcontainer read %v before", limit, got.cpu, lc)
		}
		if lm := want.MemoryStats.Usage.Usage; got.memory == 0 || got.memory > lm+1<<20 || got.memory+1<<20 < lm {
			t.Errorf("limit %d: memory %d bytes; libcontainer %d", limit, got.memory, lm)
		}
	}
	if _, err := readUsage("/sandboxd-test-usage/none"); err == nil {
		t.Error("readUsage of a cgroup that does not exist: no error")
	}
}
