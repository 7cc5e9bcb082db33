package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime/egress/egresstest"
)

// networkE2E is a sandboxd with egress on a subnet of its own, two hosts
// of the fake internet, and a tenant.
type networkE2E struct {
	e        *e2eEnv
	key      string
	one, two egresstest.Inet
}

func newNetworkE2E(t *testing.T, subnet string) *networkE2E {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for sandboxes with internet access")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (Debian package nftables) for sandboxes with internet access")
	}
	n := &networkE2E{one: egresstest.NewInet(t, "na", 3), two: egresstest.NewInet(t, "nb", 3)}
	n.e = newE2EEnv(t, "a")
	// A subnet of its own: its nftables table is this sandboxd's alone.
	n.e.serveArgs = append(n.e.serveArgs, "--egress-subnet="+subnet)
	n.e.start()
	n.key = n.e.keys["a"]
	return n
}

// create makes a sandbox with internet access and network (E2B's create
// body's), returning its id and envd token.
func (n *networkE2E) create(t *testing.T, network map[string]any) (id, token string) {
	t.Helper()
	body := map[string]any{"allow_internet_access": true}
	if network != nil {
		body["network"] = network
	}
	sb, _ := n.e.create(t, "/v2/sandboxes", n.key, body)
	return sb.SandboxID, *sb.EnvdAccessToken
}

// reaches reports whether sandbox id gets an answer from addr (a fake
// internet server) within 3 s.
func (n *networkE2E) reaches(t *testing.T, id, token, addr string) bool {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := n.e.current().run(ctx, id, token, fmt.Sprintf(`python3 -c '
import socket
s = socket.create_connection(("%s", %s), timeout=3)
s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
print(s.recv(4096).decode(errors="replace"))
'`, host, port))
	if err != nil {
		t.Fatalf("run in %s: %v", id, err)
	}
	return res.exitCode == 0 && strings.Contains(res.stdout, egresstest.Reply)
}

// want checks what sandbox id reaches of the two hosts.
func (n *networkE2E) want(t *testing.T, what, id, token string, one, two bool) {
	t.Helper()
	if got := n.reaches(t, id, token, n.one.Server); got != one {
		t.Errorf("%s: %s reaches %s = %v, want %v", what, id, n.one.Server, got, one)
	}
	if got := n.reaches(t, id, token, n.two.Server); got != two {
		t.Errorf("%s: %s reaches %s = %v, want %v", what, id, n.two.Server, got, two)
	}
}

func (n *networkE2E) update(t *testing.T, id string, body map[string]any) {
	t.Helper()
	wantStatus(t, "PUT network", n.e.current().api(t, http.MethodPut, "/sandboxes/"+id+"/network", n.key, body), http.StatusNoContent)
}

// TestNetworkPolicyE2E: E2B's address rules through the API, in the
// kernel: allow inside deny-all, a deny list, allow_internet_access=false
// with allowOut, getInfo, live updates both ways with a connection the new
// policy allows kept open, and a restart (SIGKILL) that keeps every policy
// in force and lets updates go on.
func TestNetworkPolicyE2E(t *testing.T) {
	n := newNetworkE2E(t, "10.197.0.0/16")
	oneIP, twoIP := n.one.IP.String(), n.two.IP.String()
	all := "0.0.0.0/0"

	open, openTok := n.create(t, nil)
	n.want(t, "no policy", open, openTok, true, true)

	allowOne, allowOneTok := n.create(t, map[string]any{"allowOut": []string{oneIP}, "denyOut": []string{all}})
	n.want(t, "one allowed in deny-all", allowOne, allowOneTok, true, false)
	r := n.e.current().api(t, http.MethodGet, "/sandboxes/"+allowOne, n.key, nil)
	if !strings.Contains(string(r.body), `"allowOut":["`+oneIP+`"]`) || !strings.Contains(string(r.body), `"denyOut":["0.0.0.0/0"]`) {
		t.Errorf("getInfo: %s, want the policy", r.body)
	}

	denyTwo, denyTwoTok := n.create(t, map[string]any{"denyOut": []string{twoIP + "/32"}})
	n.want(t, "two denied", denyTwo, denyTwoTok, true, false)

	// allow_internet_access=false is denyOut ALL_TRAFFIC; allowOut opens it.
	sb, _ := n.e.create(t, "/sandboxes", n.key, map[string]any{"allow_internet_access": false, "network": map[string]any{"allowOut": []string{oneIP}}})
	n.want(t, "no internet but one", sb.SandboxID, *sb.EnvdAccessToken, true, false)

	// Live: a connection to one, opened before an update that keeps one
	// allowed, goes on; two opens up; then everything closes.
	held := fmt.Sprintf(`python3 -c '
import socket, time
s = socket.create_connection(("%s", %s), timeout=3)
open("/tmp/connected", "w").close()
while not __import__("os").path.exists("/tmp/go"): time.sleep(0.05)
s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
print(s.recv(4096).decode(errors="replace"))
' > /tmp/held.out 2>&1 &
for i in $(seq 100); do [ -e /tmp/connected ] && exit 0; sleep 0.05; done; cat /tmp/held.out; exit 1`, n.one.IP, portOf(n.one.Server))
	n.e.current().mustRun(t, allowOne, allowOneTok, held)
	n.update(t, allowOne, map[string]any{"allowOut": []string{oneIP, twoIP}, "denyOut": []string{all}})
	n.e.current().mustRun(t, allowOne, allowOneTok, "touch /tmp/go; for i in $(seq 100); do grep -q . /tmp/held.out && break; sleep 0.05; done")
	if out := n.e.current().mustRun(t, allowOne, allowOneTok, "cat /tmp/held.out").stdout; !strings.Contains(out, egresstest.Reply) {
		t.Errorf("a connection the update kept allowed: %q, want the answer", out)
	}
	n.want(t, "both allowed after update", allowOne, allowOneTok, true, true)
	n.update(t, allowOne, map[string]any{"denyOut": []string{all}})
	n.want(t, "deny-all after update", allowOne, allowOneTok, false, false)
	n.update(t, open, map[string]any{"allow_internet_access": false})
	n.want(t, "allow_internet_access false after update", open, openTok, false, false)
	n.update(t, denyTwo, map[string]any{})
	n.want(t, "cleared", denyTwo, denyTwoTok, true, true)

	// Sandboxes stay apart whatever a policy allows: one allowing the
	// whole egress subnet still does not reach another's server.
	peer, peerTok := n.create(t, nil)
	n.e.current().mustRun(t, peer, peerTok, "cd /tmp && (setsid python3 -m http.server 8000 >/dev/null 2>&1 &) && for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), timeout=1)' 2>/dev/null && exit 0; sleep 0.1; done; exit 1")
	peerIP := strings.TrimSpace(n.e.current().mustRun(t, peer, peerTok, "ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1").stdout)
	nosy, nosyTok := n.create(t, map[string]any{"allowOut": []string{"10.197.0.0/16"}, "denyOut": []string{all}})
	connects := func(id, tok string) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := n.e.current().run(ctx, id, tok, fmt.Sprintf(`python3 -c 'import socket; socket.create_connection(("%s", 8000), timeout=3)'`, peerIP))
		return err == nil && res.exitCode == 0
	}
	if !connects(peer, peerTok) {
		t.Fatalf("sandbox %s does not reach its own server at %s:8000", peer, peerIP) // the check below means something
	}
	if connects(nosy, nosyTok) {
		t.Errorf("a sandbox allowing the egress subnet reached another sandbox at %s:8000", peerIP)
	}

	// A crash keeps every policy in force, and updates work after it.
	n.update(t, allowOne, map[string]any{"allowOut": []string{twoIP}, "denyOut": []string{all}})
	if err := n.e.current().stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	n.e.start()
	n.want(t, "after a restart", allowOne, allowOneTok, false, true)
	n.want(t, "deny-all after a restart", open, openTok, false, false)
	n.update(t, allowOne, map[string]any{})
	n.want(t, "cleared after a restart", allowOne, allowOneTok, true, true)
}

func portOf(addr string) string {
	_, p, _ := strings.Cut(addr, ":")
	return p
}

// getScript fetches / from argv: host port tls [connect-to [sni]], the
// way a client in the sandbox would (its resolver, unless connect-to
// gives the address), and prints the answer.
const getScript = `
import socket, ssl, sys
host, port, tls = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "tls"
addr = sys.argv[4] if len(sys.argv) > 4 else host
sni = sys.argv[5] if len(sys.argv) > 5 else host
s = socket.create_connection((addr, port), timeout=3)
if tls:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    s = ctx.wrap_socket(s, server_hostname=sni)
s.sendall(("GET / HTTP/1.0\r\nHost: %s\r\n\r\n" % host).encode())
data = b""
while True:
    d = s.recv(4096)
    if not d:
        break
    data += d
print(data.decode(errors="replace"))
`

// dnsScript asks argv[1] (a resolver) for the A record of argv[2] over
// TCP (argv[3] == "tcp") or UDP, and prints the answer's rcode and count.
const dnsScript = `
import socket, struct, sys
server, name, tcp = sys.argv[1], sys.argv[2], sys.argv[3] == "tcp"
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
if tcp:
    s = socket.create_connection((server, 53), timeout=3)
    s.sendall(struct.pack(">H", len(q)) + q)
    n = struct.unpack(">H", s.recv(2))[0]
    a = b""
    while len(a) < n:
        a += s.recv(n - len(a))
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(q, (server, 53))
    a = s.recv(4096)
print("rcode=%d answers=%d" % (a[3] & 15, struct.unpack(">H", a[6:8])[0]))
`

// TestNetworkDomainsE2E: domain rules through the API, by name: allowed
// names over TLS (SNI) and HTTP (Host), a wildcard, other names refused by
// DNS and by the proxy whatever address the sandbox connects to (a forged
// SNI or Host reaches the allowed name's own address, never the one the
// sandbox chose), DNS over TCP to another server filtered too, other
// ports refused; a live update that moves the allowance, cutting the
// proxied connection it no longer allows; a restart (SIGKILL) after which
// the policy holds; the metrics and the audit lines.
func TestNetworkDomainsE2E(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for sandboxes with internet access")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (Debian package nftables) for sandboxes with internet access")
	}
	one, two := egresstest.NewInet(t, "da", 3), egresstest.NewInet(t, "db", 3)
	names := map[string]netip.Addr{
		"allowed.sbx.test": one.IP, "denied.sbx.test": one.IP, "a.wild.sbx.test": one.IP, "wild.sbx.test": one.IP,
		"evil.sbx.test": two.IP,
	}
	all := []string{"allowed.sbx.test", "denied.sbx.test", "a.wild.sbx.test", "wild.sbx.test", "evil.sbx.test"}
	dns := one.ServeDNS(t, names)
	for _, in := range []egresstest.Inet{one, two} {
		in.ServeHTTPOn(t, 443, all...)
		in.ServeHTTPOn(t, 80)
	}
	e := newE2EEnv(t, "a")
	e.serveArgs = append(e.serveArgs, "--egress-subnet=10.196.0.0/16", "--egress-dns="+dns.String())
	s := e.start()
	key := e.keys["a"]
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"allow_internet_access": true, "network": map[string]any{
		"allowOut": []string{"allowed.sbx.test", "*.wild.sbx.test"}, "denyOut": []string{"0.0.0.0/0"}}})
	id, tok := sb.SandboxID, *sb.EnvdAccessToken
	e.current().writeFile(t, id, tok, "/tmp/get.py", []byte(getScript))
	e.current().writeFile(t, id, tok, "/tmp/dns.py", []byte(dnsScript))
	get := func(args ...string) (string, bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := e.current().run(ctx, id, tok, "python3 /tmp/get.py "+strings.Join(args, " "))
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		return res.stdout + res.stderr, res.exitCode == 0 && strings.Contains(res.stdout, egresstest.Reply)
	}
	from := func(in egresstest.Inet) string { return egresstest.Reply + in.Host + ":" }
	for _, tc := range []struct {
		name string
		args []string
		want string // "" = refused; else what the answer (from one) must hold
	}{
		{"allowed, TLS", []string{"allowed.sbx.test", "443", "tls"}, from(one)},
		{"allowed, HTTP", []string{"allowed.sbx.test", "80", "http"}, " host=allowed.sbx.test"},
		{"wildcard", []string{"a.wild.sbx.test", "443", "tls"}, from(one)},
		{"wildcard's parent", []string{"wild.sbx.test", "443", "tls", one.IP.String()}, ""},
		{"denied name (DNS)", []string{"denied.sbx.test", "443", "tls"}, ""},
		{"denied name by address", []string{"denied.sbx.test", "443", "tls", one.IP.String()}, ""},
		{"no name", []string{one.IP.String(), "443", "tls"}, ""},
		{"forged SNI", []string{"allowed.sbx.test", "443", "tls", two.IP.String()}, from(one)},
		{"forged Host", []string{"allowed.sbx.test", "80", "http", two.IP.String()}, from(one)},
		{"allowed name, other port", []string{"allowed.sbx.test", portOf(one.Server), "http", one.IP.String()}, ""},
	} {
		out, ok := get(tc.args...)
		switch {
		case tc.want == "" && ok:
			t.Errorf("%s: %v answered %q, want it refused", tc.name, tc.args, out)
		case tc.want != "" && (!ok || !strings.Contains(out, tc.want) || !strings.Contains(out, from(one))):
			t.Errorf("%s: %v = %q, want an answer with %q", tc.name, tc.args, out, tc.want)
		}
	}
	for _, tc := range []struct{ server, name, proto, want string }{
		{dns.String(), "allowed.sbx.test", "udp", "rcode=0 answers=1"},
		{dns.String(), "denied.sbx.test", "udp", "rcode=3 answers=0"},
		{two.IP.String(), "allowed.sbx.test", "tcp", "rcode=0 answers=1"}, // another server, over TCP: the filter answers
		{two.IP.String(), "denied.sbx.test", "tcp", "rcode=3 answers=0"},
	} {
		if out := e.current().mustRun(t, id, tok, "python3 /tmp/dns.py "+tc.server+" "+tc.name+" "+tc.proto).stdout; !strings.Contains(out, tc.want) {
			t.Errorf("DNS %s %s via %s: %q, want %q", tc.proto, tc.name, tc.server, out, tc.want)
		}
	}

	// IPv6 is no way around it (sandboxes have none), and an allow rule
	// for the gateway does not open the host.
	if res, err := e.current().run(t.Context(), id, tok, `python3 -c '
import socket
socket.create_connection(("2001:db8::1", 443), timeout=3)'`); err != nil || res.exitCode == 0 {
		t.Errorf("IPv6 connect from the sandbox: %+v %v, want it refused", res, err)
	}
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
			c.Close()
		}
	}()
	wantStatus(t, "PUT network", s.api(t, http.MethodPut, "/sandboxes/"+id+"/network", key,
		map[string]any{"allowOut": []string{"10.196.0.1", "allowed.sbx.test"}, "denyOut": []string{"0.0.0.0/0"}}), http.StatusNoContent)
	if res, err := e.current().run(t.Context(), id, tok, fmt.Sprintf(`python3 -c '
import socket
socket.create_connection(("10.196.0.1", %d), timeout=3)'`, ln.Addr().(*net.TCPAddr).Port)); err != nil || res.exitCode == 0 {
		t.Errorf("the host through an allowed gateway address: %+v %v, want it refused", res, err)
	}

	// Live: a proxied connection to allowed.sbx.test, held open across an
	// update that no longer allows it, is cut; denied.sbx.test opens.
	held := `python3 -c '
import socket, ssl, time, os
s = socket.create_connection(("allowed.sbx.test", 443), timeout=3)
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
s = ctx.wrap_socket(s, server_hostname="allowed.sbx.test")
open("/tmp/connected", "w").close()
while not os.path.exists("/tmp/go"): time.sleep(0.05)
try:
    s.sendall(b"GET / HTTP/1.0\r\nHost: allowed.sbx.test\r\n\r\n")
    print("answer", s.recv(4096))
except Exception as e:
    print("cut", e)
' > /tmp/held.out 2>&1 &
for i in $(seq 100); do [ -e /tmp/connected ] && exit 0; sleep 0.05; done; cat /tmp/held.out; exit 1`
	e.current().mustRun(t, id, tok, held)
	wantStatus(t, "PUT network", s.api(t, http.MethodPut, "/sandboxes/"+id+"/network", key,
		map[string]any{"allowOut": []string{"denied.sbx.test"}, "denyOut": []string{"0.0.0.0/0"}}), http.StatusNoContent)
	e.current().mustRun(t, id, tok, "touch /tmp/go; for i in $(seq 100); do grep -q . /tmp/held.out && break; sleep 0.05; done")
	if out := e.current().mustRun(t, id, tok, "cat /tmp/held.out").stdout; strings.Contains(out, "from-inet") {
		t.Errorf("a proxied connection the update no longer allows: %q, want it cut", out)
	}
	if out, ok := get("denied.sbx.test", "443", "tls"); !ok {
		t.Errorf("denied.sbx.test after the update allowed it: %q", out)
	}
	if out, ok := get("allowed.sbx.test", "443", "tls", one.IP.String()); ok {
		t.Errorf("allowed.sbx.test after the update no longer allowed it: %q", out)
	}

	// The metrics and the audit trail.
	r := s.do(t, http.MethodGet, "/metrics", "", nil)
	for _, want := range []string{`sandboxd_egress_decisions_total{decision="denied",kind="tcp",sandbox_id="` + id + `"}`,
		`sandboxd_egress_decisions_total{decision="allowed",kind="dns",sandbox_id="` + id + `"}`,
		`sandboxd_egress_address_denied_packets_total{sandbox_id="` + id + `"}`,
		`sandboxd_egress_address_denied_connections_total{sandbox_id="` + id + `"}`,
		`sandboxd_egress_address_allowed_connections_total{sandbox_id="` + id + `"}`} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(string(s.logs()), `"decision":"denied"`) {
		t.Error("no audit line for a denied destination")
	}

	// A crash: the policy holds, through a new process's filter.
	if err := s.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.start()
	if out, ok := get("denied.sbx.test", "443", "tls"); !ok {
		t.Errorf("denied.sbx.test after a restart: %q, want it allowed still", out)
	}
	if out, ok := get("allowed.sbx.test", "443", "tls", one.IP.String()); ok {
		t.Errorf("allowed.sbx.test after a restart: %q, want it refused still", out)
	}
}
