// Package cgroup gives each command envd starts a cgroup of its own, inside
// the cgroup2 subtree the backend delegates to the sandbox (mounted at
// /sys/fs/cgroup, where the sandbox's cgroup is the root).
//
// It is what keeps a sandbox usable under a fork bomb: envd moves itself
// into a leaf of its own ("envd"), and each command's cgroup gets a pids.max
// a reserve below the sandbox's, so one command can never take the pids
// envd needs to serve, to start another command or to kill. A command's end
// kills its cgroup whole (cgroup.kill), which no fork can outrun, and envd's
// leaf weighs more for the CPU than any command's.
//
// Without a delegated cgroup2 tree (cgroup v1 hosts, no write access) Open
// fails with ErrUnsupported and envd falls back to sweeping sessions.
package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnsupported: the sandbox has no cgroup2 tree envd may organise.
var ErrUnsupported = errors.New("no delegated cgroup2 tree")

// EnvdLeaf is the cgroup envd moves into, below the tree's root.
const EnvdLeaf = "envd"

// envdWeight is envd's cpu.weight (a command's is the default, 100): under
// a CPU-burning command envd still answers at once.
const envdWeight = "10000"

// Tree is the sandbox's delegated cgroup2 tree, organised: envd in its own
// leaf, commands in cgroups of their own beside it.
type Tree struct {
	root string
	// pidsMax is each command's pids.max; "" leaves it unlimited (the
	// sandbox has no pids limit).
	pidsMax string
	seq     atomic.Uint64
	// traceExec: clone3 answered ENOSYS, commands move at their exec.
	traceExec atomic.Bool

	mu      sync.Mutex
	retired map[*Cgroup]struct{} // killed or left: removed once empty
	reaping bool
}

// Open organises the cgroup2 tree at root: every process in root moves into
// root/envd, the pids and cpu controllers are enabled for root's children,
// and commands will get reserve pids fewer than the sandbox's limit (at
// most an eighth of it).
func Open(root string, reserve int) (*Tree, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("%s: %w", root, ErrUnsupported)
	}
	if unix.Access(filepath.Join(root, "cgroup.subtree_control"), unix.W_OK) != nil {
		return nil, fmt.Errorf("%s: not writable: %w", root, ErrUnsupported)
	}
	t := &Tree{root: root, retired: map[*Cgroup]struct{}{}}
	leaf := filepath.Join(root, EnvdLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cgroup %s: %w", leaf, err)
	}
	if err := moveAll(root, leaf); err != nil {
		return nil, err
	}
	controllers, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	has := func(c string) bool {
		return strings.Contains(" "+strings.TrimSpace(string(controllers))+" ", " "+c+" ")
	}
	if has("pids") {
		if err := write(root, "cgroup.subtree_control", "+pids"); err != nil {
			return nil, err
		}
		t.pidsMax = commandPids(root, reserve)
	}
	if has("cpu") && write(root, "cgroup.subtree_control", "+cpu") == nil {
		_ = write(leaf, "cpu.weight", envdWeight)
	}
	return t, nil
}

// commandPids is a command's pids.max: the sandbox's limit less the
// reserve, or "" when the sandbox has none.
func commandPids(root string, reserve int) string {
	b, err := os.ReadFile(filepath.Join(root, "pids.max"))
	if err != nil {
		return ""
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil { // "max"
		return ""
	}
	reserve = min(reserve, limit/8)
	return strconv.Itoa(max(limit-reserve, 1))
}

// moveAll moves every process of from into to. Processes that fork while it
// runs land in from too: it repeats until from is empty.
func moveAll(from, to string) error {
	for range 100 {
		b, err := os.ReadFile(filepath.Join(from, "cgroup.procs"))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", from, err)
		}
		pids := strings.Fields(string(b))
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := write(to, "cgroup.procs", pid); err != nil && !errors.Is(err, syscall.ESRCH) {
				return err
			}
		}
	}
	return fmt.Errorf("cgroup %s: processes keep appearing", from)
}

func write(dir, file, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("cgroup %s: %w", filepath.Join(dir, file), err)
	}
	return nil
}

// Cgroup is one command's cgroup.
type Cgroup struct {
	t    *Tree
	path string
	dir  *os.File // held until the child is in (CLONE_INTO_CGROUP)
}

// New makes a cgroup for a command about to start; its FD goes to the
// child's clone (syscall.SysProcAttr.CgroupFD).
func (t *Tree) New() (*Cgroup, error) {
	path := filepath.Join(t.root, "cmd-"+strconv.FormatUint(t.seq.Add(1), 10))
	if err := os.Mkdir(path, 0o755); err != nil {
		// EAGAIN: the backend's cap on the sandbox's cgroups.
		return nil, fmt.Errorf("cgroup for a command: %w", err)
	}
	c := &Cgroup{t: t, path: path}
	if t.pidsMax != "" {
		if err := write(path, "pids.max", t.pidsMax); err != nil {
			_ = os.Remove(path)
			return nil, err
		}
	}
	dir, err := os.Open(path)
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("cgroup %s: %w", path, err)
	}
	c.dir = dir
	return c, nil
}

// FD is the cgroup's directory, for CLONE_INTO_CGROUP.
func (c *Cgroup) FD() int { return int(c.dir.Fd()) }

// Start starts cmd with start (cmd.Start, or a wrapper of it) so that the
// command runs in the cgroup from its first instruction: born there by
// clone3's CLONE_INTO_CGROUP, or, where a seccomp profile answers clone3
// with ENOSYS (so that clone's namespace flags stay visible to it, as the
// local backend's does), stopped at its exec under ptrace, moved, and let
// go. Either way no fork of the command happens outside the cgroup.
func (c *Cgroup) Start(cmd *exec.Cmd, start func(*exec.Cmd) error) error {
	if !c.t.traceExec.Load() {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, c.FD()
		err := start(cmd)
		if !errors.Is(err, syscall.ENOSYS) {
			return err
		}
		// Nothing started: the caller builds the command anew.
		c.t.traceExec.Store(true)
		return fmt.Errorf("clone3: %w", ErrRetry)
	}
	return c.startTraced(cmd, start)
}

// ErrRetry: the command did not start and may be started again with a new
// exec.Cmd.
var ErrRetry = errors.New("start again")

func (c *Cgroup) startTraced(cmd *exec.Cmd, start func(*exec.Cmd) error) error {
	// The tracer is the thread that forked: it must also be the one that
	// waits and detaches.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr.Ptrace = true
	if err := start(cmd); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	// A traced child stops with SIGTRAP once its execve succeeded.
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if err == nil || !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if !ws.Stopped() {
		return nil // killed before its exec completed: its Wait tells
	}
	err := write(c.path, "cgroup.procs", strconv.Itoa(pid))
	if err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = unix.PtraceDetach(pid)
	return err
}

// Started releases what the clone needed.
func (c *Cgroup) Started() { _ = c.dir.Close() }

// Discard removes a cgroup whose command did not start.
func (c *Cgroup) Discard() {
	c.Started()
	_ = os.Remove(c.path)
}

// Pids is how many processes (threads too) the cgroup holds now.
func (c *Cgroup) Pids() int {
	b, err := os.ReadFile(filepath.Join(c.path, "pids.current"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(string(bytes.TrimSpace(b)))
	return n
}

// Populated reports whether any process is left in the cgroup.
func (c *Cgroup) Populated() bool {
	b, err := os.ReadFile(filepath.Join(c.path, "cgroup.events"))
	return err == nil && bytes.Contains(b, []byte("populated 1"))
}

// Kill SIGKILLs every process in the cgroup at once (cgroup.kill: no fork
// escapes it) and retires the cgroup. Kernels before 5.14 lack cgroup.kill:
// the cgroup is frozen, so nothing forks, and its processes are killed.
func (c *Cgroup) Kill() {
	if err := write(c.path, "cgroup.kill", "1"); err != nil {
		c.killFrozen()
	}
	c.t.retire(c)
}

func (c *Cgroup) killFrozen() {
	_ = write(c.path, "cgroup.freeze", "1")
	defer func() { _ = write(c.path, "cgroup.freeze", "0") }()
	for range 100 {
		b, err := os.ReadFile(filepath.Join(c.path, "cgroup.procs"))
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			return
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// Retire hands the cgroup to the tree, which removes it once it is empty:
// a command's leader exited, and what it left running (`server &`) keeps
// the cgroup until it ends.
func (c *Cgroup) Retire() { c.t.retire(c) }

// reapInterval is how often retired cgroups are tried for removal.
const reapInterval = 500 * time.Millisecond

func (t *Tree) retire(c *Cgroup) {
	if err := os.Remove(c.path); err == nil || errors.Is(err, os.ErrNotExist) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.retired[c] = struct{}{}
	if !t.reaping {
		t.reaping = true
		go t.reap()
	}
}

// reap removes retired cgroups as they empty; it runs while any is left.
func (t *Tree) reap() {
	for {
		time.Sleep(reapInterval)
		t.mu.Lock()
		for c := range t.retired {
			if err := os.Remove(c.path); err == nil || errors.Is(err, os.ErrNotExist) {
				delete(t.retired, c)
			}
		}
		if len(t.retired) == 0 {
			t.reaping = false
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
	}
}

// Retired is how many cgroups wait for their processes to end.
func (t *Tree) Retired() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.retired)
}
