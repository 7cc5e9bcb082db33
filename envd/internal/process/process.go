package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/internal/cgroup"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/pid1"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

const (
	// chunkSize caps one data event. Each read is forwarded as soon as it
	// returns, so this only bounds events from a fast producer.
	chunkSize = 32 << 10
	// subscriberBuffer is how many data events a reader may lag behind (up to
	// chunkSize each, so up to 32 MiB). Then the output pump waits for the
	// client that started the process (backpressure: the child blocks on its
	// full pipe), while an observer attached with Connect is disconnected.
	subscriberBuffer = 1024
	// drainGrace is how long output is still read once a process was told to
	// stop and its leader is gone: enough to empty the pipe buffers, short
	// enough that a daemon that escaped the process group and still holds the
	// pipes cannot keep the end event back.
	drainGrace = time.Second
	// defaultPath is used when envd itself runs without PATH.
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// process is one child envd started, from spawn until it is forgotten after
// the retention window.
type process struct {
	pid  uint32
	tag  *string
	info *rpc.ProcessConfig // the config as run (cwd resolved), for List
	cmd  *exec.Cmd
	tty  *os.File // PTY master, nil without a PTY

	// events carries data events and finally the end event.
	events *fanout[*rpc.ProcessEvent]
	// closing is the service's base context ending (Close): nothing may be
	// held up by a reader any more.
	closing <-chan struct{}

	// ctx bounds the process lifetime: the service's base context plus the
	// Start request's Connect-Timeout-Ms. It is deliberately not derived from
	// the request: a client that disconnects must not kill its process.
	ctx    context.Context
	cancel context.CancelFunc

	inMu    sync.Mutex
	stdin   *os.File   // write end of the stdin pipe; nil if disabled or closed
	writeMu sync.Mutex // one write at a time, so a write deadline applies to it alone

	stopOnce sync.Once
	stopping chan struct{} // closed when a kill, SIGTERM or timeout asks the process to end

	// cg is the command's own cgroup; nil without a delegated cgroup2
	// tree (the session is all that ties the command's processes then).
	cg *cgroup.Cgroup

	done  chan struct{}              // closed once the end event is published
	end   *rpc.ProcessEvent_EndEvent // set before done is closed
	evict *time.Timer                // retention timer; guarded by Service.mu
}

// output is one stream of the child's output and how its chunks are wrapped.
type output struct {
	f    *os.File
	wrap func([]byte) *rpc.ProcessEvent
}

func (p *process) finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *process) errExited() error {
	return fmt.Errorf("%w: process with pid %d has exited", rpcerr.ErrNotFound, p.pid)
}

// spawnSpec is a validated Start request.
type spawnSpec struct {
	cfg   *rpc.ProcessConfig
	path  string // executable, resolved against the child's PATH
	env   []string
	dir   string
	user  *permissions.User
	pty   *rpc.PTY
	stdin bool
	tag   *string
}

// newProcess prepares (but does not start) the child of spec.
func newProcess(base context.Context, timeout time.Duration, spec *spawnSpec) *process {
	var ctx context.Context
	var cancel context.CancelFunc
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(base, timeout)
	} else {
		ctx, cancel = context.WithCancel(base)
	}
	info := &rpc.ProcessConfig{
		Cmd:  spec.cfg.GetCmd(),
		Args: slices.Clone(spec.cfg.GetArgs()),
		Envs: maps.Clone(spec.cfg.GetEnvs()),
		Cwd:  &spec.dir,
	}
	return &process{
		tag:      spec.tag,
		info:     info,
		events:   newFanout[*rpc.ProcessEvent](subscriberBuffer),
		closing:  base.Done(),
		ctx:      ctx,
		cancel:   cancel,
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
	}
}

// spawn starts the child and returns the files its output is read from. On
// error nothing is left open or running. The pid is published by
// Service.register, under the lock lookups take.
func (p *process) spawn(spec *spawnSpec) (outs []output, err error) {
	cmd := &exec.Cmd{
		Path: spec.path,
		Args: append([]string{spec.cfg.GetCmd()}, spec.cfg.GetArgs()...),
		Env:  spec.env,
		Dir:  spec.dir,
		// A new session makes the child the leader of its own process group,
		// so signals and timeouts reach everything a shell started, too.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Credential: credential(spec.user)},
	}

	// Parent-side files are closed on failure; child-side ones always once
	// the child has its copies.
	var parentFiles, childFiles []*os.File
	defer func() {
		for _, f := range childFiles {
			_ = f.Close()
		}
		if err != nil {
			for _, f := range parentFiles {
				_ = f.Close()
			}
		}
	}()

	if spec.pty != nil {
		master, slave, err := openPTY(spec.pty.GetSize())
		if err != nil {
			return nil, err
		}
		parentFiles = append(parentFiles, master)
		childFiles = append(childFiles, slave)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		// The PTY becomes the controlling terminal (fd 0 in the child), which
		// is what makes job control and Ctrl-C/Ctrl-D work in shells.
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0
		p.tty = master
		outs = []output{{master, ptyEvent}}
	} else {
		for _, o := range []struct {
			set  func(*os.File)
			wrap func([]byte) *rpc.ProcessEvent
		}{
			{func(f *os.File) { cmd.Stdout = f }, stdoutEvent},
			{func(f *os.File) { cmd.Stderr = f }, stderrEvent},
		} {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, err
			}
			parentFiles = append(parentFiles, r)
			childFiles = append(childFiles, w)
			o.set(w)
			outs = append(outs, output{r, o.wrap})
		}
		// Without stdin the child reads /dev/null (exec's default for nil).
		if spec.stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, err
			}
			parentFiles = append(parentFiles, w)
			childFiles = append(childFiles, r)
			cmd.Stdin = r
			p.stdin = w
		}
	}

	// pid1.Start, not cmd.Start: envd as PID 1 reaps orphans, and must
	// know this child is not one (its status is Wait's). With a cgroup of
	// its own, the child is in it before its first instruction.
	start := pid1.Start
	if p.cg != nil {
		start = func(cmd *exec.Cmd) error { return p.cg.Start(cmd, pid1.Start) }
	}
	if err := start(cmd); err != nil {
		return nil, fmt.Errorf("start %q: %w", spec.cfg.GetCmd(), err)
	}
	preferOOMVictim(cmd.Process.Pid)
	p.cmd = cmd
	return outs, nil
}

// childOOMScoreAdj makes what envd starts (and its descendants, which
// inherit it) the kernel's preferred victims when the sandbox runs out of
// memory, so that envd, the sandbox's only way in, is killed last. Raising a
// score needs no privilege; lowering envd's own would need CAP_SYS_RESOURCE.
const childOOMScoreAdj = "500"

func preferOOMVictim(pid int) {
	// Best effort: a process that already exited, or a /proc without the
	// file, changes nothing about the command itself.
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(childOOMScoreAdj), 0)
}

// credential returns who the child runs as. A non-root envd (development)
// can only run processes as itself and must not try setgroups.
func credential(u *permissions.User) *syscall.Credential {
	if os.Geteuid() != 0 && int(u.UID) == os.Geteuid() {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

// openPTY opens a terminal pair sized as asked.
func openPTY(size *rpc.PTY_Size) (master, slave *os.File, err error) {
	m, slave, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	// pty.Open leaves the master in blocking mode (its ioctls go through
	// Fd), where reads can neither time out nor be interrupted by Close.
	// Re-wrap a non-blocking duplicate so the runtime poller owns it.
	master, err = pollable(m)
	if err == nil {
		err = setWinsize(master, size)
	}
	if err != nil {
		if master != nil {
			_ = master.Close()
		}
		_ = slave.Close()
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	return master, slave, nil
}

func pollable(f *os.File) (*os.File, error) {
	defer f.Close()
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	dup := -1
	var opErr error
	if err := sc.Control(func(fd uintptr) {
		dup, opErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		if opErr == nil {
			opErr = unix.SetNonblock(dup, true)
		}
	}); err != nil {
		return nil, err
	}
	if opErr != nil {
		if dup >= 0 {
			_ = unix.Close(dup)
		}
		return nil, opErr
	}
	return os.NewFile(uintptr(dup), f.Name()), nil
}

// setWinsize resizes the terminal without calling Fd, which would switch the
// master back to blocking mode.
func setWinsize(master *os.File, size *rpc.PTY_Size) error {
	cols, rows := size.GetCols(), size.GetRows()
	if cols > 0xFFFF || rows > 0xFFFF {
		return fmt.Errorf("%w: pty size %dx%d is too large", rpcerr.ErrInvalidArgument, cols, rows)
	}
	sc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := sc.Control(func(fd uintptr) {
		opErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	}); err != nil {
		return err
	}
	return opErr
}

// run owns the started child until its end event is out: it forwards output,
// reaps the child, enforces the lifetime context and publishes the end. Every
// goroutine it starts has returned when it does. ended runs once the end is
// known, before it is published.
func (p *process) run(outs []output, ended func()) {
	defer p.cancel()

	var readers sync.WaitGroup
	for _, o := range outs {
		readers.Go(func() { p.forward(o) })
	}
	drained := make(chan struct{})
	settled := make(chan struct{})

	var helpers sync.WaitGroup
	helpers.Go(func() {
		readers.Wait()
		close(drained)
	})
	// Exits when the lifetime ends (timeout, Close) after killing the
	// process group, or when the process has settled on its own.
	helpers.Go(func() {
		select {
		case <-p.ctx.Done():
			_ = p.signal(syscall.SIGKILL)
		case <-settled:
		}
	})
	// The client that started the process holds up its output while it is
	// behind (backpressure). Once the process was told to stop, it gets the
	// drain grace to catch up and is then treated like any other reader, so
	// a stalled client cannot keep a killed or timed-out process from
	// ending; on Close it is released at once.
	helpers.Go(func() {
		select {
		case <-p.closing:
		case <-p.stopping:
			grace := time.NewTimer(drainGrace)
			defer grace.Stop()
			select {
			case <-grace.C:
			case <-p.closing:
			case <-settled:
				return
			}
		case <-settled:
			return
		}
		p.events.release()
	})

	waitErr := pid1.Wait(p.cmd)
	p.closeStdin()
	// The leader is gone, but children it left behind may still hold the
	// output open. Keep forwarding until they close it (as a shell pipeline
	// would), unless the process was told to stop: then only drain briefly.
	select {
	case <-drained:
	case <-p.stopping:
		for _, o := range outs {
			_ = o.f.SetReadDeadline(time.Now().Add(drainGrace))
		}
		<-drained
	}
	// A command told to stop (kill, SIGTERM, timeout) ends with everything
	// it left running in its session. One whose leader exited on its own
	// keeps what it started in the background (`server &`), as on E2B; its
	// session is remembered, so that if the sandbox runs out of pids (a
	// fork bomb's survivors) the next start can end it (leftovers).
	select {
	case <-p.stopping:
		leftover{int(p.pid), p.cg}.end()
	default:
		go leftovers.add(leftover{int(p.pid), p.cg}) // watches for a second: the end event need not wait
	}
	close(settled)
	helpers.Wait()
	if p.tty != nil {
		_ = p.tty.Close()
	}

	p.end = endEvent(p.cmd.ProcessState, waitErr)
	ended()
	// done closes before the end event goes out: a client that got it and
	// then lists the processes no longer finds this one (List and Connect
	// read done).
	close(p.done)
	// Never waits for a reader: one that is behind gets the end event from
	// stream once it has caught up.
	p.events.finish(&rpc.ProcessEvent{Event: &rpc.ProcessEvent_End{End: p.end}})
}

// forward publishes each read as soon as it returns, until EOF, a PTY hang-up
// (EIO), the drain deadline or a close. Publishing waits while the client
// that started the process is a full buffer behind; the child then blocks on
// its full pipe.
func (p *process) forward(o output) {
	if p.tty == nil {
		// Pipe read ends are ours alone; the PTY master is closed by run.
		defer o.f.Close()
	}
	buf := make([]byte, chunkSize)
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			p.events.publish(o.wrap(bytes.Clone(buf[:n])))
		}
		if err != nil {
			return
		}
	}
}

// signal delivers sig to the whole process group. SIGKILL and SIGTERM also
// mark the process as stopping, so that once its leader is gone, leftover
// children holding the output cannot delay the end event for long.
func (p *process) signal(sig syscall.Signal) error {
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		p.stopOnce.Do(func() { close(p.stopping) })
	}
	// Setsid made the pid the group id. The kernel keeps that id allocated
	// while any member lives, so leftover children are still reached after
	// the leader was reaped; only once the group is empty could the id be
	// reused, and we stop signalling shortly after that (the process ends).
	err := syscall.Kill(-int(p.pid), sig)
	if errors.Is(err, syscall.ESRCH) {
		return p.errExited()
	}
	return err
}

// input returns where input of the given kind goes.
func (p *process) input(isPTY bool) (*os.File, error) {
	switch {
	case isPTY && p.tty == nil:
		return nil, fmt.Errorf("%w: process %d has no PTY; send stdin instead", rpcerr.ErrFailedPrecondition, p.pid)
	case isPTY:
		return p.tty, nil
	case p.tty != nil:
		return nil, fmt.Errorf("%w: process %d has a PTY; send pty input instead", rpcerr.ErrFailedPrecondition, p.pid)
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return nil, fmt.Errorf("%w: stdin of process %d is not open (started with stdin=false, or closed)", rpcerr.ErrFailedPrecondition, p.pid)
	}
	return p.stdin, nil
}

// write sends data to f, giving up when ctx ends: a process that never reads
// its input must not pin the RPC forever.
func (p *process) write(ctx context.Context, f *os.File, data []byte) error {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()

	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = f.SetWriteDeadline(time.Unix(1, 0))
	})
	_, err := f.Write(data)
	if !stop() {
		<-fired
		_ = f.SetWriteDeadline(time.Time{})
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil:
		return fmt.Errorf("write input of process %d: %w", p.pid, ctx.Err())
	case p.finished():
		return p.errExited()
	case errors.Is(err, fs.ErrClosed), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EIO):
		return fmt.Errorf("%w: input of process %d is closed", rpcerr.ErrFailedPrecondition, p.pid)
	}
	return fmt.Errorf("write input of process %d: %w", p.pid, err)
}

// closeStdin gives the child EOF on stdin. Closing unblocks a pending write.
func (p *process) closeStdin() {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
}

func endEvent(state *os.ProcessState, err error) *rpc.ProcessEvent_EndEvent {
	end := &rpc.ProcessEvent_EndEvent{ExitCode: -1}
	if state != nil {
		// ExitCode is -1 for a signal death, as E2B reports it; Status and
		// Error are Go's ProcessState text ("exit status 1", "signal: killed").
		end.ExitCode = int32(state.ExitCode())
		end.Exited = state.Exited()
		end.Status = state.String()
	}
	if err != nil {
		msg := err.Error()
		end.Error = &msg
		if state == nil {
			end.Status = msg
		}
	}
	return end
}

func stdoutEvent(b []byte) *rpc.ProcessEvent {
	return dataEvent(&rpc.ProcessEvent_DataEvent{Output: &rpc.ProcessEvent_DataEvent_Stdout{Stdout: b}})
}

func stderrEvent(b []byte) *rpc.ProcessEvent {
	return dataEvent(&rpc.ProcessEvent_DataEvent{Output: &rpc.ProcessEvent_DataEvent_Stderr{Stderr: b}})
}

func ptyEvent(b []byte) *rpc.ProcessEvent {
	return dataEvent(&rpc.ProcessEvent_DataEvent{Output: &rpc.ProcessEvent_DataEvent_Pty{Pty: b}})
}

func dataEvent(d *rpc.ProcessEvent_DataEvent) *rpc.ProcessEvent {
	return &rpc.ProcessEvent{Event: &rpc.ProcessEvent_Data{Data: d}}
}

// buildEnv composes the child's environment: PATH (envd's own), the user's
// HOME, USER and LOGNAME, then the sandbox-wide variables, then the
// request's. Later sources override earlier ones.
func buildEnv(u *permissions.User, sandbox, request map[string]string) ([]string, error) {
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	var env []string
	index := map[string]int{}
	set := func(k, v string) {
		if i, ok := index[k]; ok {
			env[i] = k + "=" + v
			return
		}
		index[k] = len(env)
		env = append(env, k+"="+v)
	}
	set("PATH", path)
	set("HOME", u.Home)
	set("USER", u.Name)
	set("LOGNAME", u.Name)
	for _, m := range []map[string]string{sandbox, request} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys) // deterministic order for the child
		for _, k := range keys {
			v := m[k]
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
				return nil, fmt.Errorf("%w: environment variable %q", rpcerr.ErrInvalidArgument, k)
			}
			set(k, v)
		}
	}
	return env, nil
}

// envValue returns the last value of key in env.
func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds cmd the way the child's own shell would: a name without a
// slash is searched in the child's PATH (not envd's, so a request can bring
// its own PATH), anything else is taken relative to dir.
func lookPath(cmd, pathEnv, dir string) (string, error) {
	if strings.ContainsRune(cmd, 0) {
		return "", fmt.Errorf("%w: command contains a NUL byte", rpcerr.ErrInvalidArgument)
	}
	if strings.Contains(cmd, "/") {
		if !filepath.IsAbs(cmd) {
			cmd = filepath.Join(dir, cmd)
		}
		return cmd, nil // exec reports a missing or non-executable file itself
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		c := filepath.Join(d, cmd)
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w: executable %q not found in PATH", rpcerr.ErrNotFound, cmd)
}
