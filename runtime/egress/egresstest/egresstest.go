// Package egresstest gives the egress tests their stand-ins for the
// internet and for the operator's LAN: network namespaces of the test's
// own, each reached from the host through a veth, with an HTTP server in
// it that answers with the address it saw. The internet is a random /30
// of 192.52.193.0/24: a block IANA's special-purpose registry marks
// globally reachable (AMT relays, RFC 7450), so the egress rules must let
// it through, and one no host here talks to. The LAN is a random /30 of
// 10.0.0.0/8 that no route of the host covers. No packet leaves the
// machine: the route to each server is checked before anything is sent.
package egresstest

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/fakeinet"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/egress/policy"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
	"github.com/vishvananda/netns"
)

// Reply is the prefix of the server's answer, followed by the client's
// address as the server saw it (after the host's masquerade).
const Reply = fakeinet.Reply

// FakeInternet sets up the internet's namespace and serves HTTP in it; it
// returns the server's address and the host's address towards it. tag
// (two letters) names the namespace and links, and slot (0-3) picks a
// quarter of 192.52.193.0/24, so that the suites of packages running at
// once do not meet.
func FakeInternet(t testing.TB, tag string, slot byte) (server, inetHost string) {
	t.Helper()
	in := NewInet(t, tag, slot)
	return in.Server, in.Host
}

// Inet is a host of the fake internet, as NewInet makes it.
type Inet struct {
	Server string     // the HTTP server's address:port
	Host   string     // the host's address on the veth towards it
	IP     netip.Addr // the server's address
	NS     string     // its network namespace, for more servers (Serve)
}

// NewInet is FakeInternet, with what more servers in the namespace need.
// A /30 of the slot that the host routes already (another Inet of this
// process) is skipped.
func NewInet(t testing.TB, tag string, slot byte) Inet {
	t.Helper()
	for range 32 {
		var rnd [1]byte
		_, _ = rand.Read(rnd[:])
		base := 64*(slot%4) + 4*(rnd[0]%16)
		host, srv := netip.AddrFrom4([4]byte{192, 52, 193, base + 1}), netip.AddrFrom4([4]byte{192, 52, 193, base + 2})
		if !onlyDefaultRoute(t, srv) {
			continue
		}
		ns := fakeNet(t, tag+"inet", host, srv)
		return Inet{Server: serveHTTP(t, ns, srv, 0), Host: host.String(), IP: srv, NS: ns}
	}
	t.Fatalf("no free /30 in slot %d of the fake internet", slot)
	return Inet{}
}

// LAN is the operator's network as FakeLAN makes it.
type LAN struct {
	Server string // the HTTP server's address:port
	DNS    string // the same server on port 53, a stand-in for a resolver
	Host   string // the host's address on the LAN's veth
}

// FakeLAN sets up a namespace on a private address (RFC 1918) that no
// route of the host covers, with HTTP served on a random port and on port
// 53; tag (two letters) names the namespace and links.
func FakeLAN(t testing.TB, tag string) LAN {
	t.Helper()
	for range 20 {
		var rnd [3]byte
		_, _ = rand.Read(rnd[:])
		base := rnd[2] &^ 3
		host, srv := netip.AddrFrom4([4]byte{10, rnd[0], rnd[1], base + 1}), netip.AddrFrom4([4]byte{10, rnd[0], rnd[1], base + 2})
		if !onlyDefaultRoute(t, srv) {
			continue // the host knows this net: leave it alone
		}
		ns := fakeNet(t, tag+"lan", host, srv)
		return LAN{Server: serveHTTP(t, ns, srv, 0), DNS: serveHTTP(t, ns, srv, 53), Host: host.String()}
	}
	t.Fatal("no /30 of 10.0.0.0/8 free of the host's routes in 20 tries")
	return LAN{}
}

// onlyDefaultRoute reports whether no route but the default covers a.
func onlyDefaultRoute(t testing.TB, a netip.Addr) bool {
	t.Helper()
	out, err := exec.Command("ip", "-4", "route", "show", "match", a.String()).Output()
	if err != nil {
		t.Fatalf("ip route show match %s: %v", a, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" && !strings.HasPrefix(line, "default ") {
			return false
		}
	}
	return true
}

// fakeNet makes namespace name+random suffix and a veth to it, host on the
// host's end and server on the namespace's (a /30), and returns the
// namespace's name.
func fakeNet(t testing.TB, name string, host, server netip.Addr) string {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2) for the fake networks")
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	suffix := hex.EncodeToString(rnd[:])
	tag := name[:2]
	name, hostIf, nsIf := name+"-"+suffix, tag+"i"+suffix, tag+"o"+suffix
	ipCmd(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ipCmd(t, "link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	ipCmd(t, "link", "set", nsIf, "netns", name)
	ipCmd(t, "-n", name, "addr", "add", server.String()+"/30", "dev", nsIf)
	ipCmd(t, "-n", name, "link", "set", nsIf, "up")
	ipCmd(t, "-n", name, "link", "set", "lo", "up")
	ipCmd(t, "-n", name, "route", "add", "default", "via", host.String())
	ipCmd(t, "addr", "add", host.String()+"/30", "dev", hostIf)
	ipCmd(t, "link", "set", hostIf, "up")
	out, err := exec.Command("ip", "route", "get", server.String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev "+hostIf) {
		t.Fatalf("route to %s is not via %s (%s, %v): refusing to send anything", server, hostIf, out, err)
	}
	return name
}

// serveHTTP serves HTTP (ServeHTTP) on addr:port in namespace ns (port 0:
// any) and returns the listener's address.
func serveHTTP(t testing.TB, ns string, addr netip.Addr, port uint16) string {
	t.Helper()
	return ServeHTTP(t, listenIn(t, ns, netip.AddrPortFrom(addr, port).String()))
}

// ServeHTTP serves on ln what the fake networks' servers answer: Reply and
// the client's address as the server saw it. It returns ln's address.
func ServeHTTP(t testing.TB, ln net.Listener) string {
	srv := &http.Server{Handler: fakeinet.Handler()}
	go func() { _ = srv.Serve(ln) }() // ends on Close
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// ServeDNS serves names (A records) on port 53 of in's address, over UDP
// and TCP; other names are NXDOMAIN. It returns the server's address.
func (in Inet) ServeDNS(t testing.TB, names map[string]netip.Addr) netip.Addr {
	t.Helper()
	d := &fakeinet.DNS{Names: names}
	ln := listenIn(t, in.NS, netip.AddrPortFrom(in.IP, 53).String())
	var pc net.PacketConn
	inNS(t, in.NS, func() (err error) {
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(in.IP, 53).String())
		return err
	})
	go d.ServeTCP(ln)
	go d.ServeUDP(pc)
	t.Cleanup(func() { ln.Close(); pc.Close() })
	return in.IP
}

// ServeHTTPOn serves HTTP on port of in's address, plain or (with names)
// TLS with a self-signed certificate for names; it returns the address.
func (in Inet) ServeHTTPOn(t testing.TB, port uint16, names ...string) string {
	t.Helper()
	ln := listenIn(t, in.NS, netip.AddrPortFrom(in.IP, port).String())
	if len(names) > 0 {
		cfg, err := fakeinet.TLSConfig(names...)
		if err != nil {
			t.Fatal(err)
		}
		ln = tls.NewListener(ln, cfg)
	}
	return ServeHTTP(t, ln)
}

// listenIn listens on addr inside network namespace name: the socket stays
// there after the thread switches back.
func listenIn(t testing.TB, name, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	inNS(t, name, func() (err error) { ln, err = net.Listen("tcp", addr); return err })
	return ln
}

// inNS runs open (which makes sockets) inside network namespace name.
func inNS(t testing.TB, name string, open func() error) {
	t.Helper()
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	oerr := open()
	if err := netns.Set(orig); err != nil {
		panic(err) // this thread must not run anything else
	}
	if oerr != nil {
		t.Fatal(oerr)
	}
}

func ipCmd(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Connect runs, in sandbox id as "user", a TCP connect to addr (timeout
// 1.5 s) and an HTTP GET, with the template's python3; the answer is on
// stdout, a failure on stderr and in the exit code.
func Connect(t testing.TB, b runtime.Backend, id, addr string) runtimetest.Result {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`
import socket
s = socket.create_connection((%q, %s), timeout=1.5)
s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
print(s.recv(4096).decode(errors="replace"))
`, host, port)
	res, err := runtimetest.Exec(t.Context(), b, id, "user", "/usr/bin/python3", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// CheckReaches checks that sandbox id reaches the fake internet's server
// through the masquerade (the server sees inetHost as the source).
func CheckReaches(t testing.TB, b runtime.Backend, id, server, inetHost string) {
	t.Helper()
	if res := Connect(t, b, id, server); res.ExitCode != 0 || !strings.Contains(res.Stdout, Reply+inetHost+":") {
		t.Errorf("sandbox %s: GET %s = %v; want an answer, masqueraded to %s", id, server, res, inetHost)
	}
}

// CheckNoHost checks that sandbox id reaches none of the host's listeners
// on loopback or on gateway (the host end of its own veth, an address of a
// namespace the backend made), whatever the listener is bound to. Nothing
// is sent to an address that is not this machine's right now; the
// machine's other interfaces are deliberately not probed.
func CheckNoHost(t testing.TB, b runtime.Backend, id string, gateway netip.Addr) {
	t.Helper()
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // ends on Close
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nhost")
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	for _, h := range []string{"127.0.0.1", gateway.String()} {
		if out, err := exec.Command("ip", "route", "get", h).Output(); err != nil || !strings.HasPrefix(string(out), "local ") {
			t.Fatalf("%s is not a local address (%s, %v): refusing to send anything", h, out, err)
		}
		res := Connect(t, b, id, net.JoinHostPort(h, port))
		t.Logf("sandbox → host %s:%s: %s", h, port, lastLine(res.Stderr))
		if res.ExitCode == 0 {
			t.Errorf("sandbox %s reached the host at %s:%s: %v", id, h, port, res)
		}
	}
}

// CheckNoNeighbour checks that sandbox from cannot reach a server in
// sandbox to (address toIP, host end toHostIf), which to itself reaches.
func CheckNoNeighbour(t testing.TB, b runtime.Backend, from, to, toIP, toHostIf string) {
	t.Helper()
	if out, err := exec.Command("ip", "route", "get", toIP).Output(); err != nil || !strings.Contains(string(out), "dev "+toHostIf) {
		t.Fatalf("%s is not routed to sandbox %s (%s, %v): refusing to send anything", toIP, to, out, err)
	}
	// Started, then waited for: a fixed pause is too short where python
	// starts slowly (an emulated CPU takes seconds), and the check below
	// would then pass for want of a listener.
	res, err := runtimetest.Exec(t.Context(), b, to, "user", "/bin/sh", "-c",
		"cd /tmp && (setsid python3 -m http.server 8000 >/tmp/http-server.log 2>&1 &) && python3 -c '"+awaitListener+"' || { cat /tmp/http-server.log; exit 1; }")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start a server in sandbox %s: %v, %v", to, res, err)
	}
	res = Connect(t, b, from, toIP+":8000")
	t.Logf("sandbox → sandbox %s:8000: %s", toIP, lastLine(res.Stderr))
	if res.ExitCode == 0 {
		t.Errorf("sandbox %s reached sandbox %s at %s: %v", from, to, toIP, res)
	}
	if res := Connect(t, b, to, "127.0.0.1:8000"); res.ExitCode != 0 {
		t.Errorf("sandbox %s cannot reach its own server: %v", to, res) // the check above is meaningful
	}
}

// awaitListener is a python script that exits once 127.0.0.1:8000 accepts
// a connection, or fails after 30 s.
const awaitListener = `
import socket, sys, time
for _ in range(300):
    try:
        socket.create_connection(("127.0.0.1", 8000), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit("nothing listens on 127.0.0.1:8000")
`

// CheckNoInternet checks that sandbox id (created without internet access)
// does not reach the fake internet's server.
func CheckNoInternet(t testing.TB, b runtime.Backend, id, server string) {
	t.Helper()
	checkUnreachable(t, b, id, server, "without internet")
}

// CheckNoLAN checks that sandbox id (with internet access, and no
// exception for the LAN) reaches neither of lan's servers.
func CheckNoLAN(t testing.TB, b runtime.Backend, id string, lan LAN) {
	t.Helper()
	checkUnreachable(t, b, id, lan.Server, "LAN")
	checkUnreachable(t, b, id, lan.DNS, "LAN")
}

func checkUnreachable(t testing.TB, b runtime.Backend, id, addr, what string) {
	t.Helper()
	res := Connect(t, b, id, addr)
	t.Logf("sandbox (%s) → %s: %s", what, addr, lastLine(res.Stderr))
	if res.ExitCode == 0 {
		t.Errorf("%s: GET %s succeeded: %v", what, addr, res)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// CheckPolicy checks b's egress policies (runtime.EgressPolicer) on
// sandbox id, which has internet access and one's DNS (ServeDNS with
// Names) as its resolver; one and two serve HTTP on port 80
// (ServeHTTPOn): an address allowed inside deny-all, then a name, then
// no policy.
func CheckPolicy(t testing.TB, b runtime.Backend, id string, one, two Inet) {
	t.Helper()
	ep, ok := b.(runtime.EgressPolicer)
	if !ok {
		t.Fatal("the backend does not enforce egress policies")
	}
	set := func(allow, deny []string) {
		t.Helper()
		p, err := policy.Parse(allow, deny)
		if err != nil {
			t.Fatal(err)
		}
		if err := ep.SetEgressPolicy(t.Context(), id, p); err != nil {
			t.Fatalf("SetEgressPolicy(%v, %v) = %v", allow, deny, err)
		}
	}
	get := func(host, connectTo string) bool {
		t.Helper()
		script := fmt.Sprintf(`
import socket
s = socket.create_connection((%q, 80), timeout=3)
s.sendall(b"GET / HTTP/1.0\r\nHost: %s\r\n\r\n")
print(s.recv(4096).decode(errors="replace"))
`, connectTo, host)
		res, err := runtimetest.Exec(t.Context(), b, id, "user", "/usr/bin/python3", "-c", script)
		if err != nil {
			t.Fatal(err)
		}
		return res.ExitCode == 0 && strings.Contains(res.Stdout, Reply)
	}
	oneIP, twoIP := one.IP.String(), two.IP.String()
	for _, step := range []struct {
		name        string
		allow, deny []string
		checks      map[[2]string]bool // {Host, address to connect to} → answered
	}{
		{"one allowed in deny-all", []string{oneIP}, []string{policy.AllTraffic},
			map[[2]string]bool{{"x", oneIP}: true, {"x", twoIP}: false}},
		{"a name allowed in deny-all", []string{Names[0]}, []string{policy.AllTraffic},
			map[[2]string]bool{{Names[0], Names[0]}: true, {Names[1], Names[1]}: false, {Names[1], oneIP}: false, {Names[0], twoIP}: true}},
		{"no policy", nil, nil, map[[2]string]bool{{"x", oneIP}: true, {"x", twoIP}: true}},
	} {
		set(step.allow, step.deny)
		for c, want := range step.checks {
			if got := get(c[0], c[1]); got != want {
				t.Errorf("%s: GET Host %s at %s answered = %v, want %v", step.name, c[0], c[1], got, want)
			}
		}
	}
}

// Names are the names CheckPolicy asks one's DNS for: serve them
// (ServeDNS) all at one's address.
var Names = []string{"ok.sbx.test", "no.sbx.test"}
