package domainfilter

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func query(t *testing.T, id uint16, name string, rd bool) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: rd})
	b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func rcodeOf(resp []byte) int {
	if len(resp) < 4 {
		return -1
	}
	return int(resp[3] & 0x0f)
}

func udpQuery(t *testing.T, port uint16, q []byte) []byte {
	t.Helper()
	c, err := net.Dial("udp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(6 * time.Second))
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

func tcpQuery(t *testing.T, c net.Conn, q []byte) []byte {
	t.Helper()
	c.SetDeadline(time.Now().Add(6 * time.Second))
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		return nil
	}
	var lb [2]byte
	if _, err := io.ReadFull(c, lb[:]); err != nil {
		return nil
	}
	resp := make([]byte, binary.BigEndian.Uint16(lb[:]))
	if _, err := io.ReadFull(c, resp); err != nil {
		return nil
	}
	return resp
}

// answerOf parses a response: header, question names, A records.
func answerOf(t *testing.T, resp []byte) (dnsmessage.Header, []string, []netip.Addr) {
	t.Helper()
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		t.Fatalf("response %x: %v", resp, err)
	}
	qs, err := p.AllQuestions()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, q := range qs {
		names = append(names, q.Name.String())
	}
	var addrs []netip.Addr
	rrs, err := p.AllAnswers()
	if err != nil {
		t.Fatal(err)
	}
	for _, rr := range rrs {
		if a, ok := rr.Body.(*dnsmessage.AResource); ok {
			addrs = append(addrs, netip.AddrFrom4(a.A))
		}
	}
	return h, names, addrs
}

func TestDNS(t *testing.T) {
	rules := map[string][]uint16{"allowed.test": {443}, "*.github.test": nil}
	twoQuestions := func() []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9})
		b.StartQuestions()
		for _, n := range []string{"allowed.test.", "denied.test."} {
			b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(n), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		}
		q, _ := b.Finish()
		return q
	}()
	dotInLabel := func() []byte {
		q := query(t, 10, "allowed.test", true)
		// "allowed.test" as one label: \x0callowed.test\x00
		return append(append(q[:12:12], append([]byte{12}, "allowed.test"...)...), append([]byte{0}, q[len(q)-4:]...)...)
	}()
	cases := []struct {
		name      string
		q         []byte
		resolvers func(t *testing.T, h *harness) []netip.AddrPort // nil: the fake DNS
		rcode     int
		addrs     int // A records expected
		question  string
		allowed   uint64
		denied    uint64
	}{
		{name: "allowed", q: query(t, 1, "allowed.test", true), rcode: 0, addrs: 1, question: "allowed.test.", allowed: 1},
		{name: "allowed, mixed case", q: query(t, 2, "WWW.GitHub.Test", true), rcode: 0, addrs: 1, question: "WWW.GitHub.Test.", allowed: 1},
		{name: "denied", q: query(t, 3, "denied.test", true), rcode: 3, question: "denied.test.", denied: 1},
		{name: "denied, no rd", q: query(t, 4, "evil.test", false), rcode: 3, question: "evil.test.", denied: 1},
		{name: "two questions", q: twoQuestions, rcode: 1},
		{name: "no question", q: []byte{0, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, rcode: 1},
		{name: "question cut short", q: query(t, 6, "allowed.test", true)[:20], rcode: 1},
		{name: "dot inside a label", q: dotInLabel, rcode: 1},
		{name: "wildcard as a name", q: query(t, 13, "*.github.test", true), rcode: 3, question: "*.github.test.", denied: 1},
		{
			name: "upstreams down", q: query(t, 11, "allowed.test", true), rcode: 2, question: "allowed.test.", allowed: 1,
			resolvers: func(t *testing.T, _ *harness) []netip.AddrPort { return []netip.AddrPort{deadAddr(t), deadAddr(t)} },
		},
		{
			name: "first upstream silent", q: query(t, 12, "allowed.test", true), rcode: 0, addrs: 1, question: "allowed.test.", allowed: 1,
			resolvers: func(t *testing.T, h *harness) []netip.AddrPort { return []netip.AddrPort{silentDNS(t), h.dns.addr} },
		},
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, tc := range cases {
			t.Run(network+"/"+tc.name, func(t *testing.T) {
				h := newHarness(t, rules)
				if tc.resolvers != nil {
					rs := tc.resolvers(t, h)
					h.f.Close()
					f, err := Start(context.Background(), Config{Listen: loopback, Reachable: onlyLoopback, Resolvers: rs, Sandboxes: &fakeSandboxes{p: h.pol}, Log: h.f.log})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { f.Close() })
					h.f = f
				}
				var resp []byte
				if network == "udp" {
					resp = udpQuery(t, h.f.DNSPort(), tc.q)
				} else {
					c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", h.f.DNSPort()))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { c.Close() })
					resp = tcpQuery(t, c, tc.q)
				}
				if resp == nil {
					t.Fatal("no answer")
				}
				hd, qs, addrs := answerOf(t, resp)
				if got := rcodeOf(resp); got != tc.rcode {
					t.Fatalf("rcode %d, want %d", got, tc.rcode)
				}
				if hd.ID != binary.BigEndian.Uint16(tc.q) || !hd.Response {
					t.Errorf("header %+v", hd)
				}
				if len(addrs) != tc.addrs {
					t.Errorf("A records %v, want %d", addrs, tc.addrs)
				}
				if tc.question != "" && (len(qs) != 1 || qs[0] != tc.question) {
					t.Errorf("question %v, want %s", qs, tc.question)
				}
				if tc.rcode == 3 {
					if !hd.RecursionAvailable || hd.RecursionDesired != (tc.q[2]&1 == 1) {
						t.Errorf("header %+v", hd)
					}
					if a := h.logs.audits(); len(a) != 1 || a[0]["proto"] != "dns" {
						t.Errorf("audit %v", a)
					}
				}
				if a, d := h.f.Counts("sbx-1"); a != tc.allowed || d != tc.denied {
					t.Errorf("counts %d %d, want %d %d", a, d, tc.allowed, tc.denied)
				}
			})
		}
	}
}

// Several queries go over one TCP connection.
func TestDNSTCPSeveral(t *testing.T) {
	h := newHarness(t, map[string][]uint16{"allowed.test": nil})
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", h.f.DNSPort()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for i, name := range []string{"allowed.test", "denied.test", "allowed.test"} {
		resp := tcpQuery(t, c, query(t, uint16(100+i), name, true))
		want := 0
		if name == "denied.test" {
			want = 3
		}
		if rcodeOf(resp) != want || binary.BigEndian.Uint16(resp) != uint16(100+i) {
			t.Fatalf("%s: %x", name, resp)
		}
	}
	if a, d := h.f.Counts("sbx-1"); a != 2 || d != 1 {
		t.Errorf("counts %d %d", a, d)
	}
}

func TestDNSUnknownSource(t *testing.T) {
	h := newHarness(t, nil, func(c *Config) { c.Sandboxes = &fakeSandboxes{empty: true} })
	c, err := net.Dial("udp4", fmt.Sprintf("127.0.0.1:%d", h.f.DNSPort()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.Write(query(t, 1, "allowed.test", true))
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Read(make([]byte, 512)); err == nil {
		t.Error("answered a query from no sandbox")
	}
	tc, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", h.f.DNSPort()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	if resp := tcpQuery(t, tc, query(t, 2, "allowed.test", true)); resp != nil {
		t.Error("answered a TCP query from no sandbox")
	}
	if h.dns.queries.Load() != 0 {
		t.Error("forwarded")
	}
}
