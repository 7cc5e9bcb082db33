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
	"net"
	"net/http"
	"os/exec"
	goruntime "runtime"
	"strings"
	"testing"

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
