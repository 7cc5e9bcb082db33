package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// upstreamSuffix ends the synthetic host of an upstream URL,
// `<id>-<port>.sandbox`. The transport pools connections by it, and its
// dialer decodes the sandbox and port from it; it is never resolved.
const upstreamSuffix = ".sandbox"

// DialFunc opens a stream to port inside sandbox id (Manager.DialSandbox).
type DialFunc func(ctx context.Context, id string, port int) (net.Conn, error)

// Upstream is an HTTP transport into sandboxes, over the lifecycle's dialer.
// It keeps connections alive per sandbox and port, and tracks every one it
// opened: a pooled connection to a sandbox that was paused would hang
// rather than fail, so the lifecycle layer's stop hook calls CloseSandbox.
type Upstream struct {
	dial DialFunc
	// count, when set, is told the bytes each connection carries
	// (DirectionIn: to the sandbox, DirectionOut: from it).
	count func(direction string, n int)
	tr    *http.Transport

	mu    sync.Mutex
	conns map[string]map[*upstreamConn]struct{} // by sandbox id
}

// NewUpstream returns a transport dialing through dial; count, when set,
// is told the bytes every connection carries.
func NewUpstream(dial DialFunc, count func(direction string, n int)) *Upstream {
	u := &Upstream{dial: dial, count: count, conns: map[string]map[*upstreamConn]struct{}{}}
	var protocols http.Protocols
	protocols.SetHTTP1(true) // envd and user ports are spoken to in HTTP/1.1
	u.tr = &http.Transport{
		DialContext: u.dialUpstream,
		Protocols:   &protocols,
		// Pass bodies through untouched: transparent gzip would change
		// them and buffer streams.
		DisableCompression:    true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return u
}

// Transport sends requests to URLs made by BaseURL.
func (u *Upstream) Transport() http.RoundTripper { return u.tr }

// BaseURL is the URL of port inside sandbox id, for requests sent through u.
func (u *Upstream) BaseURL(id string, port int) string {
	return "http://" + upstreamHost(id, port)
}

func upstreamHost(id string, port int) string {
	return id + "-" + strconv.Itoa(port) + upstreamSuffix
}

// parseUpstreamHost decodes upstreamHost's output, with or without a port.
func parseUpstreamHost(addr string) (id string, port int, ok bool) {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		addr = h
	}
	label, ok := strings.CutSuffix(addr, upstreamSuffix)
	if !ok {
		return "", 0, false
	}
	id, ps, ok := strings.Cut(label, "-")
	if !ok || !validSandboxID(id) {
		return "", 0, false
	}
	port, err := parsePort(ps)
	if err != nil {
		return "", 0, false
	}
	return id, port, true
}

// dialUpstream is the transport's dialer: it opens a connection into the
// sandbox named by the synthetic host.
func (u *Upstream) dialUpstream(ctx context.Context, _, addr string) (net.Conn, error) {
	id, port, ok := parseUpstreamHost(addr)
	if !ok {
		return nil, fmt.Errorf("proxy: unexpected upstream address %q", addr)
	}
	c, err := u.dial(ctx, id, port)
	if err != nil {
		return nil, err
	}
	uc := &upstreamConn{Conn: c, u: u, id: id}
	u.mu.Lock()
	set := u.conns[id]
	if set == nil {
		set = map[*upstreamConn]struct{}{}
		u.conns[id] = set
	}
	set[uc] = struct{}{}
	u.mu.Unlock()
	return uc, nil
}

// CloseSandbox closes every connection to sandbox id, idle or in use:
// requests and streams through them fail, and the next request dials
// afresh (and so resumes a paused sandbox, or fails for a dead one).
func (u *Upstream) CloseSandbox(id string) {
	u.mu.Lock()
	set := u.conns[id]
	delete(u.conns, id)
	u.mu.Unlock()
	for c := range set {
		_ = c.Close()
	}
}

// Close closes all connections, including upgraded ones that
// http.Server.Shutdown does not see.
func (u *Upstream) Close() {
	u.tr.CloseIdleConnections()
	u.mu.Lock()
	all := u.conns
	u.conns = map[string]map[*upstreamConn]struct{}{}
	u.mu.Unlock()
	for _, set := range all {
		for c := range set {
			_ = c.Close()
		}
	}
}

// upstreamConn is a connection into a sandbox: it counts the bytes it
// carries and leaves its upstream's set when closed.
type upstreamConn struct {
	net.Conn
	u    *Upstream
	id   string
	once sync.Once
}

func (c *upstreamConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.u.count != nil {
		c.u.count(DirectionOut, n)
	}
	return n, err
}

func (c *upstreamConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.u.count != nil {
		c.u.count(DirectionIn, n)
	}
	return n, err
}

func (c *upstreamConn) Close() error {
	c.once.Do(func() {
		c.u.mu.Lock()
		if set := c.u.conns[c.id]; set != nil {
			delete(set, c)
			if len(set) == 0 {
				delete(c.u.conns, c.id)
			}
		}
		c.u.mu.Unlock()
	})
	return c.Conn.Close()
}
