// Package envdconn is what the runtime backends (runtime/local, incus) share
// to reach a sandbox's envd from the host: dialling envd's unix socket in a
// directory the sandbox can write to without being led to another socket
// (DialSocket), waiting for envd to answer /health after a create
// (WaitHealthy), and connecting to a port on the sandbox's loopback: envd
// itself or, through envd's CONNECT tunnel, any other port (Dial).
package envdconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/envd/tunnel"
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
// CONNECT tunnel (envd/tunnel) with accessToken, so a closed port fails with
// an error that errors.Is tunnel.ErrPortNotOpen, and an envd without the
// tunnel with runtime.ErrUnsupported.
func Dial(ctx context.Context, dialEnvd DialFunc, accessToken, id string, port int) (net.Conn, error) {
	if port == runtime.EnvdPort {
		c, err := dialEnvd(ctx)
		if err != nil {
			return nil, fmt.Errorf("dial sandbox %s: envd: %w", id, err)
		}
		return c, nil
	}
	c, err := tunnel.Dial(ctx, dialEnvd, accessToken, port)
	if err != nil {
		var se *tunnel.StatusError
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
}

// WaitHealthy polls envd's /health through dial until it answers 200 or 204,
// h.Exited is closed or ctx ends; the last two are runtime.ErrUnavailable.
func WaitHealthy(ctx context.Context, dial DialFunc, h Health) error {
	maxDelay := h.MaxDelay
	if maxDelay <= 0 {
		maxDelay = 5 * time.Millisecond
	}
	exited := "envd exited before answering"
	if h.LogHint != "" {
		exited += " (" + h.LogHint + ")"
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableKeepAlives: true,
	}}
	defer hc.CloseIdleConnections()
	delay := 500 * time.Microsecond
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://envd/health", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/health answered %s", resp.Status)
		}
		last = err
		select {
		case <-h.Exited:
			return fmt.Errorf("%w: %s: %v", runtime.ErrUnavailable, exited, last)
		case <-ctx.Done():
			return fmt.Errorf("%w: no answer from envd: %w (last: %v)", runtime.ErrUnavailable, ctx.Err(), last)
		case <-time.After(delay):
		}
		delay = min(delay*2, maxDelay)
	}
}
