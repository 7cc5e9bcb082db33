// Package tcpcut is a TCP forwarder for tests that can be cut: then it
// drops every connection and refuses new ones, as a network partition
// between a client and its server would.
package tcpcut

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy forwards connections on its loopback address to a target.
type Proxy struct {
	ln  net.Listener
	mu  sync.Mutex
	cs  []net.Conn
	off bool
}

// New starts a proxy to target (host:port), cut at t's cleanup.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln}
	t.Cleanup(p.Cut)
	go p.serve(target)
	return p
}

// URL returns rawURL (a postgres:// DSN, say) with its host replaced by
// the proxy's, so that a client given it connects through the proxy.
func (p *Proxy) URL(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

// Target returns the host:port of rawURL, for New.
func Target(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

func (p *Proxy) serve(target string) {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.off {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.cs = append(p.cs, c, s)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); s.Close() }()
		go func() { _, _ = io.Copy(c, s); c.Close() }()
	}
}

// Cut closes every connection and the listener.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.off = true
	p.ln.Close()
	for _, c := range p.cs {
		c.Close()
	}
	p.cs = nil
}
