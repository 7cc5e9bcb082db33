package envdapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrPortNotOpen matches (errors.Is) a *StatusError for envd's 502: nothing
// accepts connections on the port. sandboxd's proxy answers it with E2B's
// "The sandbox is running but port is not open".
var ErrPortNotOpen = errors.New("port is not open")

// StatusError is envd refusing a tunnel.
type StatusError struct {
	StatusCode int
	Message    string // envd's JSON message, or the raw body
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("tunnel: envd answered %d: %s", e.StatusCode, e.Message)
}

// Is makes errors.Is(err, ErrPortNotOpen) true for a 502.
func (e *StatusError) Is(target error) bool {
	return target == ErrPortNotOpen && e.StatusCode == http.StatusBadGateway
}

// maxErrorBody bounds how much of a refusal Dial reads.
const maxErrorBody = 64 << 10

// Dial is the client side of envd's tunnel (see the package doc; the
// server side is envd/internal/tunnel). It opens a tunnel to 127.0.0.1:port
// inside the sandbox: it connects to envd with dialEnvd, performs the
// CONNECT handshake (with accessToken as X-Access-Token when non-empty) and
// returns the connection, now carrying the target's bytes. ctx bounds the connect and the handshake only, not the
// returned connection's life.
//
// The returned conn supports CloseWrite when the connection from dialEnvd
// does. A refusal is a *StatusError; errors.Is(err, ErrPortNotOpen) tells a
// closed port apart.
func Dial(ctx context.Context, dialEnvd func(ctx context.Context) (net.Conn, error), accessToken string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("tunnel: port %d out of range 1-65535", port)
	}
	// A token with CR or LF would let it inject headers.
	if strings.ContainsAny(accessToken, "\r\n\x00") {
		return nil, errors.New("tunnel: access token contains control characters")
	}
	conn, err := dialEnvd(ctx)
	if err != nil {
		return nil, fmt.Errorf("tunnel: dial envd: %w", err)
	}
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	// Cancelling ctx interrupts a handshake blocked on envd.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	c, err := handshake(conn, accessToken, port)
	if !stop() {
		// ctx ended: the deadline may already be in the past, whatever the
		// handshake's outcome.
		conn.Close()
		return nil, fmt.Errorf("tunnel: CONNECT to port %d: %w", port, context.Cause(ctx))
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return c, nil
}

// handshake sends the CONNECT request and reads envd's answer.
func handshake(conn net.Conn, accessToken string, port int) (net.Conn, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	req := "CONNECT " + addr + " HTTP/1.1\r\nHost: " + addr + "\r\n"
	if accessToken != "" {
		req += AccessTokenHeader + ": " + accessToken + "\r\n"
	}
	req += "\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, fmt.Errorf("tunnel: send CONNECT: %w", err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return nil, fmt.Errorf("tunnel: read CONNECT response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		msg := strings.TrimSpace(string(body))
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &e) == nil && e.Message != "" {
			msg = e.Message
		}
		if msg == "" {
			msg = resp.Status
		}
		return nil, &StatusError{StatusCode: resp.StatusCode, Message: msg}
	}
	// resp.Body is not read: after a 200 the stream is the target's, and
	// whatever br read past the header belongs to it.
	if n := br.Buffered(); n > 0 {
		early, _ := br.Peek(n)
		return &bufferedConn{Conn: conn, early: append([]byte(nil), early...)}, nil
	}
	return conn, nil
}

// bufferedConn replays bytes read past the CONNECT response before reading
// from the connection again.
type bufferedConn struct {
	net.Conn
	mu    sync.Mutex
	early []byte
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.early) > 0 {
		n := copy(p, c.early)
		c.early = c.early[n:]
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

// CloseWrite shuts down the write half when the underlying connection can.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("tunnel: %T cannot half-close: %w", c.Conn, errors.ErrUnsupported)
}
