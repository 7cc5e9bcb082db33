// Package envdconn is the control plane's one client of envd, over envd's
// wire contract (envd/api). The runtime backends (runtime/local, incus) use
// it to reach a sandbox's envd from the host: dialling envd's unix socket in
// a directory the sandbox can write to without being led to another socket
// (DialSocket), waiting for envd to answer /health after a create
// (WaitHealthy), and connecting to a port on the sandbox's loopback: envd
// itself or, through envd's CONNECT tunnel, any other port (Dial). Above a
// backend's dial, the sandbox manager sends single control requests (Ask:
// /health, /init; a Keeper keeps a warm member's connection from its health
// check to its claim's /init), reads envd's own log records (Logs) and the
// API serves exec and files through a Client.
package envdconn

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/runtime"
)

// DialFunc connects to a sandbox's envd.
type DialFunc = func(ctx context.Context) (net.Conn, error)

// DialSocket connects to envd's unix socket at path, of sandbox id. The
// socket's directory is writable by root inside the sandbox, which could
// replace the socket with a symlink to a host socket (resolved in the host's
// namespace by connect): so the socket is opened with O_PATH|O_NOFOLLOW,
// checked to be a socket, and connected through its /proc/self/fd link,
// which names that inode only.
func DialSocket(ctx context.Context, path, id string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("open envd.sock", err)}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, os.NewSyscallError("fstat envd.sock", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("envd.sock in sandbox %s is not a socket (mode %#o)", id, st.Mode)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", fd))
}

// CheckPort reports a port out of 1-65535 as runtime.ErrInvalidSpec, for
// Dial of sandbox id.
func CheckPort(id string, port int) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("dial sandbox %s: %w: port %d", id, runtime.ErrInvalidSpec, port)
	}
	return nil
}

// Dial connects to port on the loopback of sandbox id, whose envd dialEnvd
// reaches: runtime.EnvdPort is envd itself; other ports go through envd's
// CONNECT tunnel (envdapi.Dial) with accessToken, so a closed port fails
// with an error that errors.Is envdapi.ErrPortNotOpen, and an envd without the
// tunnel with runtime.ErrUnsupported.
func Dial(ctx context.Context, dialEnvd DialFunc, accessToken, id string, port int) (net.Conn, error) {
	if port == runtime.EnvdPort {
		c, err := dialEnvd(ctx)
		if err != nil {
			return nil, fmt.Errorf("dial sandbox %s: envd: %w", id, err)
		}
		return c, nil
	}
	c, err := envdapi.Dial(ctx, dialEnvd, accessToken, port)
	if err != nil {
		var se *envdapi.StatusError
		if errors.As(err, &se) && se.StatusCode == http.StatusNotImplemented {
			err = fmt.Errorf("%w: %w", runtime.ErrUnsupported, err)
		}
		return nil, fmt.Errorf("dial sandbox %s port %d: %w", id, port, err)
	}
	return c, nil
}

// Health says how WaitHealthy waits.
type Health struct {
	// Exited, if not nil, is closed when envd's init exits: the wait ends
	// at once with runtime.ErrUnavailable.
	Exited <-chan struct{}
	// LogHint, if set, tells in the error for Exited where envd's log is.
	LogHint string
	// MaxDelay caps the interval between polls, which starts at 0.5 ms and
	// doubles; zero means 5 ms.
	MaxDelay time.Duration
	// Socket, if set, is the host path of the unix socket envd listens on.
	// WaitHealthy then watches its directory (inotify) and asks /health as
	// soon as the socket appears, instead of polling for it: envd makes the
	// socket appear only once it accepts (see cmd/envd). Until then it polls
	// every SlowPoll only, as a fallback for an event it cannot see (the
	// socket made before the watch, a directory it cannot watch); once the
	// socket exists and still does not answer, it polls as without Socket.
	Socket string
	// SlowPoll is the fallback interval while Socket does not exist; zero
	// means 25 ms.
	SlowPoll time.Duration
	// Init, if set, makes the probe POST /init with this body instead of
	// GET /health, so that the wait ends with envd initialized. An answer
	// other than 204 or 200 ends the wait with an error: envd is up, and
	// refused the body.
	Init []byte
}

// WaitHealthy asks envd's /health (or posts h.Init to /init) through dial
// until it answers 200 or 204, h.Exited is closed or ctx ends; the last two
// are runtime.ErrUnavailable.
func WaitHealthy(ctx context.Context, dial DialFunc, h Health) error {
	maxDelay := h.MaxDelay
	if maxDelay <= 0 {
		maxDelay = 5 * time.Millisecond
	}
	slow := h.SlowPoll
	if slow <= 0 {
		slow = 25 * time.Millisecond
	}
	exited := "envd exited before answering"
	if h.LogHint != "" {
		exited += " (" + h.LogHint + ")"
	}
	var appeared <-chan struct{}
	if h.Socket != "" {
		w, err := watchFor(h.Socket)
		if err == nil {
			defer w.close()
			appeared = w.appeared
		}
	}
	delay := 500 * time.Microsecond
	var last error
	method, path := http.MethodGet, "/health"
	if h.Init != nil {
		method, path = http.MethodPost, "/init"
	}
	for {
		status, msg, err := Ask(ctx, dial, method, path, h.Init)
		if err == nil {
			if err = Answered(path, status, msg); err == nil {
				return nil
			}
			if h.Init != nil {
				return err // envd is up, and refused the body
			}
		}
		last = err
		wait := delay
		if appeared != nil {
			if _, err := os.Lstat(h.Socket); err == nil {
				// There, but not answering (an envd that binds before
				// it listens, or a stale socket): poll it.
				appeared = nil
			} else {
				wait = slow
			}
		}
		timer := time.NewTimer(wait)
		select {
		case <-h.Exited:
			timer.Stop()
			return fmt.Errorf("%w: %s: %v", runtime.ErrUnavailable, exited, last)
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w: no answer from envd: %w (last: %v)", runtime.ErrUnavailable, ctx.Err(), last)
		case <-appeared:
			timer.Stop()
			appeared = nil
		case <-timer.C:
			if appeared == nil {
				delay = min(delay*2, maxDelay)
			}
		}
	}
}

// Ask sends one request to envd on a connection of its own from dial, and
// returns the answer's status and the first 4 KiB of its body (a JSON body,
// when given). It is net/http's client without its Transport (a pool, and
// two goroutines per connection), which a caller that uses each connection
// once has no use for: the readiness probe is on every create's way.
func Ask(ctx context.Context, dial DialFunc, method, path string, body []byte) (int, []byte, error) {
	req, err := newAsk(ctx, method, path, body)
	if err != nil {
		return 0, nil, err
	}
	return exchange(ctx, dial, req, askLimit)
}

// askLimit is how much of an answer to Ask is read.
const askLimit = 4096

// newAsk is Ask's request: body, if not nil, is JSON.
func newAsk(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, baseURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// exchange sends req on a connection of its own from dial and returns the
// answer's status and up to limit bytes of its body.
func exchange(ctx context.Context, dial DialFunc, req *http.Request, limit int64) (int, []byte, error) {
	c, err := dial(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	req.Close = true
	status, msg, _, err := roundTrip(ctx, c, req, limit)
	return status, msg, err
}

// roundTrip sends req on c and reads envd's answer: its status and up to
// limit bytes of its body. keep says c can carry another request: envd
// left it open, the whole answer was read, nothing else came, and ctx did
// not end meanwhile (which leaves a deadline on c).
func roundTrip(ctx context.Context, c net.Conn, req *http.Request, limit int64) (status int, msg []byte, keep bool, err error) {
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	if err := req.Write(c); err != nil {
		stop()
		return 0, nil, false, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		stop()
		return 0, nil, false, err
	}
	msg, err = io.ReadAll(io.LimitReader(resp.Body, limit))
	// One byte more than the limit: the body was longer, and the rest
	// would be read as the next answer.
	var more [1]byte
	n, _ := resp.Body.Read(more[:])
	_ = resp.Body.Close()
	untouched := stop()
	if err != nil {
		return 0, nil, false, err
	}
	keep = untouched && !req.Close && !resp.Close && n == 0 && br.Buffered() == 0
	return resp.StatusCode, msg, keep, nil
}

// maxLogsAnswer bounds the answer of GET /logs that Logs reads: envd's
// ring holds a few hundred KiB (logring.DefaultBytes) at most, which JSON
// less than doubles.
const maxLogsAnswer = 4 << 20

// Logs reads envd's log records after seq of its run boot (envdapi.LogsPath)
// on a connection of its own from dial: the control plane's periodic copy
// of them into the sandbox's log.
func Logs(ctx context.Context, dial DialFunc, accessToken, boot string, seq uint64) (envdapi.LogsResponse, error) {
	q := url.Values{"after": {strconv.FormatUint(seq, 10)}}
	if boot != "" {
		q.Set("boot", boot)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+envdapi.LogsPath+"?"+q.Encode(), nil)
	if err != nil {
		return envdapi.LogsResponse{}, err
	}
	envdapi.SetAuth(req.Header, accessToken, "")
	status, body, err := exchange(ctx, dial, req, maxLogsAnswer)
	if err != nil {
		return envdapi.LogsResponse{}, err
	}
	if status == http.StatusNotFound {
		// An envd from before the route: nothing to read, not a failure
		// to report each pass.
		return envdapi.LogsResponse{}, fmt.Errorf("envd %s: %w", envdapi.LogsPath, runtime.ErrUnsupported)
	}
	if status != http.StatusOK {
		return envdapi.LogsResponse{}, Answered(envdapi.LogsPath, status, body)
	}
	var out envdapi.LogsResponse
	if err := json.Unmarshal(body, &out); err != nil {
		return envdapi.LogsResponse{}, fmt.Errorf("envd %s: %w", envdapi.LogsPath, err)
	}
	return out, nil
}

// Answered is nil for envd's 200 and 204 answers to path, and otherwise an
// error that quotes the answer.
func Answered(path string, status int, msg []byte) error {
	if status == http.StatusNoContent || status == http.StatusOK {
		return nil
	}
	return fmt.Errorf("envd %s: %d %s: %s", path, status, http.StatusText(status), bytes.TrimSpace(msg))
}

// One inotify instance serves every wait, for the life of the process:
// closing an instance waits for an SRCU grace period in the kernel
// (fsnotify's group teardown), 15-20 ms here, longer than the wait itself,
// while removing a watch does not wait.
var (
	inotifyOnce sync.Once
	inotify     *notifier
	inotifyErr  error
)

// notifier dispatches the events of the shared inotify instance to the
// waits on each watched directory.
type notifier struct {
	f  *os.File
	fd int
	mu sync.Mutex
	// waits holds, per watch descriptor (one per directory: adding a
	// watch on a watched directory returns the same one), the file names
	// waited for and the channels to close when they appear.
	waits map[int32]map[*socketWatch]struct{}
}

// socketWatch reports, by closing appeared, when a file named like its
// socket is created in or moved into the socket's directory.
type socketWatch struct {
	n        *notifier
	wd       int32
	name     string
	appeared chan struct{}
	closed   bool // appeared is closed; under n.mu
}

func watchFor(socket string) (*socketWatch, error) {
	inotifyOnce.Do(func() { inotify, inotifyErr = newNotifier() })
	if inotifyErr != nil {
		return nil, inotifyErr
	}
	n := inotify
	dir, name := filepath.Split(filepath.Clean(socket))
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.waits == nil {
		return nil, errors.New("inotify reader ended")
	}
	wd, err := unix.InotifyAddWatch(n.fd, filepath.Clean(dir), unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR)
	if err != nil {
		return nil, os.NewSyscallError("inotify_add_watch", err)
	}
	w := &socketWatch{n: n, wd: int32(wd), name: name, appeared: make(chan struct{})}
	if n.waits[w.wd] == nil {
		n.waits[w.wd] = map[*socketWatch]struct{}{}
	}
	n.waits[w.wd][w] = struct{}{}
	return w, nil
}

func newNotifier() (*notifier, error) {
	// Non-blocking, so the reader waits in the runtime's poller, not on a
	// thread of its own.
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	n := &notifier{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, waits: map[int32]map[*socketWatch]struct{}{}}
	go n.read()
	return n, nil
}

// read runs for the life of the process.
func (n *notifier) read() {
	buf := make([]byte, 64<<10)
	for {
		c, err := n.f.Read(buf)
		if err != nil || c <= 0 {
			n.fail()
			return
		}
		n.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= c; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			for w := range n.waits[ev.Wd] {
				// IN_IGNORED: the directory is gone; the wait ends one
				// way or the other on its next try.
				if name == w.name || ev.Mask&unix.IN_IGNORED != 0 {
					w.wake()
				}
			}
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				n.wakeAll()
			}
		}
		n.mu.Unlock()
	}
}

// fail wakes every wait and lets later ones fall back to polling.
func (n *notifier) fail() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.wakeAll()
	n.waits = nil // watchFor fails from now on
}

func (n *notifier) wakeAll() {
	for _, ws := range n.waits {
		for w := range ws {
			w.wake()
		}
	}
}

// wake closes appeared once; n.mu is held.
func (w *socketWatch) wake() {
	if !w.closed {
		w.closed = true
		close(w.appeared)
	}
}

// close ends the wait, removing the directory's watch once nobody else
// waits on it.
func (w *socketWatch) close() {
	n := w.n
	n.mu.Lock()
	defer n.mu.Unlock()
	ws := n.waits[w.wd]
	delete(ws, w)
	if len(ws) == 0 && n.waits != nil {
		delete(n.waits, w.wd)
		_, _ = unix.InotifyRmWatch(n.fd, uint32(w.wd))
	}
}
