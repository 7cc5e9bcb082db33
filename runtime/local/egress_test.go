package local_test

import (
	"context"
	"net"
	"net/netip"
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
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) { testEgress(t, m) })
	}
}

// TestEgressReadyAtNew: New installs the egress rules, so that the first
// create with internet access does not wait for nft.
func TestEgressReadyAtNew(t *testing.T) {
	env := newEnv(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (Debian package nftables) for sandboxes with internet access")
	}
	if b := env.open(t); !b.EgressReady() {
		t.Fatal("egress not set up by New")
	}
}

func testEgress(t *testing.T, mode local.UserNSMode) {
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
	server, inetHost := egresstest.FakeInternet(t, "rt", 0)
	lan := egresstest.FakeLAN(t, "rl")

	b := env.openMode(t, mode)
	ctx := t.Context()
	mk := func(internet bool) string {
		id := runtimetest.NewID()
		if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, AllowInternet: internet})); err != nil {
			t.Fatalf("Create(internet %v) = %v", internet, err)
		}
		t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
		return id
	}
	on, other, off := mk(true), mk(true), mk(false)

	egresstest.CheckReaches(t, b, on, server, inetHost)
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
	egresstest.CheckReaches(t, b, on, server, inetHost) // after a pause to disk

	egresstest.CheckNoInternet(t, b, off, server)
	egresstest.CheckNoLAN(t, b, on, lan)
	egresstest.CheckNoHost(t, b, on, env.egress.Addr().Next())
	otherIP := strings.TrimSpace(mustExec(t, b, other, "ip -o -4 addr show dev eth0 | awk '{print $4}' | cut -d/ -f1"))
	if otherIP == "" {
		t.Fatal("no address on eth0 in the other sandbox")
	}
	egresstest.CheckNoNeighbour(t, b, on, other, otherIP, hostIfOf(other))

	if got := mustExec(t, b, on, "cat /etc/resolv.conf"); strings.Contains(got, "127.0.0.1") || !strings.Contains(got, "nameserver") {
		t.Errorf("resolv.conf with internet = %q; want the host's non-loopback nameservers", got)
	}

	if err := b.Destroy(ctx, on); err != nil {
		t.Fatal(err)
	}
	// The veth goes with the sandbox's network namespace, which the kernel
	// tears down right after Destroy (releaseNet).
	host := hostIfOf(on)
	deadline := time.Now().Add(5 * time.Second)
	for _, err := net.InterfaceByName(host); err == nil; _, err = net.InterfaceByName(host) {
		if time.Now().After(deadline) {
			t.Errorf("veth %s left 5 s after Destroy", host)
			break
		}
		time.Sleep(10 * time.Millisecond)
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

// TestEgressPolicy: per-sandbox egress policies, by address and by name
// (egresstest.CheckPolicy), on sandboxes of this backend.
func TestEgressPolicy(t *testing.T) {
	env := newEnv(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (Debian package nftables) for sandboxes with internet access")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("needs python3 in the base template for a TCP client")
	}
	one, two := egresstest.NewInet(t, "rp", 0), egresstest.NewInet(t, "rq", 0)
	names := map[string]netip.Addr{}
	for _, n := range egresstest.Names {
		names[n] = one.IP
	}
	opts := env.options(t)
	opts.EgressDNS = []netip.Addr{one.ServeDNS(t, names)}
	one.ServeHTTPOn(t, 80)
	two.ServeHTTPOn(t, 80)
	b, err := local.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	id := runtimetest.NewID()
	if _, err := b.Create(t.Context(), runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, AllowInternet: true})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	egresstest.CheckPolicy(t, b, id, one, two)
}
