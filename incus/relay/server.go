package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/certpin"
)

// ErrServerClosed is what Serve returns after Shutdown or Close.
var ErrServerClosed = errors.New("relay: server closed")

// ServerConfig is what a relay serves with.
type ServerConfig struct {
	// Certificate is the relay's own. On an Incus cluster member it is the
	// cluster certificate (/var/lib/incus/cluster.crt), which sandboxd
	// pins already to talk to Incus, and which every member shares.
	Certificate tls.Certificate
	// ClientCerts are the certificates (DER, certpin.DER) of the sandboxd
	// instances that may dial: one each, so that two can run side by side
	// or a new one be rolled in before the old is dropped.
	ClientCerts [][]byte
	// Allow are the prefixes targets must be in: the sandbox subnet.
	Allow []netip.Prefix
	// Mark, unless 0, is set (SO_MARK, which needs CAP_NET_ADMIN) on the
	// connections to targets: the member's firewall lets through only the
	// replies of connections so marked (egress.RelayMark).
	Mark uint32
	// RequestTimeout bounds the TLS handshake and the request line, and
	// the answer's write; DialTimeout the dial of the target. 0: 5 s.
	RequestTimeout, DialTimeout time.Duration
	// Log gets a warning per refused request and a debug line per pipe;
	// nil: slog.Default().
	Log *slog.Logger
	// Registerer, unless nil, gets the relay's metrics.
	Registerer prometheus.Registerer
}

// Server is the relay of a cluster member.
type Server struct {
	tls            *tls.Config
	allow          []netip.Prefix
	dialer         net.Dialer
	requestTimeout time.Duration
	log            *slog.Logger
	dials          *prometheus.CounterVec
	pipes          prometheus.Gauge

	// ctx ends with Close: it aborts handshakes and dials in flight.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	closing   bool // Shutdown or Close called
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{} // clients' and targets' connections
	active    int                   // handlers running
	wg        sync.WaitGroup        // Serve loops and handlers
}

// The results of sandboxd_relay_dials_total: "ok", "unauthenticated" (a
// failed handshake: no or an unpinned client certificate, or not TLS
// 1.3) or the code of the ERR answer.
const (
	resultOK              = "ok"
	resultUnauthenticated = "unauthenticated"
	// resultProbe: closed before the handshake (a liveness probe).
	resultProbe = "probe"
)

// NewServer checks cfg and makes its server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if len(cfg.Certificate.Certificate) == 0 {
		return nil, errors.New("relay: no server certificate")
	}
	if len(cfg.ClientCerts) == 0 {
		return nil, errors.New("relay: no pinned client certificate: nobody could dial")
	}
	if len(cfg.Allow) == 0 {
		return nil, errors.New("relay: no allowed prefix: nothing could be dialed")
	}
	s := &Server{
		requestTimeout: cfg.RequestTimeout,
		log:            cfg.Log,
		listeners:      map[net.Listener]struct{}{},
		conns:          map[net.Conn]struct{}{},
	}
	for _, p := range cfg.Allow {
		if !p.IsValid() || !p.Addr().Is4() {
			return nil, fmt.Errorf("relay: allowed prefix %s: want IPv4", p)
		}
		s.allow = append(s.allow, p.Masked())
	}
	if s.requestTimeout <= 0 {
		s.requestTimeout = 5 * time.Second
	}
	s.dialer.Timeout = cfg.DialTimeout
	if s.dialer.Timeout <= 0 {
		s.dialer.Timeout = 5 * time.Second
	}
	if cfg.Mark != 0 {
		mark := int(cfg.Mark)
		s.dialer.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, mark)
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("SO_MARK: %w", serr)
			}
			return nil
		}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	pins := make([][]byte, len(cfg.ClientCerts))
	copy(pins, cfg.ClientCerts)
	s.tls = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cfg.Certificate},
		// Any certificate, then the pin: sandboxd's are self-signed.
		ClientAuth: tls.RequireAnyClientCert,
		// VerifyConnection, not VerifyPeerCertificate: it runs on
		// resumed sessions too, so a ticket never outlives a pin.
		VerifyConnection: func(cs tls.ConnectionState) error {
			raw := make([][]byte, len(cs.PeerCertificates))
			for i, c := range cs.PeerCertificates {
				raw[i] = c.Raw
			}
			if !certpin.Match(raw, pins...) {
				return fmt.Errorf("client %w", certpin.ErrMismatch)
			}
			return nil
		},
	}
	s.dials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_relay_dials_total",
		Help: "Connections to the relay by outcome: ok, unauthenticated (TLS handshake failed: no or an unpinned client certificate), or the code of the relay's ERR answer (bad-request, forbidden, refused, timeout, unreachable, error).",
	}, []string{"result"})
	s.pipes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sandboxd_relay_pipes",
		Help: "Pipes open between sandboxd and sandboxes of this member.",
	})
	if cfg.Registerer != nil {
		s.dials = register(cfg.Registerer, s.dials)
		s.pipes = register(cfg.Registerer, s.pipes)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// register registers c, or returns the collector registered already under
// its name (a second server in one process, as in tests).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
	}
	return c
}

// Serve accepts connections on ln (plain TCP: the server does TLS) until
// Shutdown or Close, and then returns ErrServerClosed; ln is closed when
// Serve returns.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.isClosing() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) {
				// Out of descriptors, or a client gone before
				// accept: wait a little, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("relay: accept", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("relay: accept: %w", err)
		}
		backoff = 0
		if !s.track(c, true) {
			c.Close()
			return ErrServerClosed
		}
		go s.handle(c)
	}
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// track records c, to be closed by Close; handler says c starts a handler
// (counted for Shutdown and wg). It is false once the server is closing,
// and then c is not recorded.
func (s *Server) track(c net.Conn, handler bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing && (handler || s.conns == nil) {
		return false
	}
	s.conns[c] = struct{}{}
	if handler {
		s.active++
		s.wg.Add(1)
	}
	return true
}

func (s *Server) untrack(c net.Conn, handler bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	if handler {
		s.active--
		s.wg.Done()
	}
}

// Shutdown stops accepting and waits for the open connections to end, or
// for ctx: then it returns ctx's error and leaves them open (Close ends
// them).
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopAccepting()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		n := s.active
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Close stops accepting, closes every connection (the pipes end) and
// returns once every handler has.
func (s *Server) Close() error {
	s.stopAccepting()
	s.cancel()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.conns = nil // a target dialed from now on is closed at once
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) stopAccepting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for ln := range s.listeners {
		ln.Close()
	}
}

// handle serves one client connection: handshake, request, dial, answer,
// pipe.
func (s *Server) handle(raw net.Conn) {
	defer s.untrack(raw, true)
	defer raw.Close()
	peer := raw.RemoteAddr().String()
	_ = raw.SetDeadline(time.Now().Add(s.requestTimeout))
	tc := tls.Server(raw, s.tls)
	if err := tc.HandshakeContext(s.ctx); err != nil {
		if errors.Is(err, io.EOF) {
			// Closed before a ClientHello: sandboxd's liveness probe (a
			// TCP connect, incus/cluster.go), or a port scan.
			s.dials.WithLabelValues(resultProbe).Inc()
			s.log.Debug("relay: closed before the handshake", "peer", peer)
			return
		}
		s.dials.WithLabelValues(resultUnauthenticated).Inc()
		s.log.Warn("relay: refused", "peer", peer, "reason", "handshake: "+err.Error())
		return
	}
	target, err := readRequest(tc)
	if err != nil {
		s.refuse(tc, peer, netip.AddrPort{}, CodeBadRequest, err.Error())
		return
	}
	if !s.allowed(target.Addr()) {
		s.refuse(tc, peer, target, CodeForbidden, target.Addr().String()+" is outside the allowed prefixes")
		return
	}
	ctx, cancel := context.WithCancel(s.ctx) // the dialer has the timeout
	c, err := s.dialer.DialContext(ctx, "tcp4", target.String())
	cancel()
	if err != nil {
		s.refuse(tc, peer, target, dialCode(err), err.Error())
		return
	}
	up := c.(*net.TCPConn)
	if !s.track(up, false) {
		up.Close()
		return
	}
	defer s.untrack(up, false)
	defer up.Close()
	_ = raw.SetDeadline(time.Now().Add(s.requestTimeout))
	if _, err := io.WriteString(tc, "OK\n"); err != nil {
		s.log.Debug("relay: answer", "peer", peer, "target", target.String(), "err", err)
		return
	}
	_ = raw.SetDeadline(time.Time{})
	s.dials.WithLabelValues(resultOK).Inc()
	s.pipes.Inc()
	start := time.Now()
	toTarget, toClient := pipe(tc, raw, up)
	s.pipes.Dec()
	s.log.Debug("relay: pipe", "peer", peer, "target", target.String(),
		"bytes_to_target", toTarget, "bytes_to_client", toClient, "duration", time.Since(start))
}

// readRequest reads the request line a byte at a time: nothing past its
// newline is consumed, and a line longer than MaxRequestLine is refused
// without reading the rest.
func readRequest(c io.Reader) (netip.AddrPort, error) {
	var buf [MaxRequestLine]byte
	for n := 0; n < len(buf); n++ {
		if _, err := io.ReadFull(c, buf[n:n+1]); err != nil {
			return netip.AddrPort{}, fmt.Errorf("request: %w", err)
		}
		if buf[n] == '\n' {
			return parseRequest(string(buf[:n]))
		}
	}
	return netip.AddrPort{}, fmt.Errorf("request line longer than %d bytes", MaxRequestLine)
}

func (s *Server) allowed(a netip.Addr) bool {
	for _, p := range s.allow {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// refuse answers ERR, counts and logs it, and closes the connection
// gently: a reset, which closing with unread input would send (a too long
// request line), could reach the client before the answer and drop it.
func (s *Server) refuse(tc *tls.Conn, peer string, target netip.AddrPort, code, detail string) {
	s.dials.WithLabelValues(code).Inc()
	attrs := []any{"peer", peer, "reason", code + ": " + detail}
	if target.IsValid() {
		attrs = append(attrs, "target", target.String())
	}
	level := slog.LevelWarn
	if code == CodeRefused {
		// Nothing listens there (yet): what sandboxd's wait for a new
		// sandbox's envd meets until envd is up.
		level = slog.LevelDebug
	}
	s.log.Log(context.Background(), level, "relay: refused", attrs...)
	raw := tc.NetConn()
	_ = raw.SetDeadline(time.Now().Add(s.requestTimeout))
	if _, err := io.WriteString(tc, errLine(code, detail)); err != nil {
		return
	}
	_ = tc.CloseWrite()
	if tcp, ok := raw.(*net.TCPConn); ok {
		_ = tcp.CloseWrite()
	}
	// Until the client closes, briefly and boundedly.
	_ = raw.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.CopyN(io.Discard, raw, 64<<10)
}

// dialCode is the ERR code of a failed dial.
func dialCode(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return CodeRefused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return CodeUnreachable
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return CodeTimeout
	default:
		return CodeError
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// pipe copies between the client (tc over raw) and the target until both
// directions have ended, passing each end's half-close on to the other: a
// FIN from the target becomes a TLS close_notify, a close_notify (or FIN)
// from the client a FIN. An error in either direction ends both. It
// returns the bytes sent each way.
func pipe(tc *tls.Conn, raw net.Conn, up *net.TCPConn) (toTarget, toClient int64) {
	var abortOnce sync.Once
	abort := func() {
		abortOnce.Do(func() {
			raw.Close()
			up.Close()
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		if toTarget, err = copyCount(up, tc); err == nil {
			err = up.CloseWrite()
		}
		if err != nil {
			abort()
		}
	}()
	var err error
	if toClient, err = copyCount(tc, up); err == nil {
		err = tc.CloseWrite()
	}
	if err != nil {
		abort()
	}
	<-done
	return toTarget, toClient
}

// copyCount copies src to dst until src's EOF (nil) or an error.
func copyCount(dst io.Writer, src io.Reader) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var n int64
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return n, werr
			}
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}
