package cgroup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// scratch makes a cgroup of the host's cgroup2 tree, with a pids limit, as
// a backend delegates one to a sandbox, and a process in it standing for
// envd. It needs root and a cgroup2 tree with the pids controller.
func scratch(t *testing.T, pidsMax int) (root string, envd *exec.Cmd) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	// cgroup2 alone (v2 hosts), or beside the v1 hierarchies (hybrid
	// hosts, where it has no controllers: no pids limits there).
	var host string
	for _, p := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			host = p
			break
		}
	}
	if host == "" {
		t.Skip("no cgroup2 mount")
	}
	if b, _ := os.ReadFile(filepath.Join(host, "cgroup.subtree_control")); pidsMax > 0 && !strings.Contains(string(b), "pids") {
		t.Skip("the host's cgroup2 root does not enable pids for its children (a hybrid host: see make test-cgroup2)")
	}
	root = filepath.Join(host, "envd-cgroup-test-"+strconv.Itoa(os.Getpid())+"-"+strings.ReplaceAll(t.Name(), "/", "-"))
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(t, root) })
	if pidsMax > 0 {
		if err := os.WriteFile(filepath.Join(root, "pids.max"), []byte(strconv.Itoa(pidsMax)), 0); err != nil {
			t.Fatal(err)
		}
	}
	envd = exec.Command("sleep", "300")
	dir, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	envd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	if err := envd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = envd.Process.Kill(); _ = envd.Wait() })
	return root, envd
}

// removeTree kills everything in root's tree and removes it, leaves first.
func removeTree(t *testing.T, root string) {
	_ = os.WriteFile(filepath.Join(root, "cgroup.kill"), []byte("1"), 0)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
		if _, err := os.Stat(root); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("cgroup %s left", root)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// start runs sh -c script in a cgroup of t's.
func start(t *testing.T, tr *Tree, script string) (*exec.Cmd, *Cgroup) {
	t.Helper()
	cg, err := tr.New()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: cg.FD()}
	if err := cmd.Start(); err != nil {
		cg.Discard()
		t.Fatal(err)
	}
	cg.Started()
	t.Cleanup(func() { cg.Kill(); _ = cmd.Wait() })
	return cmd, cg
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOpen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pidsMax int
		reserve int
		want    string
	}{
		{"a reserve below the sandbox's limit", 1024, 64, "960"},
		{"at most an eighth of the limit", 200, 64, "175"},
		{"no reserve", 100, 0, "100"},
		{"no pids limit: none for commands either", 0, 64, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, envd := scratch(t, tc.pidsMax)
			tr, err := Open(root, tc.reserve)
			if err != nil {
				t.Fatal(err)
			}
			if tr.pidsMax != tc.want {
				t.Errorf("a command's pids.max = %q, want %s", tr.pidsMax, tc.want)
			}
			// Everything of the root moved into envd's leaf, and the
			// root hands pids (and cpu) to its children.
			if b, _ := os.ReadFile(filepath.Join(root, "cgroup.procs")); len(strings.TrimSpace(string(b))) > 0 {
				t.Errorf("processes left in the root: %q", b)
			}
			if b, _ := os.ReadFile(filepath.Join(root, EnvdLeaf, "cgroup.procs")); strings.TrimSpace(string(b)) != strconv.Itoa(envd.Process.Pid) {
				t.Errorf("envd's leaf holds %q, want envd's pid %d", b, envd.Process.Pid)
			}
			ctrl, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
			if b, _ := os.ReadFile(filepath.Join(root, "cgroup.subtree_control")); strings.Contains(string(ctrl), "pids") && !strings.Contains(string(b), "pids") {
				t.Errorf("subtree_control %q lacks pids", b)
			}
			// A second Open (envd restarted) finds it done.
			if _, err := Open(root, tc.reserve); err != nil {
				t.Errorf("again: %v", err)
			}
		})
	}
	if _, err := Open(t.TempDir(), 64); err == nil {
		t.Error("a plain directory opened as a cgroup tree")
	}
}

// TestForkBombKeepsReserve: a fork bomb in one command's cgroup takes what
// its pids.max allows and no more, another command still starts, and the
// bomb's cgroup.kill ends all of it.
func TestForkBombKeepsReserve(t *testing.T) {
	root, _ := scratch(t, 400)
	tr, err := Open(root, 64)
	if err != nil {
		t.Fatal(err)
	}
	_, bomb := start(t, tr, "f(){ f|f& };f; sleep 60")
	eventually(t, "the bomb at its cgroup's limit", func() bool { return bomb.Pids() >= 336-5 })
	other, cg := start(t, tr, "for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done; echo ok")
	if err := other.Wait(); err != nil {
		t.Fatalf("a command beside the bomb: %v", err)
	}
	cg.Kill()
	bomb.Kill()
	eventually(t, "the bomb's end", func() bool { return !bomb.Populated() })
	eventually(t, "the retired cgroups removed", func() bool { return tr.Retired() == 0 })
	if m, _ := filepath.Glob(filepath.Join(root, "cmd-*")); len(m) != 0 {
		t.Errorf("command cgroups left: %v", m)
	}
}

// TestRetireWaitsForLeftovers: a command whose leader exited keeps its
// cgroup while what it left runs, and the cgroup goes when that ends.
func TestRetireWaitsForLeftovers(t *testing.T) {
	root, _ := scratch(t, 0)
	tr, err := Open(root, 8)
	if err != nil {
		t.Fatal(err)
	}
	cmd, cg := start(t, tr, "sleep 1 & echo")
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	cg.Retire()
	if !cg.Populated() || tr.Retired() != 1 {
		t.Fatalf("populated %v, retired %d: the leftover sleep should keep the cgroup", cg.Populated(), tr.Retired())
	}
	eventually(t, "the cgroup removed after the leftover ended", func() bool { return tr.Retired() == 0 })
	if _, err := os.Stat(cg.path); !os.IsNotExist(err) {
		t.Errorf("%s: %v", cg.path, err)
	}
}

// TestStartInCgroup: a command is in its cgroup from its first
// instruction, born there (clone3) or moved at its exec (where clone3 is
// refused), and so is what it forks at once.
func TestStartInCgroup(t *testing.T) {
	for _, traced := range []bool{false, true} {
		t.Run(map[bool]string{false: "clone3", true: "traced exec"}[traced], func(t *testing.T) {
			root, _ := scratch(t, 0)
			tr, err := Open(root, 8)
			if err != nil {
				t.Fatal(err)
			}
			tr.traceExec.Store(traced)
			cg, err := tr.New()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cg.Kill)
			var out strings.Builder
			cmd := exec.Command("sh", "-c", "grep ^0:: /proc/self/cgroup; (grep ^0:: /proc/self/cgroup)")
			cmd.Stdout = &out
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := cg.Start(cmd, (*exec.Cmd).Start); err != nil {
				t.Fatal(err)
			}
			cg.Started()
			if err := cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			want := "/" + filepath.Base(cg.path)
			for i, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				if !strings.HasSuffix(l, want) {
					t.Errorf("line %d: %q, want the cgroup %s", i, l, want)
				}
			}
			if strings.Count(out.String(), "\n") != 2 {
				t.Errorf("output %q", out.String())
			}
		})
	}
}
