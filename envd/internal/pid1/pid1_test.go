package pid1

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
)

const helperEnv = "PID1_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helper())
	}
	if n, err := strconv.Atoi(os.Getenv(spareEnv)); err == nil {
		os.Exit(spareHelper(n))
	}
	// Against an agent binary (ENVD_TEST_BINARY) nothing here runs.
	agenttest.Main(m, "unit tests of zombie reaping and thread sparing, which run in the test process")
}

// helper is a process that reaps as envd does as PID 1: a child subreaper
// gets its descendants' orphans as PID 1 does. It runs commands whose shells
// leave a background child behind, and fails unless every command's Wait
// reports its own status and every orphan is reaped.
func helper() int {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Println("subreaper:", err)
		return 1
	}
	Reap()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() {
			// The subshell outlives sh: an orphan, reparented to us.
			cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf("(sleep 0.0%d; true) & exit %d", i%3, 3+i%5))
			if err := Start(cmd); err != nil {
				errs <- err
				return
			}
			// Wait late, so the command is a zombie when the reaper
			// runs for its orphan's or another command's SIGCHLD.
			time.Sleep(50 * time.Millisecond)
			err := Wait(cmd)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 3+i%5 {
				errs <- fmt.Errorf("command %d: Wait = %v; want exit status %d", i, err, 3+i%5)
			}
		})
	}
	wg.Wait()
	close(errs)
	failed := false
	for err := range errs {
		fmt.Println(err)
		failed = true
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := children()
		if err != nil {
			fmt.Println("children:", err)
			return 1
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			fmt.Println("children never reaped:", pids)
			return 1
		}
		time.Sleep(10 * time.Millisecond)
	}
	if failed {
		return 1
	}
	return 0
}

func TestReap(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
}

func TestChildren(t *testing.T) {
	tests := []struct {
		name string
		list func() ([]int, error)
	}{
		{"task children files", children},
		{"parent pids in stat", childrenByStat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command("/bin/sleep", "100")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			pids, err := tt.list()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(pids, cmd.Process.Pid) {
				t.Errorf("children = %v; want %d among them", pids, cmd.Process.Pid)
			}
			if slices.Contains(pids, os.Getpid()) {
				t.Errorf("children = %v includes this process", pids)
			}
		})
	}
}

// TestExitedChild: the peek sees a child only once it has exited, and
// leaves it for its own Wait, whose status stays intact.
func TestExitedChild(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "read x; exit 7")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if pid, err := exitedChild(); err != nil || pid != 0 {
		t.Fatalf("exitedChild with a live child = %d, %v; want 0, nil", pid, err)
	}
	_ = in.Close()
	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if pid, err = exitedChild(); err != nil {
			t.Fatal(err)
		}
	}
	if pid != cmd.Process.Pid {
		t.Fatalf("exitedChild = %d; want %d", pid, cmd.Process.Pid)
	}
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("Wait after the peek = %v; want exit status 7", err)
	}
	if pid, err := exitedChild(); !errors.Is(err, unix.ECHILD) || pid != 0 {
		t.Fatalf("exitedChild with no child = %d, %v; want 0, ECHILD", pid, err)
	}
}

// TestSpareThreads: in a fresh process (a test binary's threads, once
// made, stay idle for every later test), the threads stay after the call.
func TestSpareThreads(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), spareEnv+"=24")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var before, after int
	if _, err := fmt.Sscanf(string(out), "%d %d", &before, &after); err != nil {
		t.Fatalf("helper printed %q: %v", out, err)
	}
	// 24 goroutines held 24 threads at once, beside the one that waited
	// for them; an idle thread the process had may have been one of them.
	if after < 24+1 || after <= before {
		t.Fatalf("threads: %d before, %d after SpareThreads(24)", before, after)
	}
}

const spareEnv = "PID1_TEST_SPARE"

func spareHelper(n int) int {
	before := threadCount()
	SpareThreads(n)
	time.Sleep(50 * time.Millisecond) // the goroutines unlock and end
	fmt.Println(before, threadCount())
	return 0
}

func threadCount() int {
	raw, _ := os.ReadFile("/proc/self/status")
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return -1
}
