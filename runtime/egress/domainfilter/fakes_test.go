package domainfilter

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

var loopback = netip.MustParseAddr("127.0.0.1")

func onlyLoopback(a netip.Addr) bool { return a == loopback }

// fakePolicy allows names by rule: "name" or "*.suffix", each on some
// ports (none: any port). It records what AllowsHost was asked.
type fakePolicy struct {
	mu    sync.Mutex
	rules map[string][]uint16
	asked []string
}

func newPolicy(rules map[string][]uint16) *fakePolicy {
	return &fakePolicy{rules: rules}
}

func (p *fakePolicy) set(rules map[string][]uint16) {
	p.mu.Lock()
	p.rules = rules
	p.mu.Unlock()
}

func (p *fakePolicy) match(name string) ([]uint16, bool) {
	for pat, ports := range p.rules {
		if pat == name {
			return ports, true
		}
		if suf, ok := strings.CutPrefix(pat, "*."); ok && strings.HasSuffix(name, "."+suf) {
			return ports, true
		}
	}
	return nil, false
}

func (p *fakePolicy) AllowsHost(host string, port uint16) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, fmt.Sprintf("%s:%d", host, port))
	ports, ok := p.match(host)
	if !ok {
		return false
	}
	if len(ports) == 0 {
		return true
	}
	for _, pt := range ports {
		if pt == port {
			return true
		}
	}
	return false
}

func (p *fakePolicy) AllowsName(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.match(name)
	return ok
}

func (p *fakePolicy) questions() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.asked...)
}

// fakeSandboxes knows one sandbox, "sbx-1" at 127.0.0.1, unless empty.
type fakeSandboxes struct {
	p     *fakePolicy
	empty bool
}

func (s *fakeSandboxes) Policy(src netip.Addr) (string, Policy, bool) {
	if s.empty || src != loopback {
		return "", nil, false
	}
	return "sbx-1", s.p, true
}

// fakeDNS answers A queries from a table (and nothing for slow.*), on one port over UDP and TCP.
type fakeDNS struct {
	addr    netip.AddrPort
	records map[string][]netip.Addr
	queries atomic.Int64
}

func startDNS(t testing.TB, records map[string][]string) *fakeDNS {
	t.Helper()
	d := &fakeDNS{records: map[string][]netip.Addr{}}
	for n, as := range records {
		for _, a := range as {
			d.records[n+"."] = append(d.records[n+"."], netip.MustParseAddr(a))
		}
	}
	var ln net.Listener
	var pc net.PacketConn
	for range 20 {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p, err := net.ListenPacket("udp4", l.Addr().String())
		if err != nil {
			l.Close()
			continue
		}
		ln, pc = l, p
		break
	}
	if ln == nil {
		t.Fatal("no port for the fake DNS")
	}
	d.addr = netip.MustParseAddrPort(ln.Addr().String())
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); pc.Close(); wg.Wait() })
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if r := d.respond(buf[:n]); r != nil {
				pc.WriteTo(r, from)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				for {
					var lb [2]byte
					if _, err := io.ReadFull(c, lb[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(lb[:]))
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					r := d.respond(q)
					if r == nil {
						continue
					}
					out := binary.BigEndian.AppendUint16(nil, uint16(len(r)))
					c.Write(append(out, r...))
				}
			}()
		}
	}()
	return d
}

func (d *fakeDNS) respond(q []byte) []byte {
	d.queries.Add(1)
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil
	}
	qname := strings.ToLower(qs[0].Name.String())
	if strings.HasPrefix(qname, "slow.") {
		return nil // never answered
	}
	addrs := d.records[qname]
	rh := dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if addrs == nil {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.StartQuestions()
	b.Question(qs[0])
	b.StartAnswers()
	if qs[0].Type == dnsmessage.TypeA {
		for _, a := range addrs {
			b.AResource(dnsmessage.ResourceHeader{Name: qs[0].Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: a.As4()})
		}
	}
	out, _ := b.Finish()
	return out
}

// silentDNS takes UDP queries and never answers.
func silentDNS(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// deadAddr is a loopback port nothing listens on (UDP nor TCP).
func deadAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort(l.Addr().String())
	l.Close()
	return a
}

var testCert = sync.OnceValue(func() tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "domainfilter test"},
		DNSNames:     []string{"allowed.test", "keep.test", "evil.test", "denied.test", "*.github.test", "mixed.test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
})

func certPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(testCert().Leaf)
	return p
}

// server is a fake upstream on 127.0.0.1 that says who it is. Over TLS
// it greets with "<name> sni=<sni>\n", echoes lines, and at EOF says
// "bye <name>\n" and closes. Over plain HTTP it reads the head and
// the body until EOF (the client's half-close), then answers
// "<name> host=<Host> body=<n>" and closes.
type server struct {
	name  string
	port  uint16
	conns atomic.Int64
}

func startTLSServer(t *testing.T, name string) *server {
	t.Helper()
	ln, err := tls.Listen("tcp4", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{testCert()}})
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, name, ln, func(c net.Conn) {
		tc := c.(*tls.Conn)
		tc.SetDeadline(time.Now().Add(20 * time.Second))
		if err := tc.Handshake(); err != nil {
			return
		}
		fmt.Fprintf(tc, "%s sni=%s\n", name, tc.ConnectionState().ServerName)
		r := bufio.NewReader(tc)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				break
			}
			io.WriteString(tc, l)
		}
		fmt.Fprintf(tc, "bye %s\n", name)
	})
}

func startHTTPServer(t *testing.T, name string) *server {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, name, ln, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(c)
		host := ""
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "host") {
				host = strings.TrimSpace(v)
			}
			if l == "\r\n" {
				break
			}
		}
		n, _ := io.Copy(io.Discard, r)
		fmt.Fprintf(c, "HTTP/1.0 200 OK\r\n\r\n%s host=%s body=%d", name, host, n)
	})
}

func serve(t *testing.T, name string, ln net.Listener, handle func(net.Conn)) *server {
	s := &server{name: name, port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			mu.Lock()
			open[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { mu.Lock(); delete(open, c); mu.Unlock(); c.Close() }()
				handle(c)
			}()
		}
	}()
	return s
}

// logCapture keeps the records a slog.Logger writes.
type logCapture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logCapture) WithGroup(string) slog.Handler            { return l }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}

// audits returns the audit lines' attributes.
func (l *logCapture) audits() []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.recs {
		m := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		if m["audit"] == "true" {
			out = append(out, m)
		}
	}
	return out
}

// harness runs a Filter for 127.0.0.1 with a fake DNS and routes each
// client connection's "original destination" as the test says.
type harness struct {
	t      testing.TB
	f      *Filter
	pol    *fakePolicy
	dns    *fakeDNS
	logs   *logCapture
	dstMu  sync.Mutex
	dsts   map[uint16]netip.AddrPort // client port → original dst
	dialMu sync.Mutex
	dialed []string
}

type harnessOpt func(*Config)

func newHarness(t testing.TB, rules map[string][]uint16, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{t: t, pol: newPolicy(rules), logs: &logCapture{}, dsts: map[uint16]netip.AddrPort{}}
	h.dns = startDNS(t, map[string][]string{
		"allowed.test":    {"127.0.0.1"},
		"keep.test":       {"127.0.0.1"},
		"denied.test":     {"127.0.0.1"},
		"evil.test":       {"127.0.0.1"},
		"www.github.test": {"127.0.0.1"},
		"private.test":    {"10.1.2.3", "192.168.1.1"},
		"mixed.test":      {"10.1.2.3", "127.0.0.1"},
	})
	cfg := Config{
		Listen:      loopback,
		Resolvers:   []netip.AddrPort{h.dns.addr},
		Sandboxes:   &fakeSandboxes{p: h.pol},
		Reachable:   onlyLoopback,
		OriginalDst: h.originalDst,
		Log:         slog.New(h.logs),
		PeekTimeout: 2 * time.Second,
		DialTimeout: 2 * time.Second,
		dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			h.dialMu.Lock()
			h.dialed = append(h.dialed, addr)
			h.dialMu.Unlock()
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	f, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	h.f = f
	return h
}

func (h *harness) originalDst(c net.Conn) (netip.AddrPort, error) {
	port := uint16(c.RemoteAddr().(*net.TCPAddr).Port)
	for range 200 {
		h.dstMu.Lock()
		d, ok := h.dsts[port]
		h.dstMu.Unlock()
		if ok {
			return d, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return netip.AddrPort{}, errors.New("test set no destination")
}

// dial connects to the proxy as a sandbox connecting to dst.
func (h *harness) dial(dst netip.AddrPort) *net.TCPConn {
	h.t.Helper()
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", h.f.ProxyPort()))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	h.dstMu.Lock()
	h.dsts[uint16(c.LocalAddr().(*net.TCPAddr).Port)] = dst
	h.dstMu.Unlock()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	return c.(*net.TCPConn)
}

func (h *harness) dialedAddrs() []string {
	h.dialMu.Lock()
	defer h.dialMu.Unlock()
	return append([]string(nil), h.dialed...)
}

func at(port uint16) netip.AddrPort { return netip.AddrPortFrom(loopback, port) }
