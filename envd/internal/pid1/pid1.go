// Package pid1 lets envd be a sandbox's init. The kernel makes PID 1 the
// parent of every orphan, so PID 1 must reap them or the sandbox fills with
// zombies. envd does that itself (Reap), in the same process: a supervisor
// that re-executed envd as its child (as tini does) cost a second Go
// start-up, about 3-4 ms of every sandbox start, and a second process's
// memory in every sandbox.
//
// Reaping in the process that also runs commands must not take a command's
// exit status from its os/exec Wait. So commands are started with Start,
// which records their pids, and the reaper waits only for the children it
// did not record: orphans. A reaper pass holds off new Starts while it runs,
// so a command cannot exit (and be taken for an orphan) between its fork and
// its record.
package pid1

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	// startMu is held for reading across each Start and for writing by a
	// reaper pass.
	startMu sync.RWMutex
	ownMu   sync.Mutex
	// own maps the pids of commands started with Start and not yet waited
	// for to their process, so that a Wait whose pid was reused meanwhile
	// (after a wrap) cannot drop the new command's record.
	own = map[int]*os.Process{}
)

// Start starts cmd as cmd.Start does, and keeps the reaper away from it
// until Wait: its exit status is Wait's.
func Start(cmd *exec.Cmd) error {
	startMu.RLock()
	defer startMu.RUnlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	ownMu.Lock()
	own[cmd.Process.Pid] = cmd.Process
	ownMu.Unlock()
	return nil
}

// Wait waits for a command started with Start, as cmd.Wait does.
func Wait(cmd *exec.Cmd) error {
	err := cmd.Wait()
	ownMu.Lock()
	if own[cmd.Process.Pid] == cmd.Process {
		delete(own, cmd.Process.Pid)
	}
	ownMu.Unlock()
	return err
}

// Reap makes this process reap its children that were not started with
// Start, now and on every SIGCHLD, for the rest of its life. envd calls it
// when it is PID 1 (--init).
func Reap() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	reapOrphans() // those that exited before Notify
	go func() {
		for range sigs {
			reapOrphans()
		}
	}()
}

// SpareThreads leaves n more OS threads idle in the Go runtime's pool, for
// good: the runtime never ends an idle thread.
//
// As a sandbox's PID 1, envd shares the sandbox's pids.max with its
// commands, and every thread is a pid. Once a fork bomb holds them all, a
// Go program that needs one more thread (a syscall that blocks long enough
// for its P to be handed to another thread) dies with "fatal error:
// newosproc", and PID 1 takes the sandbox with it. Seen in a slow VM with 8
// threads. Idle threads are taken before new ones are made, so with some
// to spare envd keeps serving until the bomb ends. Each costs a kernel task
// and a 16 KiB stack.
func SpareThreads(n int) {
	var locked, release sync.WaitGroup
	release.Add(1)
	for range n {
		locked.Add(1)
		go func() {
			// A locked goroutine that parks keeps its thread, so the
			// others each need one of their own.
			goruntime.LockOSThread()
			locked.Done()
			release.Wait()
			goruntime.UnlockOSThread() // the thread goes back to the pool
		}()
	}
	locked.Wait()
	release.Done()
}

func reapOrphans() {
	startMu.Lock()
	defer startMu.Unlock()
	// Most passes find nothing to reap: envd has just started, or the
	// SIGCHLD was a command's whose Wait has already taken it. A peek at the
	// exited children settles those with one waitid, where listing the
	// children reads /proc/self/task (about 0.5 ms of a sandbox's start).
	for {
		pid, err := exitedChild()
		if err != nil || pid == 0 {
			return // no child exited (or none at all: ECHILD)
		}
		ownMu.Lock()
		_, mine := own[pid]
		ownMu.Unlock()
		if mine {
			break // its Wait takes it; an orphan may be behind it
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil && !errors.Is(err, unix.EINTR) {
			break
		}
	}
	pids, err := children()
	if err != nil {
		fmt.Fprintf(os.Stderr, "envd init: list children: %v\n", err)
		return
	}
	for _, pid := range pids {
		ownMu.Lock()
		_, mine := own[pid]
		ownMu.Unlock()
		if mine {
			continue
		}
		var ws unix.WaitStatus
		for {
			// WNOHANG: a live orphan is left for a later SIGCHLD.
			if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); !errors.Is(err, unix.EINTR) {
				break
			}
		}
	}
}

// exitedChild returns the pid of a child of this process (of any of its
// threads) that has exited and is waiting to be reaped, without reaping it,
// or 0 if there is none.
func exitedChild() (int, error) {
	// unix.Siginfo hides si_pid; the kernel's layout on 64-bit Linux puts it
	// right after signo, errno, code and a pad.
	var si struct {
		signo, errno, code, _ int32
		pid                   int32
		_                     [108]byte
	}
	for {
		_, _, e := unix.Syscall6(unix.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&si)),
			unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, 0, 0)
		switch e {
		case 0:
			return int(si.pid), nil
		case unix.EINTR:
			continue
		default:
			return 0, e
		}
	}
}

// children lists this process's children: those of each of its threads
// (an orphan is handed to one of them), from /proc/self/task/*/children,
// or, on a kernel without those files, from every process's parent pid.
func children() ([]int, error) {
	files, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue // a thread that ended meanwhile
		} else if err != nil {
			return nil, err
		}
		for _, field := range bytes.Fields(b) {
			if pid, err := strconv.Atoi(string(field)); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	if len(files) > 0 {
		return pids, nil
	}
	return childrenByStat()
}

func childrenByStat() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// After the parenthesised command: state, then the parent pid.
		f := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
		if len(f) > 1 {
			if ppid, err := strconv.Atoi(string(f[1])); err == nil && ppid == self {
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}
