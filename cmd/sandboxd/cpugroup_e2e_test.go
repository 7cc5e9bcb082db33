package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"syscall"
	"testing"

	"github.com/opencontainers/cgroups"
)

// TestOwnCPUGroup: sandboxd started from the root of the cpu hierarchy
// serves from <its cgroup parent>.daemon with 4 Go processors a CPU, its
// sandboxes still in their own cgroups, and a clean stop removes the group;
// with --local-cpu-group=false it stays in the root with Go's default.
func TestOwnCPUGroup(t *testing.T) {
	if e2eSkipReason != "" {
		t.Skip(e2eSkipReason)
	}
	if own := e2eCPUCgroup(t, os.Getpid()); own != "/" {
		t.Skipf("the test runs in cpu cgroup %s, not the root: sandboxd would stay where it starts", own)
	}
	base := goruntime.GOMAXPROCS(0) // the default sandboxd's runtime computes too
	for _, tc := range []struct {
		name    string
		args    []string
		grouped bool
	}{
		{"default", nil, true},
		{"off", []string{"--local-cpu-group=false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newE2EEnv(t, "a")
			e.serveArgs = tc.args
			s := e.start()
			group := cgroupParent(e.runDir) + ".daemon"
			want, wantProcs := "/", base
			if tc.grouped {
				want = group
				if os.Getenv("GOMAXPROCS") == "" {
					wantProcs = procsPerCPU * base
				}
			}
			if got := e2eCPUCgroup(t, s.cmd.Process.Pid); got != want {
				t.Errorf("sandboxd's cpu cgroup = %s, want %s", got, want)
			}
			if got := e2eServingGOMAXPROCS(t, s); got != wantProcs {
				t.Errorf("sandboxd serving with gomaxprocs %d, want %d", got, wantProcs)
			}

			key := e.keys["a"]
			id, tok := e.createKept(t, key)
			s.mustRun(t, id, tok, "true")
			wantDirs := 0
			if tc.grouped {
				wantDirs = 1 // in the cpu hierarchy only (cpu,cpuacct when co-mounted)
			}
			if dirs := e2eCgroupDirs(group); len(dirs) != wantDirs {
				t.Errorf("cpu group directories while it serves: %v, want %d", dirs, wantDirs)
			}
			wantStatus(t, "DELETE", s.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
			if err := s.stop(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if dirs := e2eCgroupDirs(group); len(dirs) != 0 {
				t.Errorf("cpu group left after a clean stop: %v", dirs)
			}
		})
	}
}

// e2eCPUCgroup is process pid's cgroup in the cpu controller's hierarchy.
func e2eCPUCgroup(t *testing.T, pid int) string {
	t.Helper()
	paths, err := cgroups.ParseCgroupFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	key := "cpu"
	if cgroups.IsCgroup2UnifiedMode() {
		key = ""
	}
	p, ok := paths[key]
	if !ok {
		t.Skip("no cpu cgroup hierarchy")
	}
	return p
}

// e2eCgroupDirs lists the directories of cgroup path in every hierarchy.
func e2eCgroupDirs(path string) []string {
	v1, _ := filepath.Glob("/sys/fs/cgroup/*" + path)
	v2, _ := filepath.Glob("/sys/fs/cgroup" + path)
	return append(v1, v2...)
}

// e2eServingGOMAXPROCS is the gomaxprocs of sandboxd's "sandboxd serving"
// log line.
func e2eServingGOMAXPROCS(t *testing.T, s *e2eServer) int {
	t.Helper()
	for _, l := range s.logLines() {
		if l["msg"] == "sandboxd serving" {
			n, ok := l["gomaxprocs"].(float64)
			if !ok {
				t.Fatalf("serving line without gomaxprocs: %v", l)
			}
			return int(n)
		}
	}
	t.Fatal("no serving line in sandboxd's log")
	return 0
}
