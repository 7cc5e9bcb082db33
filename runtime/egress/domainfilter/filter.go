package domainfilter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime/egress/internal/audit"
)

// Policy is what the filter needs of a sandbox's egress policy.
type Policy interface {
	// AllowsHost reports whether a connection to hostname on port may go
	// out: a domain rule matches both.
	AllowsHost(host string, port uint16) bool
	// AllowsName reports whether the sandbox may resolve name: some
	// domain rule matches it, whatever its ports.
	AllowsName(name string) bool
}

// Sandboxes finds the sandbox behind a source address. The host's
// reverse-path check guarantees that sources are not forged.
type Sandboxes interface {
	Policy(src netip.Addr) (sandboxID string, p Policy, ok bool)
}

// Config configures Start.
type Config struct {
	// Listen is the address both listeners bind to. It is bound with
	// IP_FREEBIND, so no interface needs to carry it yet.
	Listen netip.Addr
	// ProxyPort and DNSPort: 0 picks free ports.
	ProxyPort, DNSPort uint16
	// Resolvers are the host's DNS servers: allowed queries are forwarded
	// to them, and proxied hostnames resolved with them.
	Resolvers []netip.AddrPort
	Sandboxes Sandboxes
	// Reachable holds the operator's address rules: false for an address
	// no sandbox may reach. Every resolved address is checked before it
	// is dialled. Required.
	Reachable func(netip.Addr) bool
	// OriginalDst gives the address a redirected connection was sent to.
	// Nil reads SO_ORIGINAL_DST (IPv4) from the *net.TCPConn.
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	Log         *slog.Logger
	// Registerer, if not nil, gets the filter's metrics.
	Registerer prometheus.Registerer
	// PeekTimeout bounds the wait for a ClientHello or request head;
	// 0 means 10s.
	PeekTimeout time.Duration
	// DialTimeout bounds each upstream dial; 0 means 10s.
	DialTimeout time.Duration

	// dial replaces the upstream dial in tests, which watch where
	// connections go.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Filter is a running proxy and DNS filter.
type Filter struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	proxyLn net.Listener
	dnsTCP  net.Listener
	dnsUDP  *net.UDPConn

	udpSem chan struct{} // bounds in-flight UDP queries
	tcpSem chan struct{} // bounds DNS-over-TCP connections

	mu       sync.Mutex
	closed   bool
	sessions map[*session]struct{}
	stats    map[string]*sandboxStats

	decisions  *prometheus.CounterVec
	live       prometheus.Gauge
	reg        prometheus.Registerer
	unregister sync.Once
}

// sandboxStats is the per-sandbox state Forget drops.
type sandboxStats struct {
	allowed, denied uint64
	audit           audit.Limiter
}

const (
	defaultTimeout  = 10 * time.Second
	dnsIdleTimeout  = 10 * time.Second
	maxUDPInFlight  = 256
	maxDNSTCPConns  = 256
	decisionAllowed = "allowed"
	decisionDenied  = "denied"
	kindTCP         = "tcp"
	kindDNS         = "dns"
)

// Start listens on the proxy port (TCP) and the DNS port (UDP and TCP)
// and serves until Close or until ctx is done.
func Start(ctx context.Context, cfg Config) (*Filter, error) {
	if !cfg.Listen.IsValid() {
		return nil, errors.New("domainfilter: no listen address")
	}
	if cfg.Sandboxes == nil {
		return nil, errors.New("domainfilter: no Sandboxes")
	}
	if cfg.Reachable == nil {
		// Without it, a public name pointed at the LAN would be dialled.
		return nil, errors.New("domainfilter: no Reachable")
	}
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = originalDst
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = defaultTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = defaultTimeout
	}
	if cfg.dial == nil {
		d := &net.Dialer{Timeout: cfg.DialTimeout}
		cfg.dial = d.DialContext
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Filter{
		cfg:      cfg,
		log:      log.With("component", "domainfilter"),
		udpSem:   make(chan struct{}, maxUDPInFlight),
		tcpSem:   make(chan struct{}, maxDNSTCPConns),
		sessions: map[*session]struct{}{},
		stats:    map[string]*sandboxStats{},
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_egress_decisions_total",
			Help: "Egress decisions by name: proxied connections and DNS queries, allowed or denied.",
		}, []string{"sandbox_id", "kind", "decision"}),
		live: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandboxd_egress_proxy_connections",
			Help: "Live connections through the egress proxy.",
		}),
	}
	if err := f.listen(ctx); err != nil {
		return nil, err
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(f.decisions); err != nil {
			f.closeListeners()
			return nil, fmt.Errorf("domainfilter: register metrics: %w", err)
		}
		if err := cfg.Registerer.Register(f.live); err != nil {
			cfg.Registerer.Unregister(f.decisions)
			f.closeListeners()
			return nil, fmt.Errorf("domainfilter: register metrics: %w", err)
		}
		f.reg = cfg.Registerer
	}
	f.ctx, f.cancel = context.WithCancel(context.WithoutCancel(ctx))
	f.wg.Add(3)
	go f.serveProxy()
	go f.serveDNSUDP()
	go f.serveDNSTCP()
	if ctx.Done() != nil {
		// Stop with ctx as promised, without leaving this goroutine
		// behind after Close.
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			select {
			case <-ctx.Done():
				f.shutdown()
			case <-f.ctx.Done():
			}
		}()
	}
	f.log.Info("egress domain filter listening", "addr", cfg.Listen,
		"proxy_port", f.ProxyPort(), "dns_port", f.DNSPort())
	return f, nil
}

// freebind lets the listeners bind the gateway address before (or while
// no) veth carries it.
func freebind(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if network == "tcp6" || network == "udp6" {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

func (f *Filter) listen(ctx context.Context) error {
	lc := net.ListenConfig{Control: freebind}
	tcpNet, udpNet := "tcp4", "udp4"
	if f.cfg.Listen.Is6() && !f.cfg.Listen.Is4In6() {
		tcpNet, udpNet = "tcp6", "udp6"
	}
	addr := f.cfg.Listen.Unmap()
	ln, err := lc.Listen(ctx, tcpNet, netip.AddrPortFrom(addr, f.cfg.ProxyPort).String())
	if err != nil {
		return fmt.Errorf("domainfilter: proxy listener: %w", err)
	}
	f.proxyLn = ln
	// DNS wants one port for both UDP and TCP; with a free port, the
	// one TCP got may be taken for UDP, so try a few.
	tries := 1
	if f.cfg.DNSPort == 0 {
		tries = 20
	}
	for i := 0; ; i++ {
		err = f.listenDNS(ctx, lc, tcpNet, udpNet, addr)
		if err == nil {
			return nil
		}
		if i+1 >= tries {
			ln.Close()
			return err
		}
	}
}

func (f *Filter) listenDNS(ctx context.Context, lc net.ListenConfig, tcpNet, udpNet string, addr netip.Addr) error {
	tl, err := lc.Listen(ctx, tcpNet, netip.AddrPortFrom(addr, f.cfg.DNSPort).String())
	if err != nil {
		return fmt.Errorf("domainfilter: dns tcp listener: %w", err)
	}
	port := uint16(tl.Addr().(*net.TCPAddr).Port)
	pc, err := lc.ListenPacket(ctx, udpNet, netip.AddrPortFrom(addr, port).String())
	if err != nil {
		tl.Close()
		return fmt.Errorf("domainfilter: dns udp listener: %w", err)
	}
	f.dnsTCP, f.dnsUDP = tl, pc.(*net.UDPConn)
	return nil
}

func (f *Filter) closeListeners() {
	f.proxyLn.Close()
	f.dnsTCP.Close()
	f.dnsUDP.Close()
}

// ProxyPort is the port of the transparent proxy.
func (f *Filter) ProxyPort() uint16 { return uint16(f.proxyLn.Addr().(*net.TCPAddr).Port) }

// DNSPort is the port of the DNS filter, UDP and TCP.
func (f *Filter) DNSPort() uint16 { return uint16(f.dnsTCP.Addr().(*net.TCPAddr).Port) }

// Close stops the listeners, closes all live connections and waits for
// every goroutine of the filter.
func (f *Filter) Close() error {
	f.shutdown()
	f.wg.Wait()
	f.unregister.Do(func() {
		if f.reg != nil {
			f.reg.Unregister(f.decisions)
			f.reg.Unregister(f.live)
		}
	})
	return nil
}

func (f *Filter) shutdown() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	all := make([]*session, 0, len(f.sessions))
	for s := range f.sessions {
		all = append(all, s)
	}
	f.mu.Unlock()
	f.cancel()
	f.closeListeners()
	for _, s := range all {
		f.kill(s, false)
	}
}

// Recheck re-evaluates the live proxied connections from src against the
// sandbox's current policy, closing those it no longer allows. Call it
// after the policy changed; it calls Sandboxes.Policy.
func (f *Filter) Recheck(src netip.Addr) {
	src = src.Unmap()
	var named []*session
	f.mu.Lock()
	for s := range f.sessions {
		if s.src == src && s.host != "" {
			named = append(named, s)
		}
	}
	f.mu.Unlock()
	if len(named) == 0 {
		return
	}
	_, p, ok := f.cfg.Sandboxes.Policy(src)
	for _, s := range named {
		if !ok || !p.AllowsHost(s.host, s.port) {
			f.log.Info("closing connection its policy no longer allows",
				"sandbox_id", s.sandboxID, "host", s.host, "port", s.port)
			f.kill(s, true)
		}
	}
}

// Forget drops the state and metric label values of a sandbox that is
// gone, and closes what is left of its connections: with its veth gone,
// nothing would tell their upstream ends.
func (f *Filter) Forget(sandboxID string) {
	var its []*session
	f.mu.Lock()
	delete(f.stats, sandboxID)
	for s := range f.sessions {
		if s.sandboxID == sandboxID {
			its = append(its, s)
		}
	}
	f.mu.Unlock()
	for _, s := range its {
		f.kill(s, true)
	}
	f.decisions.DeletePartialMatch(prometheus.Labels{"sandbox_id": sandboxID})
}

// Counts returns the decisions so far for a sandbox, TCP and DNS
// together.
func (f *Filter) Counts(sandboxID string) (allowed, denied uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := f.stats[sandboxID]; st != nil {
		return st.allowed, st.denied
	}
	return 0, 0
}

// decided counts a decision and, for a denial, writes the audit line if
// the sandbox's audit budget allows.
func (f *Filter) decided(sandboxID, kind string, allowed bool, dst, host, proto, reason string) {
	decision := decisionDenied
	if allowed {
		decision = decisionAllowed
	}
	f.decisions.WithLabelValues(sandboxID, kind, decision).Inc()
	now := time.Now()
	f.mu.Lock()
	st := f.stats[sandboxID]
	if st == nil {
		st = &sandboxStats{}
		f.stats[sandboxID] = st
	}
	logIt := false
	if allowed {
		st.allowed++
	} else {
		st.denied++
		logIt = st.audit.Allow(now, dst+" "+host)
	}
	f.mu.Unlock()
	if logIt {
		audit.Denied(f.log, sandboxID, dst, host, proto, reason)
	}
}
