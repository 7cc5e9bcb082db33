// Package egresstest gives the backends' egress tests their stand-in for
// the internet: a network namespace of the test's own, reached from the
// host through a veth, in a random /24 of 198.18.0.0/15 (a range reserved
// for testing), with an HTTP server in it that answers with the address it
// saw. No packet leaves the machine: the route to the server is checked
// before anything is sent.
package egresstest

import (
	"crypto/rand"
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

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
	"github.com/vishvananda/netns"
)

// Reply is the prefix of the server's answer, followed by the client's
// address as the server saw it (after the host's masquerade).
const Reply = "from-inet "

// FakeInternet sets up the namespace and serves HTTP in it; it returns the
// server's address and the host's address towards it. tag (two letters)
// names the namespace and links, and second (18 or 19) picks the /16 of
// 198.18.0.0/15, so that the suites of two packages running at once do not
// meet.
func FakeInternet(t testing.TB, tag string, second byte) (server, inetHost string) {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2) for the fake internet")
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	inetHost = fmt.Sprintf("198.%d.%d.1", second, rnd[0])
	inetServer := fmt.Sprintf("198.%d.%d.2", second, rnd[0])
	suffix := hex.EncodeToString(rnd[1:])
	name, hostIf, nsIf := tag+"inet-"+suffix, tag+"i"+suffix, tag+"o"+suffix
	ipCmd(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ipCmd(t, "link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	ipCmd(t, "link", "set", nsIf, "netns", name)
	ipCmd(t, "-n", name, "addr", "add", inetServer+"/24", "dev", nsIf)
	ipCmd(t, "-n", name, "link", "set", nsIf, "up")
	ipCmd(t, "-n", name, "link", "set", "lo", "up")
	ipCmd(t, "-n", name, "route", "add", "default", "via", inetHost)
	ipCmd(t, "addr", "add", inetHost+"/24", "dev", hostIf)
	ipCmd(t, "link", "set", hostIf, "up")
	out, err := exec.Command("ip", "route", "get", inetServer).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev "+hostIf) {
		t.Fatalf("route to %s is not via %s (%s, %v): refusing to send anything", inetServer, hostIf, out, err)
	}
	ln := listenIn(t, name, inetServer+":0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s%s", Reply, r.RemoteAddr)
	})}
	go func() { _ = srv.Serve(ln) }() // ends on Close
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), inetHost
}

// listenIn listens on addr inside network namespace name: the socket stays
// there after the thread switches back.
func listenIn(t testing.TB, name, addr string) net.Listener {
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
	ln, lerr := net.Listen("tcp", addr)
	if err := netns.Set(orig); err != nil {
		panic(err) // this thread must not run anything else
	}
	if lerr != nil {
		t.Fatal(lerr)
	}
	return ln
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
	res := Connect(t, b, id, server)
	t.Logf("sandbox without internet → %s: %s", server, lastLine(res.Stderr))
	if res.ExitCode == 0 {
		t.Errorf("without internet: GET %s succeeded: %v", server, res)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
