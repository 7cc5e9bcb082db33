// Package tunnel lets sandboxd reach any TCP port on the sandbox's loopback
// through envd: an HTTP CONNECT to 127.0.0.1:<port> becomes a raw byte pipe.
//
// The protocol is envd's wire contract, described in envdapi (envd/api),
// which holds its client side, Dial.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// dialTimeout bounds connecting to the target. Loopback connects answer at
// once unless the listener's backlog is full.
const dialTimeout = 10 * time.Second

// connectOK is the whole success response: no headers, no body framing.
const connectOK = "HTTP/1.1 200 OK\r\n\r\n"

// Handler serves CONNECT requests.
type Handler struct {
	log    *slog.Logger
	dialer net.Dialer

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // both ends of every open tunnel
	wg     sync.WaitGroup        // one per request in ServeHTTP
}

// New returns the tunnel handler.
func New(log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	return &Handler{
		log:    log,
		dialer: net.Dialer{Timeout: dialTimeout},
		conns:  map[net.Conn]struct{}{},
	}
}

// Close ends every open tunnel, refuses new ones, and waits until all
// handler goroutines have returned. Hijacked connections are invisible to
// http.Server.Shutdown, so envd calls this on shutdown.
func (h *Handler) Close() {
	h.mu.Lock()
	h.closed = true
	for c := range h.conns {
		c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// begin registers a request; false once Close has been called.
func (h *Handler) begin() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.wg.Add(1)
	return true
}

// track records c so Close can end its tunnel; false (and c closed) when
// Close already ran.
func (h *Handler) track(c net.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		c.Close()
		return false
	}
	h.conns[c] = struct{}{}
	return true
}

func (h *Handler) untrack(cs ...net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cs {
		delete(h.conns, c)
	}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		w.Header().Set("Allow", http.MethodConnect)
		rpcerr.WriteJSON(w, http.StatusMethodNotAllowed, "the tunnel only serves CONNECT")
		return
	}
	// For CONNECT, net/http puts the request-target authority in URL.Host
	// (HTTP/1.1) or the :authority pseudo-header there (HTTP/2); a Host
	// header cannot override it.
	target, err := ParseTarget(r.URL.Host)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, ErrNotLoopback) {
			status = http.StatusForbidden
		}
		h.log.Debug("tunnel refused", "target", r.URL.Host, "err", err)
		rpcerr.WriteJSON(w, status, err.Error())
		return
	}
	if !h.begin() {
		rpcerr.WriteJSON(w, http.StatusServiceUnavailable, "envd is shutting down")
		return
	}
	defer h.wg.Done()

	upstream, err := h.dial(r.Context(), target)
	if err != nil {
		h.log.Debug("tunnel target unreachable", "target", target, "err", err)
		msg := target.String() + ": port is not open"
		if !errors.Is(err, syscall.ECONNREFUSED) {
			msg += " (" + err.Error() + ")"
		}
		rpcerr.WriteJSON(w, http.StatusBadGateway, msg)
		return
	}
	if !h.track(upstream) {
		rpcerr.WriteJSON(w, http.StatusServiceUnavailable, "envd is shutting down")
		return
	}
	defer h.untrack(upstream)

	if r.ProtoMajor >= 2 {
		h.serveStream(w, r, target, upstream)
		return
	}
	h.serveHijacked(w, target, upstream)
}

// dial connects to the target's addresses in order and returns the first
// success, or the first error.
func (h *Handler) dial(ctx context.Context, t Target) (net.Conn, error) {
	var first error
	for _, addr := range t.addrs() {
		c, err := h.dialer.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
	}
	return nil, first
}

// serveHijacked takes over an HTTP/1.x connection and pipes it to upstream.
func (h *Handler) serveHijacked(w http.ResponseWriter, target Target, upstream net.Conn) {
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		upstream.Close()
		h.log.Error("tunnel: cannot take over the connection", "err", err)
		rpcerr.WriteJSON(w, http.StatusInternalServerError, "tunnel: cannot take over the connection: "+err.Error())
		return
	}
	if !h.track(client) {
		upstream.Close()
		return
	}
	defer h.untrack(client)
	// Read and write deadlines the server set for the request must not cut
	// a long-lived tunnel short.
	_ = client.SetDeadline(time.Time{})
	if _, err := io.WriteString(client, connectOK); err != nil {
		client.Close()
		upstream.Close()
		return
	}
	// The server may have read past the request: those bytes are the start
	// of the client's stream.
	var early []byte
	if n := brw.Reader.Buffered(); n > 0 {
		early, _ = brw.Reader.Peek(n)
	}
	h.log.Debug("tunnel open", "target", target)
	up, down := pipe(client, upstream, early)
	h.log.Debug("tunnel closed", "target", target, "bytes_up", up, "bytes_down", down)
}

// closeWriter is a connection whose write half can be shut down alone
// (*net.TCPConn, *net.UnixConn, *tls.Conn and Dial's wrapper).
type closeWriter interface {
	CloseWrite() error
}

// pipe copies client->upstream (after early) and upstream->client until both
// directions end, then closes both. It returns the bytes each way.
func pipe(client, upstream net.Conn, early []byte) (up, down int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		// Ends when the client's direction does: EOF, an error, or the
		// other direction tearing both connections down.
		defer wg.Done()
		up = forward(upstream, client, early)
	}()
	down = forward(client, upstream, nil)
	wg.Wait()
	client.Close()
	upstream.Close()
	return up, down
}

// forward copies src to dst. On EOF it passes the half-close on to dst and
// leaves the other direction running; on any error (or a dst that cannot
// half-close) it closes both connections so the other direction ends too.
func forward(dst, src net.Conn, early []byte) int64 {
	var n int64
	var err error
	if len(early) > 0 {
		var m int
		m, err = dst.Write(early)
		n += int64(m)
	}
	if err == nil {
		var m int64
		m, err = io.Copy(dst, src)
		n += m
	}
	if err == nil {
		if cw, ok := dst.(closeWriter); ok && cw.CloseWrite() == nil {
			return n
		}
	}
	dst.Close()
	src.Close()
	return n
}

// serveStream serves CONNECT over HTTP/2, where the connection cannot be
// hijacked: the request body flows to upstream, upstream to the response.
func (h *Handler) serveStream(w http.ResponseWriter, r *http.Request, target Target, upstream net.Conn) {
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		upstream.Close()
		return
	}
	h.log.Debug("tunnel open", "target", target, "proto", r.Proto)
	var wg sync.WaitGroup
	wg.Add(1)
	var up int64
	go func() {
		// Ends at the client's END_STREAM, or when the handler closes the
		// body below.
		defer wg.Done()
		var err error
		up, err = io.Copy(upstream, r.Body)
		if err == nil {
			if cw, ok := upstream.(closeWriter); ok && cw.CloseWrite() == nil {
				return
			}
		}
		upstream.Close()
	}()
	down, _ := io.Copy(flushWriter{w, rc}, upstream)
	// Returning ends the stream both ways; unblock the reader first.
	upstream.Close()
	r.Body.Close()
	wg.Wait()
	h.log.Debug("tunnel closed", "target", target, "bytes_up", up, "bytes_down", down)
}

// flushWriter sends every write at once: a tunnel must not sit on bytes the
// other side is waiting for.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err != nil {
		return n, err
	}
	if err := f.rc.Flush(); err != nil {
		return n, fmt.Errorf("flush: %w", err)
	}
	return n, nil
}
