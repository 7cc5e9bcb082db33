package local_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/egress/egresstest"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

func TestEgress(t *testing.T) {
	for _, userNS := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userNS), func(t *testing.T) { testEgress(t, userNS) })
	}
}

func testEgress(t *testing.T, userNS bool) {
	env := newEnv(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (Debian package nftables) for sandboxes with internet access")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("needs python3 in the base template for a TCP client")
	}
	// ip_forward stays on afterwards, as with any egress user (Docker too):
	// turning it off again could cut the egress of sandboxes that another
	// sandboxd on this machine runs.
	server, inetHost := egresstest.FakeInternet(t, "rt", 18)

	open := env.open
	if userNS {
		open = env.openUserNS
	}
	b := open(t)
	ctx := t.Context()
	mk := func(internet bool) string {
		id := runtimetest.NewID()
		if _, err := b.Create(ctx, runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, AllowInternet: internet}); err != nil {
			t.Fatalf("Create(internet %v) = %v", internet, err)
		}
		t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
		return id
	}
	on, other, off := mk(true), mk(true), mk(false)

	// connect runs a TCP connect (and an HTTP GET) from sandbox id.
	connect := func(id, addr string) runtimetest.Result {
		host, port, _ := net.SplitHostPort(addr)
		script := fmt.Sprintf(`
import socket, sys
s = socket.create_connection((%q, %s), timeout=1.5)
s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
print(s.recv(4096).decode(errors="replace"))
`, host, port)
		res, err := runtimetest.Exec(ctx, b, id, "user", "/usr/bin/python3", "-c", script)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	if res := connect(on, server); res.ExitCode != 0 || !strings.Contains(res.Stdout, egresstest.Reply+inetHost+":") {
		t.Errorf("with internet: GET %s = %v; want an answer, masqueraded to %s", server, res, inetHost)
	}
	// A pause to disk gives the veth up and keeps the address reserved;
	// resume brings egress back on the same address.
	ipOf := func(id string) string {
		return strings.TrimSpace(mustExec(t, b, id, "ip -o -4 addr show dev eth0 | awk '{print $4}' | cut -d/ -f1"))
	}
	before := ipOf(on)
	if err := b.Pause(ctx, on, runtime.PauseDisk); err != nil {
		t.Fatalf("Pause(disk) = %v", err)
	}
	if _, err := net.InterfaceByName(hostIfOf(on)); err == nil {
		t.Errorf("veth %s kept while paused to disk", hostIfOf(on))
	}
	if restarted, err := b.Resume(ctx, on); err != nil || !restarted {
		t.Fatalf("Resume = %v, %v; want restarted", restarted, err)
	}
	if after := ipOf(on); after != before {
		t.Errorf("address after a pause to disk = %q; want %q", after, before)
	}
	if res := connect(on, server); res.ExitCode != 0 || !strings.Contains(res.Stdout, egresstest.Reply+inetHost+":") {
		t.Errorf("with internet, after a pause to disk: GET %s = %v", server, res)
	}

	res := connect(off, server)
	t.Logf("sandbox without internet → %s: %s", server, lastLine(res.Stderr))
	if res.ExitCode == 0 {
		t.Errorf("without internet: GET %s succeeded: %v", server, res)
	}

	// Never the host: not its loopback, not the gateway address, not its
	// own addresses, whatever the listener is bound to.
	hostLn, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	go func() { // ends on Close
		for {
			c, err := hostLn.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nhost")
			c.Close()
		}
	}()
	_, hostPort, _ := net.SplitHostPort(hostLn.Addr().String())
	// Targets: loopback and the host's end of the sandbox's veth (an address
	// of a namespace this backend made). The machine's other interfaces are
	// deliberately not probed: the project sends traffic only to loopback and
	// to its own namespaces.
	targets := []string{"127.0.0.1", env.egress.Addr().Next().String()}
	for _, h := range targets {
		// Send nothing unless the address is this machine's right now.
		if out, err := exec.Command("ip", "route", "get", h).Output(); err != nil || !strings.HasPrefix(string(out), "local ") {
			t.Fatalf("%s is not a local address (%s, %v): refusing to send anything", h, out, err)
		}
		res := connect(on, net.JoinHostPort(h, hostPort))
		t.Logf("sandbox → host %s:%s: %s", h, hostPort, lastLine(res.Stderr))
		if res.ExitCode == 0 {
			t.Errorf("sandbox with internet reached the host at %s:%s: %v", h, hostPort, res)
		}
	}

	// Never another sandbox.
	otherIP := strings.TrimSpace(mustExec(t, b, other, "ip -o -4 addr show dev eth0 | awk '{print $4}' | cut -d/ -f1"))
	if otherIP == "" {
		t.Fatal("no address on eth0 in the other sandbox")
	}
	if out, err := exec.Command("ip", "route", "get", otherIP).Output(); err != nil || !strings.Contains(string(out), "dev "+hostIfOf(other)) {
		t.Fatalf("%s is not routed to the other sandbox (%s, %v): refusing to send anything", otherIP, out, err)
	}
	mustExec(t, b, other, "cd /tmp && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &) && sleep 0.5")
	res = connect(on, otherIP+":8000")
	t.Logf("sandbox → sandbox %s:8000: %s", otherIP, lastLine(res.Stderr))
	if res.ExitCode == 0 {
		t.Errorf("sandbox reached another sandbox at %s: %v", otherIP, res)
	}
	if res := connect(other, "127.0.0.1:8000"); res.ExitCode != 0 {
		t.Errorf("the other sandbox cannot reach its own server: %v", res) // the check above is meaningful
	}

	if got := mustExec(t, b, on, "cat /etc/resolv.conf"); strings.Contains(got, "127.0.0.1") || !strings.Contains(got, "nameserver") {
		t.Errorf("resolv.conf with internet = %q; want the host's non-loopback nameservers", got)
	}

	if err := b.Destroy(ctx, on); err != nil {
		t.Fatal(err)
	}
	host := hostIfOf(on)
	if _, err := net.InterfaceByName(host); err == nil {
		t.Errorf("veth %s left after Destroy", host)
	}
}

func mustExec(t *testing.T, b runtime.Backend, id, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := runtimetest.Exec(ctx, b, id, "root", "/bin/sh", "-c", script)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%q: %v, %v", script, res, err)
	}
	return res.Stdout
}

func hostIfOf(id string) string { return local.HostInterface(id) }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
