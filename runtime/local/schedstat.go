package local

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// taskTimes is what the kernel's schedstat (/proc/<pid>/task/<tid>/schedstat)
// says of one task or a sum of tasks: time on a CPU, and time runnable but
// waiting for one. A create's debug line carries them for sandboxd's thread
// and for the sandbox's init and envd, so that a create slowed by other
// work tells whether it waited for a CPU (the runqueue: a matter of
// priority) or for something else (a lock, the disk, another process):
// issue 24's fairness bench read its flooded creates this way.
type taskTimes struct{ onCPU, runqueue time.Duration }

func (t taskTimes) sub(u taskTimes) taskTimes {
	return taskTimes{t.onCPU - u.onCPU, t.runqueue - u.runqueue}
}

// parseSchedstat reads schedstat's "on-CPU-ns runqueue-ns timeslices".
func parseSchedstat(s string) (taskTimes, error) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return taskTimes{}, fmt.Errorf("schedstat %q: want at least two fields", s)
	}
	run, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return taskTimes{}, fmt.Errorf("schedstat %q: %w", s, err)
	}
	wait, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return taskTimes{}, fmt.Errorf("schedstat %q: %w", s, err)
	}
	return taskTimes{time.Duration(run), time.Duration(wait)}, nil
}

func readSchedstat(path string) (taskTimes, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return taskTimes{}, err
	}
	return parseSchedstat(string(data))
}

// threadTimes are the calling thread's, whose goroutine must be wired to it
// for two readings to be of one thread.
func threadTimes() (taskTimes, error) { return readSchedstat("/proc/thread-self/schedstat") }

// processTimes sums the times of pid's live threads: a thread that has
// exited is no longer counted.
func processTimes(pid int) (taskTimes, error) {
	paths, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil {
		return taskTimes{}, err
	}
	var sum taskTimes
	for _, p := range paths {
		t, err := readSchedstat(p)
		if err != nil {
			continue // the thread exited between the glob and the read
		}
		sum.onCPU += t.onCPU
		sum.runqueue += t.runqueue
	}
	if len(paths) == 0 {
		return taskTimes{}, fmt.Errorf("process %d: no threads", pid)
	}
	return sum, nil
}
