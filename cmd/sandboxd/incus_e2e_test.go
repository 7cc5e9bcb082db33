package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/incus"
	"github.com/sandboxd/sandboxd/runtime/egress"
)

// End-to-end tests of sandboxd on the Incus backend: the same harness as
// e2e_test.go, with `serve --backend incus`. They need what
// scripts/incus-setup.sh prepares (incusd on its default socket, the pool
// sandboxd and the image sandboxd-base) and skip, naming what is missing,
// without it.

// incusE2EKey is the config key naming a sandbox on its Incus instance.
const incusE2EKey = "user.sandboxd.id"

// newIncusE2EEnv is newE2EEnv with sandboxd on the Incus backend and a
// random egress /24 of its own (never 10.134.0.0/24, compat-tests/run.sh's once).
// Its cleanup, run after the env's own (which kills every sandbox through
// the API), checks that Incus holds no instance of the test's sandboxes.
func newIncusE2EEnv(t *testing.T, tenants ...string) (*e2eEnv, *incus.Client) {
	t.Helper()
	if e2eSkipReason != "" {
		t.Skip(e2eSkipReason)
	}
	c := incus.NewUnixClient(incus.DefaultSocket)
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := os.Stat(incus.DefaultSocket); err != nil {
		t.Skipf("no Incus at %s (run scripts/incus-setup.sh): %v", incus.DefaultSocket, err)
	}
	if _, err := c.Server(ctx); err != nil {
		t.Skipf("Incus at %s does not answer (run scripts/incus-setup.sh): %v", incus.DefaultSocket, err)
	}
	if _, err := c.ImageAlias(ctx, "sandboxd-base"); err != nil {
		t.Skipf("no image sandboxd-base in Incus (run scripts/incus-setup.sh): %v", err)
	}
	// sandboxd on Incus has no namespace: at start-up it adopts every
	// namespace-less sandboxd instance and reconciles away those its store
	// lacks. Never do that to another sandboxd's sandboxes.
	all, err := c.Instances(ctx, incusE2EKey)
	if err != nil {
		t.Fatalf("list Incus instances: %v", err)
	}
	for _, in := range all {
		if in.Config["user.sandboxd.namespace"] == "" {
			t.Skipf("another sandboxd's Incus sandbox (%s) is live; a sandboxd on the Incus backend would reconcile it away at start-up", in.Name)
		}
	}
	var e *e2eEnv
	t.Cleanup(func() {
		if e == nil {
			return
		}
		// Deletions run in the background of the sandboxd that was stopped
		// last; an instance it left is deleted by the env's second
		// sandboxd, so a short wait is enough here.
		e2eEventually(t, "no Incus instance of the test's sandboxes remains", time.Minute, 100*time.Millisecond,
			func() (bool, string) {
				left := incusInstancesOf(t, c, e.sandboxIDs())
				return len(left) == 0, fmt.Sprint(left)
			})
	})
	e = newSerialE2EEnv(t, tenants...)
	var b [1]byte
	for b[0] == 0 {
		_, _ = rand.Read(b[:])
	}
	subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 134, b[0], 0}), 24)
	e.serveArgs = []string{"--backend", "incus", "--egress-subnet", subnet.String()}
	// sandboxd leaves its subnet's rules when it stops, for sandboxes that
	// outlive it; the test's go with the test.
	t.Cleanup(func() { _ = egress.DeleteTable(subnet) })
	return e, c
}

// incusInstancesOf lists the Incus instances (name and status) that belong
// to any of sandboxes ids.
func incusInstancesOf(t *testing.T, c *incus.Client, ids []string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all, err := c.Instances(ctx, incusE2EKey)
	if err != nil {
		t.Fatalf("list Incus instances: %v", err)
	}
	var out []string
	for _, in := range all {
		if slices.Contains(ids, in.Config[incusE2EKey]) {
			out = append(out, in.Name+" "+in.Status)
		}
	}
	return out
}

// incusNetScript prints what a sandbox sees of its network, without
// iproute2 (not in the image) or any capability: its interfaces, eth0's
// IPv4 address and the default route.
const incusNetScript = `python3 - <<'EOF'
import fcntl, os, socket, struct
print("ifaces", " ".join(sorted(os.listdir("/sys/class/net"))))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    a = fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', b'eth0'))  # SIOCGIFADDR
    print("addr", socket.inet_ntoa(a[20:24]))
except OSError:
    print("addr none")
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    if f[1] == "00000000":
        print("default", f[0], socket.inet_ntoa(struct.pack("<I", int(f[2], 16))))
EOF`

// TestIncusRestart SIGKILLs sandboxd on the Incus backend with several
// sandboxes (with and without internet access; running, paused in memory
// and paused to disk), starts a new
// sandboxd on the same data and run dirs, and checks that every sandbox is
// listed with its state, reachable through the proxy with its files, env
// and processes (a pause to disk ends those), that the paused ones resume, that those with internet
// access kept their network on both sides of their veth, and that killing
// them all leaves no instance in Incus.
func TestIncusRestart(t *testing.T) {
	e, c := newIncusE2EEnv(t, "alice")
	if err := egress.HaveNft(); err != nil {
		t.Skipf("sandboxes with internet access need nftables: %v", err)
	}
	s1 := e.start()
	key := e.keys["alice"]

	type box struct {
		id, tok  string
		internet bool
		pause    string // "", "memory" or "disk"
		file     []byte
		env      string
		net      string // incusNetScript's output before the restart
	}
	var boxes []*box
	for _, c := range []struct {
		internet bool
		pause    string
	}{{false, ""}, {true, ""}, {false, "memory"}, {true, "memory"}, {false, "disk"}, {true, "disk"}} {
		env := "kept " + e2eRandHex(4)
		sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{
			"timeout": 600, "allow_internet_access": c.internet, "envVars": map[string]string{"SBX_KEPT": env},
		})
		boxes = append(boxes, &box{id: sb.SandboxID, tok: *sb.EnvdAccessToken, internet: c.internet, pause: c.pause,
			file: []byte("survives a restart " + e2eRandHex(8)), env: env})
	}
	wantState := map[string]string{}
	for _, b := range boxes {
		s1.writeFile(t, b.id, b.tok, "/home/user/restart.txt", b.file)
		s1.mustRun(t, b.id, b.tok, "sleep 3600 >/dev/null 2>&1 </dev/null & echo $! >/tmp/sleep.pid")
		b.net = s1.mustRun(t, b.id, b.tok, incusNetScript).stdout
		hasNIC := strings.Contains(b.net, "addr 10.134.")
		if hasNIC != b.internet || strings.Contains(b.net, "default eth0") != b.internet {
			t.Fatalf("sandbox %s (internet %v) sees the network as:\n%s", b.id, b.internet, b.net)
		}
		wantState[b.id] = "running"
		if b.pause != "" {
			body := map[string]any{"memory": b.pause == "memory"}
			wantStatus(t, "pause", s1.api(t, http.MethodPost, "/sandboxes/"+b.id+"/pause", key, body), http.StatusNoContent)
			wantState[b.id] = "paused"
		}
	}

	if err := s1.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ids := e.sandboxIDs()
	left := incusInstancesOf(t, c, ids)
	if len(left) != len(boxes) {
		t.Fatalf("Incus instances after SIGKILL of sandboxd: %v, want all %d", left, len(boxes))
	}
	for _, b := range boxes {
		want := incus.InstanceName("", b.id) + map[string]string{"": " Running", "memory": " Frozen", "disk": " Stopped"}[b.pause]
		if !slices.Contains(left, want) {
			t.Errorf("Incus instances after SIGKILL of sandboxd: %v, want %q", left, want)
		}
	}

	s2 := e.start()
	listed, _ := s2.list(t, key, "")
	if got := e2eSortedIDs(listed); !slices.Equal(got, ids) {
		t.Fatalf("list after restart: %v, want %v", got, ids)
	}
	for _, d := range listed {
		if want := wantState[d.SandboxID]; d.State != want {
			t.Errorf("after restart %s is %s, want %s", d.SandboxID, d.State, want)
		}
	}
	for _, b := range boxes {
		if b.pause != "" {
			wantProxyNotFound(t, "GET /health of a paused sandbox after restart", s2.envd(t, b.id, b.tok, http.MethodGet, "/health", nil, ""), b.id)
			r := s2.api(t, http.MethodPost, "/sandboxes/"+b.id+"/connect", key, map[string]any{"timeout": 600})
			wantStatus(t, "connect a paused sandbox after restart", r, http.StatusCreated)
			if got := wantSandboxBody(t, "connect", r.body); got.EnvdAccessToken == nil || *got.EnvdAccessToken != b.tok {
				t.Errorf("connect after restart: %s, want the same access token", r.body)
			}
		}
		if got := s2.readFile(t, b.id, b.tok, "/home/user/restart.txt"); string(got) != string(b.file) {
			t.Errorf("%s: file after restart: %q, want %q", b.id, got, b.file)
		}
		// A pause to disk ends the processes; the resume starts envd
		// afresh and sandboxd gives it the env vars again.
		want := b.env + "\nalive\n"
		if b.pause == "disk" {
			want = b.env + "\nrestarted\n"
		}
		if res := s2.mustRun(t, b.id, b.tok, `echo "$SBX_KEPT"; if grep -qsx sleep /proc/[0-9]*/comm; then kill -0 "$(cat /tmp/sleep.pid)" && echo alive; else echo restarted; fi`); res.stdout != want {
			t.Errorf("%s (paused %q): env and background process after restart: %q %q, want %q", b.id, b.pause, res.stdout, res.stderr, want)
		}
		if got := s2.mustRun(t, b.id, b.tok, incusNetScript).stdout; got != b.net {
			t.Errorf("%s: network after restart:\n%s\nbefore:\n%s", b.id, got, b.net)
		}
		host, _ := egress.LinkNames(incus.InstanceName("", b.id))
		if hostEnd := e2eExists(filepath.Join("/sys/class/net", host)); hostEnd != b.internet {
			t.Errorf("%s (internet %v): host end %s of its veth exists: %v", b.id, b.internet, host, hostEnd)
		}
		wantStatus(t, "GET /files without the token after restart",
			s2.envd(t, b.id, "", http.MethodGet, "/files?path=/home/user/restart.txt", nil, ""), http.StatusUnauthorized)
	}

	for _, b := range boxes {
		wantStatus(t, "kill "+b.id, s2.api(t, http.MethodDelete, "/sandboxes/"+b.id, key, nil), http.StatusNoContent)
	}
	if got, _ := s2.list(t, key, ""); len(got) != 0 {
		t.Errorf("list after killing them all: %v", e2eIDs(got))
	}
	e2eEventually(t, "killed sandboxes' instances are deleted from Incus", time.Minute, 100*time.Millisecond,
		func() (bool, string) {
			left := incusInstancesOf(t, c, ids)
			return len(left) == 0, fmt.Sprint(left)
		})
	// The env's cleanup checks the run dir (socket directories) and mounts.
}

// incusLayerKey is the config key naming the layer a layer instance holds.
const incusLayerKey = "user.sandboxd.layer"

// ownLayers returns the layer instances, made or half made, that a
// namespace-less sandboxd (the e2e tests') could have made, by instance
// name, with the layer key each holds; the incus package's tests, which
// run beside these, use namespaces.
func ownLayers(t *testing.T, c *incus.Client) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ins, err := c.Instances(ctx, incusLayerKey)
	if err != nil {
		t.Fatalf("list Incus layer instances: %v", err)
	}
	out := map[string]string{}
	for _, in := range ins {
		if in.Config["user.sandboxd.namespace"] == "" {
			out[in.Name] = in.Config[incusLayerKey]
		}
	}
	return out
}
