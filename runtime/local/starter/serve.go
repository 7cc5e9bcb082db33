package starter

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	// Device cgroup rules fail without the devices controller's
	// implementation, which is registered by import.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/runc/libcontainer"
	// nsenter's C constructor runs the namespace setup of "init" before the
	// Go runtime starts; libcontainer cannot start a container without it.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// InitIfAsked runs libcontainer's container init, and never returns, when
// this process was started as one (os.Args[1] == "init"); otherwise it
// returns at once. Every binary that starts containers calls it first in
// main: libcontainer re-executes the binary that calls it as the init.
func InitIfAsked() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init() // exits
	}
}

// Serve answers start requests on conn, the helper's end of the socket pair,
// until sandboxd closes the other end. Each request is served on its own
// goroutine, so that concurrent creates start concurrently.
func Serve(conn *net.UnixConn) error {
	var (
		wmu sync.Mutex
		wg  sync.WaitGroup
	)
	defer wg.Wait()
	warmJSON()
	buf := make([]byte, maxMessage)
	for {
		n, _, _, _, err := conn.ReadMsgUnix(buf, nil)
		if n == 0 && (err == nil || errors.Is(err, io.EOF)) {
			return nil // sandboxd closed its end
		}
		if err != nil {
			return fmt.Errorf("read request: %w", err)
		}
		var req request
		if err := json.Unmarshal(buf[:n], &req); err != nil {
			return fmt.Errorf("bad request: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, pidfd := start(req)
			b, err := json.Marshal(resp)
			if err != nil {
				b, _ = json.Marshal(response{Seq: req.Seq, Error: err.Error()})
			}
			var oob []byte
			if pidfd >= 0 {
				oob = unix.UnixRights(pidfd)
				defer unix.Close(pidfd)
			}
			wmu.Lock()
			defer wmu.Unlock()
			_, _, _ = conn.WriteMsgUnix(b, oob, nil) // a sandboxd gone needs no answer
		}()
	}
}

// start creates and runs the container req asks for, returning its init's
// pid and a pidfd for it; on failure, nothing of the container is left.
func start(req request) (response, int) {
	fail := func(err error) (response, int) { return response{Seq: req.Seq, Error: err.Error()}, -1 }
	ctr, proc, err := Run(Spec{Root: req.Root, ID: req.ID, Config: req.Config, Args: req.Args, Env: req.Env, Cwd: req.Cwd, Log: req.Log})
	if err != nil {
		return fail(err)
	}
	// The init is this process's child and is reaped only below, after the
	// pidfd is open: the pid cannot name another process meanwhile.
	pid, err := proc.Pid()
	if err == nil {
		var fd int
		if fd, err = unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK); err == nil {
			go func() { _, _ = proc.Wait() }() // reap it when it exits
			return response{Seq: req.Seq, Pid: pid}, fd
		}
	}
	_ = ctr.Signal(unix.SIGKILL)
	_, _ = proc.Wait()
	_ = ctr.Destroy()
	return fail(fmt.Errorf("pidfd: %w", err))
}

// Run creates the container s describes and runs its init, from this
// process: what sandboxd-init does for a start request, and what the local
// backend does itself without one. On error nothing of the container is
// left. The caller reaps the init (proc.Wait).
func Run(s Spec) (*libcontainer.Container, *libcontainer.Process, error) {
	if s.Config == nil || s.Root == "" || s.ID == "" || len(s.Args) == 0 {
		return nil, nil, errors.New("incomplete start request")
	}
	logf, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("log: %w", err)
	}
	defer logf.Close()
	ctr, err := libcontainer.Create(s.Root, s.ID, s.Config)
	if err != nil {
		return nil, nil, fmt.Errorf("container: %w", err)
	}
	proc := &libcontainer.Process{
		Args: s.Args, Env: s.Env, Cwd: s.Cwd,
		Stdout: logf, Stderr: logf, Init: true,
		// The level logrus logs at here (info), as runc passes its own:
		// without it nsexec, the init's C half, logs at debug, some twenty
		// JSON lines through a pipe for this process to parse and drop at
		// every start.
		LogLevel: strconv.Itoa(int(logrus.GetLevel())),
	}
	if err := ctr.Run(proc); err != nil {
		closeExecFifo(s.Root, s.ID)
		_ = ctr.Destroy()
		return nil, nil, fmt.Errorf("start: %w", err)
	}
	return ctr, proc, nil
}

// closeExecFifo closes this process's descriptor of the exec fifo of
// container id under root, if it has one. libcontainer (v1.5) opens it
// (O_PATH) for every start and closes it only when the start succeeds, since
// runc exits after a failed one; sandboxd-init serves on, so every start
// whose init failed would leak a descriptor, which also keeps the state
// tmpfs busy (its unmount at Close fails). The descriptor stays open until
// closed here, so its number cannot be reused by another start meanwhile.
func closeExecFifo(root, id string) {
	if r, err := filepath.EvalSymlinks(root); err == nil {
		root = r // as the descriptor's link names it
	}
	path := filepath.Join(root, id, "exec.fifo")
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil &&
			(target == path || target == path+" (deleted)") {
			_ = unix.Close(fd)
		}
	}
}
