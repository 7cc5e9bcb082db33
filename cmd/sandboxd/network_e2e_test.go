package main

import (
	"context"
	"fmt"
	"net/http"
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
