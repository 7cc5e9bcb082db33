package domainfilter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// session is one accepted proxy connection, from accept to close.
type session struct {
	client    net.Conn
	src       netip.Addr
	sandboxID string
	// Set under Filter.mu once known: host and port are what Recheck
	// re-evaluates; upstream is closed with the client.
	host     string
	port     uint16
	upstream net.Conn
	killed   bool
}

// accept takes the next connection of ln. ok is false once the filter
// stops; a nil conn with ok means try again (a failed accept, after a
// pause so that running out of descriptors does not spin).
func (f *Filter) accept(ln net.Listener, what string) (c net.Conn, ok bool) {
	c, err := ln.Accept()
	if err == nil {
		return c, true
	}
	if f.ctx.Err() != nil {
		return nil, false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, true
	}
	f.log.Warn(what, "err", err)
	select {
	case <-time.After(50 * time.Millisecond):
		return nil, true
	case <-f.ctx.Done():
		return nil, false
	}
}

func (f *Filter) serveProxy() {
	defer f.wg.Done()
	for {
		c, ok := f.accept(f.proxyLn, "proxy accept")
		if !ok {
			return
		}
		if c == nil {
			continue
		}
		s := &session{client: c, src: addrOf(c.RemoteAddr())}
		if !f.track(s) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(s)
			f.handle(s)
		}()
	}
}

// track registers a session so that Close and Recheck reach it; false
// once the filter is closed.
func (f *Filter) track(s *session) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.sessions[s] = struct{}{}
	return true
}

func (f *Filter) untrack(s *session) {
	f.mu.Lock()
	delete(f.sessions, s)
	f.mu.Unlock()
	s.client.Close()
}

// kill closes a session's connections; with reset, the client sees a
// reset rather than an orderly close.
func (f *Filter) kill(s *session, reset bool) {
	f.mu.Lock()
	s.killed = true
	up := s.upstream
	f.mu.Unlock()
	if reset {
		setLinger0(s.client)
	}
	s.client.Close()
	if up != nil {
		up.Close()
	}
}

func setLinger0(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}

func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return ip.Unmap()
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

func (f *Filter) handle(s *session) {
	id, _, ok := f.cfg.Sandboxes.Policy(s.src)
	if !ok {
		f.log.Debug("proxy: connection from no sandbox", "src", s.src)
		return
	}
	f.mu.Lock()
	s.sandboxID = id // Forget reads it
	f.mu.Unlock()
	dst, err := f.cfg.OriginalDst(s.client)
	if err != nil {
		f.log.Warn("proxy: no original destination", "sandbox_id", id, "err", err)
		f.deny(s, dst, "", protoTCP, "no original destination")
		return
	}
	head, proto, host := f.peek(s.client)
	if f.ctx.Err() != nil {
		return // closed while peeking: not the sandbox's doing
	}
	if host == "" {
		f.deny(s, dst, host, proto, "no hostname")
		return
	}
	if _, err := netip.ParseAddr(host); err == nil {
		// Addresses are for the CIDR rules (which nft applied before
		// redirecting here); a domain rule never allows one.
		f.deny(s, dst, host, proto, "hostname is an address")
		return
	}
	// Record host and port before asking the policy: any Recheck from
	// now on sees this session, and one that ran before missed it but
	// came after the policy changed, so the check below sees the change.
	f.mu.Lock()
	s.host, s.port = host, dst.Port()
	f.mu.Unlock()
	_, p, ok := f.cfg.Sandboxes.Policy(s.src)
	if !ok || !p.AllowsHost(host, dst.Port()) {
		f.deny(s, dst, host, proto, "no domain rule allows it")
		return
	}
	up, reason, err := f.dial(host, dst.Port())
	if err != nil {
		f.log.Debug("proxy: dial", "sandbox_id", id, "host", host, "err", err)
		f.deny(s, dst, host, proto, reason)
		return
	}
	f.mu.Lock()
	killed := s.killed
	s.upstream = up
	f.mu.Unlock()
	if killed {
		up.Close()
		return
	}
	f.decided(id, kindTCP, true, dst.String(), host, proto, "")
	f.live.Inc()
	defer f.live.Dec()
	f.pipe(s.client, up, head)
}

func (f *Filter) deny(s *session, dst netip.AddrPort, host, proto, reason string) {
	// Count before closing: whoever sees the reset sees the count.
	f.decided(s.sandboxID, kindTCP, false, dst.String(), host, proto, reason)
	setLinger0(s.client)
	s.client.Close()
}

// peek reads the start of the connection until it names a host, cannot,
// or the budget of time or bytes runs out. It returns what it read, to
// be replayed upstream.
func (f *Filter) peek(c net.Conn) (head []byte, proto, host string) {
	buf := make([]byte, 0, maxPeek)
	_ = c.SetReadDeadline(time.Now().Add(f.cfg.PeekTimeout))
	defer c.SetReadDeadline(time.Time{})
	proto = protoTCP
	for len(buf) < cap(buf) {
		n, rerr := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		var err error
		proto, host, err = sniff(buf)
		if err != errNeedMore {
			if err != nil {
				host = ""
			}
			return buf, proto, host
		}
		if rerr != nil {
			break
		}
	}
	return buf, proto, ""
}

// dial resolves host with the host's resolvers and connects to the first
// reachable address that answers. The reason is for the audit line.
func (f *Filter) dial(host string, port uint16) (net.Conn, string, error) {
	ctx, cancel := context.WithTimeout(f.ctx, 2*f.cfg.DialTimeout)
	defer cancel()
	addrs, err := f.lookupA(ctx, host)
	if err != nil {
		return nil, "does not resolve", fmt.Errorf("resolve %s: %w", host, err)
	}
	var ok []netip.Addr
	for _, a := range addrs {
		if f.cfg.Reachable(a) {
			ok = append(ok, a)
		}
	}
	if len(ok) == 0 {
		return nil, "resolves only to unreachable addresses", fmt.Errorf("%s resolves to no reachable address (%v)", host, addrs)
	}
	var errs []error
	for _, a := range ok {
		dctx, cancel := context.WithTimeout(f.ctx, f.cfg.DialTimeout)
		c, err := f.cfg.dial(dctx, "tcp4", netip.AddrPortFrom(a, port).String())
		cancel()
		if err == nil {
			return c, "", nil
		}
		errs = append(errs, err)
	}
	return nil, "no address answers", errors.Join(errs...)
}

// pipe replays head upstream, then copies both ways until both are done.
// Half-closes are passed on, so a client that shuts down its side still
// gets the answer. Between two *net.TCPConn io.Copy splices.
func (f *Filter) pipe(client, up net.Conn, head []byte) {
	defer up.Close()
	defer client.Close()
	if len(head) > 0 {
		if _, err := up.Write(head); err != nil {
			return
		}
	}
	done := make(chan struct{})
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer close(done)
		copyHalf(up, client)
	}()
	copyHalf(client, up)
	<-done
}

// copyHalf copies src to dst and shuts down dst's write side at EOF; on
// an error, it closes both, as the other direction is moot.
func copyHalf(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if err != nil {
		setLinger0(dst)
		dst.Close()
		src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	dst.Close()
	src.Close()
}

// originalDst reads where nft's redirect sent the connection at first.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination of a %T", c)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	var mreq *unix.IPv6Mreq
	var serr error
	err = rc.Control(func(fd uintptr) {
		// A sockaddr_in comes back; IPv6Mreq is just a buffer of the
		// right size for it.
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	b := mreq.Multiaddr
	port := uint16(b[2])<<8 | uint16(b[3])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port), nil
}
