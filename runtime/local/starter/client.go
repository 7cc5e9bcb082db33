package starter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// ErrUnavailable is the error of a start that no helper answered: it could
// not be started, or it exited first. Nothing of the container was made by
// it, or what was is the caller's to remove; the next Start starts a new
// helper.
var ErrUnavailable = errors.New("sandboxd-init unavailable")

// Client starts containers through one sandboxd-init process, started by
// Spawn or on first use, and again after it exits.
type Client struct {
	path string

	mu      sync.Mutex
	conn    *net.UnixConn // nil: no helper running
	pid     int
	done    chan struct{} // closed when the current helper's reader ends
	seq     uint64
	pending map[uint64]chan result
	closed  bool
}

type result struct {
	pid   int
	pidfd *os.File
	err   error
}

// New returns a Client for the sandboxd-init binary at path.
func New(path string) *Client {
	warmJSON()
	return &Client{path: path, pending: map[uint64]chan result{}}
}

// Spec is one container to start: libcontainer.Create(Root, ID, Config) and
// Run of an init with Args, Env and Cwd, its output appended to Log.
type Spec struct {
	Root, ID string
	Config   *configs.Config
	Args     []string
	Env      []string
	Cwd      string
	Log      string
}

// Start starts the container s describes and returns its init's pid and a
// channel closed when that init exits. On error nothing of the container is
// left. ctx is checked before the start only: once asked, the helper
// finishes it, and Start returns what it did.
func (c *Client) Start(ctx context.Context, s Spec) (pid int, exited <-chan struct{}, err error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	c.mu.Lock()
	if err := c.running(); err != nil {
		c.mu.Unlock()
		return 0, nil, err
	}
	c.seq++
	seq, conn := c.seq, c.conn
	ch := make(chan result, 1)
	c.pending[seq] = ch
	c.mu.Unlock()
	// Outside the lock: concurrent creates marshal their configs at once,
	// and a packet is sent whole by one write.
	b, err := json.Marshal(request{Seq: seq, Root: s.Root, ID: s.ID, Config: s.Config, Args: s.Args, Env: s.Env, Cwd: s.Cwd, Log: s.Log})
	if err == nil && len(b) > maxMessage {
		err = fmt.Errorf("sandboxd-init: start request of %d bytes", len(b))
	}
	if err == nil {
		if _, _, err = conn.WriteMsgUnix(b, nil, nil); err != nil {
			err = fmt.Errorf("%w: send: %w", ErrUnavailable, err)
		}
	}
	if err != nil {
		c.forget(seq)
		return 0, nil, err
	}
	// The answer is awaited even when ctx ends meanwhile, as an in-process
	// Container.Run would be: what the caller undoes must be all there is,
	// not a start the helper is still making. The helper answers every
	// request, or exits and read fails it.
	r := <-ch
	if r.err != nil {
		return 0, nil, r.err
	}
	return r.pid, WatchExit(r.pidfd), nil
}

// Spawn starts the helper now, unless one runs already, so that the first
// Start does not wait for it: waiting for the helper's own start (its
// re-execution from a sealed copy, its Go runtime) made a backend's first
// create take 27 ms instead of 16-20. A helper that cannot start is
// reported here and tried again at the next Start.
func (c *Client) Spawn() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running()
}

// running makes sure a helper runs, starting one unless the client is
// closed. Called with mu held.
func (c *Client) running() error {
	if c.closed {
		return fmt.Errorf("%w: client closed", ErrUnavailable)
	}
	if c.conn != nil {
		return nil
	}
	return c.spawn()
}

// forget drops request seq, which was not sent.
func (c *Client) forget(seq uint64) {
	c.mu.Lock()
	delete(c.pending, seq)
	c.mu.Unlock()
}

// spawn starts a helper. Called with mu held.
func (c *Client) spawn() error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: socketpair: %w", ErrUnavailable, err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "sandboxd-init"), os.NewFile(uintptr(fds[1]), "sandboxd-init")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	conn := fc.(*net.UnixConn)
	cmd := exec.Command(c.path, Arg)
	cmd.ExtraFiles = []*os.File{theirs} // fd 3
	cmd.Stderr = os.Stderr              // libcontainer's own warnings
	// Its own process group: a ^C to sandboxd's group leaves it to exit
	// when sandboxd closes the socket, after the starts under way.
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		conn.Close()
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	c.conn, c.pid = conn, cmd.Process.Pid
	c.done = make(chan struct{})
	go c.read(conn, cmd, c.done)
	return nil
}

// read delivers the helper's answers until it exits, then fails what is
// still pending, so that the next Start spawns a new helper.
func (c *Client) read(conn *net.UnixConn, cmd *exec.Cmd, done chan struct{}) {
	defer close(done)
	buf := make([]byte, maxMessage)
	oob := make([]byte, unix.CmsgSpace(4))
	var err error
	for {
		var n, oobn int
		n, oobn, _, _, err = conn.ReadMsgUnix(buf, oob)
		if n == 0 && (err == nil || errors.Is(err, io.EOF)) {
			err = errors.New("closed its socket")
		}
		if err != nil {
			break
		}
		var resp response
		if err = json.Unmarshal(buf[:n], &resp); err != nil {
			break
		}
		r := result{pid: resp.Pid}
		if resp.Error != "" {
			r.err = errors.New(resp.Error)
		} else if r.pidfd, r.err = pidfdFrom(oob[:oobn]); r.err == nil && r.pidfd == nil {
			r.err = errors.New("sandboxd-init: start answered without a pidfd")
		}
		c.mu.Lock()
		ch, ok := c.pending[resp.Seq]
		delete(c.pending, resp.Seq)
		c.mu.Unlock()
		if !ok { // only sent requests are pending until answered
			if r.pidfd != nil {
				r.pidfd.Close()
			}
			err = fmt.Errorf("answer to request %d, which is not pending", resp.Seq)
			break
		}
		ch <- r
	}
	conn.Close()
	werr := cmd.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == conn {
		c.conn = nil
	}
	for seq, ch := range c.pending {
		ch <- result{err: fmt.Errorf("%w: it exited (%v) before answering: %w", ErrUnavailable, werr, err)}
		delete(c.pending, seq)
	}
}

func pidfdFrom(oob []byte) (*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var f *os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if f == nil {
				f = os.NewFile(uintptr(fd), "pidfd")
			} else {
				unix.Close(fd)
			}
		}
	}
	return f, nil
}

// WatchExit returns a channel closed when the process of pidfd exits, and
// closes pidfd then (it reaps nothing). The
// pidfd is nonblocking, so Go's poller waits for it (no thread per sandbox).
func WatchExit(pidfd *os.File) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer pidfd.Close()
		exited := func(fd uintptr) bool {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return err == nil && n > 0
		}
		rc, err := pidfd.SyscallConn()
		if err == nil {
			if err = rc.Read(exited); err == nil {
				return
			}
		}
		// Not pollable here: wait on a thread of its own.
		for {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd.Fd()), Events: unix.POLLIN}}, -1)
			if n > 0 || (err != nil && err != unix.EINTR) {
				return
			}
		}
	}()
	return ch
}

// Close closes the socket, so that the helper exits once the starts under
// way are done, and waits for it. Containers it started live on.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	conn, done := c.conn, c.done
	c.mu.Unlock()
	if conn == nil {
		return nil
	}
	// Shut down the write side only: the reader still takes the answers.
	_ = conn.CloseWrite()
	<-done
	return nil
}

// Pid is the running helper's pid, or 0; for tests.
func (c *Client) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return 0
	}
	return c.pid
}
