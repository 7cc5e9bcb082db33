package incus_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/incus"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/egress"
	"github.com/sandboxd/sandboxd/runtime/egress/egresstest"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// egressSubnet is a random /24 of the Incus default 10.134.0.0/16, never
// 10.134.0.0/24 (which compat-tests/run.sh gave its sandboxd once), so that
// tests running side by side do not share addresses.
func egressSubnet(t testing.TB) netip.Prefix {
	var b [1]byte
	for b[0] == 0 {
		_, _ = rand.Read(b[:])
	}
	p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 134, b[0], 0}), 24)
	// The rules of a subnet stay when the backend goes, for sandboxes
	// that outlive sandboxd; the test's go with the test.
	t.Cleanup(func() { _ = egress.DeleteTable(p) })
	return p
}

// ifaceScript prints eth0's IPv4 address and the default gateway, read
// without iproute2 (not in the image) or any capability.
const ifaceScript = `
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    a = fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', b'eth0'))  # SIOCGIFADDR
    print("addr", socket.inet_ntoa(a[20:24]))
except OSError as e:
    print("addr none", e)
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    if f[1] == "00000000":
        print("default", f[0], socket.inet_ntoa(struct.pack("<I", int(f[2], 16))))
`

func TestEgress(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if err := egress.HaveNft(); err != nil {
		t.Skip(err)
	}
	server, inetHost := egresstest.FakeInternet(t, "it", 1)
	lan := egresstest.FakeLAN(t, "il")
	subnet := egressSubnet(t)
	ns := randHex()
	opts := options(t, ns)
	opts.EgressSubnet = subnet
	b := newBackendWith(t, ns, opts)
	gateway := subnet.Addr().Next()
	ctx := t.Context()

	mk := func(b *incus.Backend, internet bool) string {
		id := runtimetest.NewID()
		if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, CPUCount: 1, AllowInternet: internet})); err != nil {
			t.Fatalf("Create(internet %v) = %v", internet, err)
		}
		t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
		return id
	}
	on, other, off := mk(b, true), mk(b, true), mk(b, false)
	hostIf := func(id string) string {
		h, _ := egress.LinkNames(incus.InstanceName("test-"+ns, id))
		return h
	}
	run := func(id, user, script string) runtimetest.Result {
		t.Helper()
		res, err := runtimetest.Exec(ctx, b, id, user, "/usr/bin/python3", "-c", script)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// The sandbox's view: eth0 with its address, a default route on-link
	// via the gateway; without internet, no eth0 and no route.
	addrOf := map[string]string{}
	for _, id := range []string{on, other} {
		res := run(id, "user", ifaceScript)
		var addr string
		if _, err := fmt.Sscanf(res.Stdout, "addr %s", &addr); err != nil || !subnet.Contains(netip.MustParseAddr(addr)) {
			t.Fatalf("eth0 in a sandbox with internet: %v; want an address in %s", res, subnet)
		}
		if want := "default eth0 " + gateway.String(); !strings.Contains(res.Stdout, want) {
			t.Errorf("routes in a sandbox with internet: %q; want %q", res.Stdout, want)
		}
		addrOf[id] = addr
	}
	if addrOf[on] == addrOf[other] {
		t.Errorf("two sandboxes got the same address %s", addrOf[on])
	}
	if res := run(off, "user", ifaceScript); !strings.HasPrefix(res.Stdout, "addr none") || strings.Contains(res.Stdout, "default") {
		t.Errorf("network of a sandbox without internet: %v; want no eth0, no default route", res)
	}
	if res := run(off, "root", "import os; print(sorted(os.listdir('/sys/class/net')))"); strings.TrimSpace(res.Stdout) != "['lo']" {
		t.Errorf("interfaces without internet: %v; want lo only", res)
	}

	// The fake internet, through the masquerade; never the LAN, the host
	// or another sandbox.
	egresstest.CheckReaches(t, b, on, server, inetHost)
	egresstest.CheckNoInternet(t, b, off, server)
	egresstest.CheckNoLAN(t, b, on, lan)
	egresstest.CheckNoHost(t, b, on, gateway)
	egresstest.CheckNoNeighbour(t, b, on, other, addrOf[other], hostIf(other))

	if res := run(on, "user", "print(open('/etc/resolv.conf').read())"); strings.Contains(res.Stdout, "127.0.0.1") || !strings.Contains(res.Stdout, "nameserver") {
		t.Errorf("resolv.conf with internet = %v; want the host's non-loopback nameservers", res)
	}

	// The address is in the instance's config, and a restarted backend
	// (same namespace) knows it is taken.
	l, err := b.Client().Instances(ctx, "user.sandboxd.id")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range l {
		if in.Config["user.sandboxd.id"] == on && (in.Config["user.sandboxd.egress-ip"] != addrOf[on] || in.Devices["eth0"]["host_name"] != hostIf(on)) {
			t.Errorf("instance of %s: config %v, devices %v; want user.sandboxd.egress-ip %s and host end %s",
				on, in.Config, in.Devices, addrOf[on], hostIf(on))
		}
	}
	b2, err := incus.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	third := mk(b2, true)
	if r, err := runtimetest.Exec(ctx, b2, third, "user", "/usr/bin/python3", "-c", ifaceScript); err != nil {
		t.Fatal(err)
	} else if strings.Contains(r.Stdout, "addr "+addrOf[on]+"\n") || strings.Contains(r.Stdout, "addr "+addrOf[other]+"\n") || !strings.Contains(r.Stdout, "addr 10.134.") {
		t.Errorf("a restarted backend gave %q; want a new address, not %s or %s", r.Stdout, addrOf[on], addrOf[other])
	}
	if err := b2.Destroy(ctx, third); err != nil {
		t.Fatal(err)
	}
	if err := b2.WaitDeletes(ctx); err != nil {
		t.Fatal(err)
	}

	// Destroy leaves no veth, address or route.
	if err := b.Destroy(ctx, on); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitDeletes(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(hostIf(on)); err == nil {
		t.Errorf("veth %s left after Destroy", hostIf(on))
	}
	if out, _ := exec.Command("ip", "-4", "route", "show", addrOf[on]+"/32").Output(); len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("route to %s left after Destroy: %s", addrOf[on], out)
	}
	if out, _ := exec.Command("ip", "-4", "-o", "addr", "show", "to", gateway.String()+"/32").Output(); strings.Count(string(out), "\n") != 1 {
		t.Errorf("gateway addresses after Destroy: %q; want only the other sandbox's host end", out)
	}
}

// newBackendWith is newBackend with options of the caller's.
func newBackendWith(t *testing.T, ns string, opts incus.Options) *incus.Backend {
	t.Helper()
	b, err := incus.New(context.Background(), opts)
	if err != nil {
		t.Fatalf("incus.New: %v", err)
	}
	t.Cleanup(func() { cleanupBackend(t, b, ns) })
	return b
}

// TestEgressPolicy: per-sandbox egress policies, by address and by name
// (egresstest.CheckPolicy), on Incus sandboxes.
func TestEgressPolicy(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if err := egress.HaveNft(); err != nil {
		t.Skip(err)
	}
	one, two := egresstest.NewInet(t, "ip", 1), egresstest.NewInet(t, "iq", 1)
	names := map[string]netip.Addr{}
	for _, n := range egresstest.Names {
		names[n] = one.IP
	}
	ns := randHex()
	opts := options(t, ns)
	opts.EgressSubnet = egressSubnet(t)
	opts.EgressDNS = []netip.Addr{one.ServeDNS(t, names)}
	one.ServeHTTPOn(t, 80)
	two.ServeHTTPOn(t, 80)
	b := newBackendWith(t, ns, opts)
	t.Cleanup(func() { _ = b.Close() })
	id := runtimetest.NewID()
	if _, err := b.Create(t.Context(), runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, CPUCount: 1, AllowInternet: true})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	egresstest.CheckPolicy(t, b, id, one, two)
}
