package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/opencontainers/cgroups"
)

// cpuGroupHelperEnv makes this test binary a helper process that joins the
// cpu group the variable names and reports (cpuGroupHelper): joinCPUGroup
// moves the whole process, which the test's own must not be.
const cpuGroupHelperEnv = "SANDBOXD_TEST_CPU_GROUP"

func init() {
	if name := os.Getenv(cpuGroupHelperEnv); name != "" {
		os.Exit(cpuGroupHelper(name, os.Getenv(cpuGroupHelperEnv+"_FROM")))
	}
}

// cpuGroupReport is what the helper saw.
type cpuGroupReport struct {
	Err     string
	Grouped bool
	In      string // its cpu cgroup after the join
	Weight  string // the group's cpu.shares (v1) or cpu.weight (v2), when it moved
	Leaves  bool   // the join returned a leave
	After   string // its cpu cgroup after the leave
}

// cpuGroupHelper joins name with the weight of 3 processes, first moving
// into the cpu cgroup from when given (as systemd would have put it), then
// leaves, and prints its report.
func cpuGroupHelper(name, from string) int {
	var r cpuGroupReport
	if from != "" {
		if err := cgroups.WriteFile(cpuDir(from), "cgroup.procs", strconv.Itoa(os.Getpid())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	g, err := joinCPUGroup(name, 3)
	if err != nil {
		r.Err = err.Error()
	}
	r.Grouped, r.Leaves = g.grouped, g.leave != nil
	r.In, _ = ownCPUCgroup()
	if g.leave != nil {
		file := "cpu.shares"
		if cgroups.IsCgroup2UnifiedMode() {
			file = "cpu.weight"
		}
		if w, err := cgroups.ReadFile(cpuDir(r.In), file); err == nil {
			r.Weight = strings.TrimSpace(w)
		}
		if err := g.leave(); err != nil {
			r.Err = err.Error()
		}
	}
	r.After, _ = ownCPUCgroup()
	if from != "" { // back where the test's process is, so that from can go
		_ = cgroups.WriteFile(cpuDir("/"), "cgroup.procs", strconv.Itoa(os.Getpid()))
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

// cpuDir is cgroup path's directory in the cpu controller's hierarchy.
func cpuDir(path string) string {
	m, err := cgroupManager(path)
	if err != nil {
		return ""
	}
	return m.Path("cpu")
}

// TestJoinCPUGroup: from the root, a process moves into the group, weighted
// as asked, and the leave takes it back and removes the group; a process a
// manager placed elsewhere stays there, grouped, with nothing to leave; a
// group that is not a child of the root is refused, the process unmoved.
func TestJoinCPUGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("moving a process between cgroups needs root")
	}
	if own, err := ownCPUCgroup(); err != nil || own != "/" {
		t.Skipf("the test runs in cpu cgroup %q (%v), not the root", own, err)
	}
	suffix := strconv.Itoa(os.Getpid())
	weight := "3072" // 3 processes at nice 0
	if cgroups.IsCgroup2UnifiedMode() {
		weight = strconv.FormatUint(cgroups.ConvertCPUSharesToCgroupV2Value(3072), 10)
	}
	for _, tc := range []struct {
		name, group, from string
		want              cpuGroupReport
	}{
		{"from the root", "/sandboxd-test-cpu-" + suffix + ".daemon", "",
			cpuGroupReport{Grouped: true, In: "/sandboxd-test-cpu-" + suffix + ".daemon", Weight: weight, Leaves: true, After: "/"}},
		{"placed by another", "/sandboxd-test-cpu-" + suffix + ".daemon", "/sandboxd-test-cpu-placed-" + suffix,
			cpuGroupReport{Grouped: true, In: "/sandboxd-test-cpu-placed-" + suffix, Weight: "", After: "/sandboxd-test-cpu-placed-" + suffix}},
		{"not a child of the root", "/sandboxd-test-cpu-" + suffix + "/nested.daemon", "",
			cpuGroupReport{Err: "cpu group /sandboxd-test-cpu-" + suffix + "/nested.daemon: not a child of the root", In: "/", After: "/"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.from != "" {
				dir := cpuDir(tc.from)
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = os.Remove(dir) })
			}
			t.Cleanup(func() {
				if err := os.Remove(cpuDir(tc.group)); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("remove %s: %v", tc.group, err)
				}
			})
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), cpuGroupHelperEnv+"="+tc.group, cpuGroupHelperEnv+"_FROM="+tc.from)
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helper: %v", err)
			}
			var got cpuGroupReport
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("helper's report %q: %v", out, err)
			}
			if got != tc.want {
				t.Errorf("helper saw %+v, want %+v", got, tc.want)
			}
			if _, err := os.Stat(cpuDir(tc.group)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("group %s after the helper: %v, want it gone", tc.group, err)
			}
		})
	}
}
