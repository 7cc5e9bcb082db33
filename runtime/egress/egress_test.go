package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		subnet, gateway string
		ok              bool
	}{
		{"10.133.0.0/16", "10.133.0.1", true},
		{"10.134.7.9/24", "10.134.7.1", true}, // masked
		{"192.168.4.0/28", "192.168.4.1", true},
		{"192.168.4.0/29", "", false},
		{"fd00::/64", "", false},
	} {
		e, err := New(netip.MustParsePrefix(tc.subnet))
		if (err == nil) != tc.ok {
			t.Errorf("New(%s) = %v; want ok %v", tc.subnet, err, tc.ok)
			continue
		}
		if tc.ok && e.Gateway().String() != tc.gateway {
			t.Errorf("New(%s).Gateway() = %s; want %s", tc.subnet, e.Gateway(), tc.gateway)
		}
	}
}

func TestAllocate(t *testing.T) {
	e, err := New(netip.MustParsePrefix("10.9.8.0/28"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[netip.Addr]bool{}
	var got []string
	for {
		a, err := e.Allocate(func(a netip.Addr) bool { return used[a] })
		if err != nil {
			if !strings.Contains(err.Error(), "full") {
				t.Fatalf("Allocate: %v; want a full subnet", err)
			}
			break
		}
		used[a] = true
		got = append(got, a.String())
	}
	// .0 network, .1 gateway, .15 broadcast are never handed out.
	if len(got) != 13 || got[0] != "10.9.8.2" || got[12] != "10.9.8.14" {
		t.Errorf("allocated %v; want 10.9.8.2 … 10.9.8.14", got)
	}
	delete(used, netip.MustParseAddr("10.9.8.7"))
	if a, err := e.Allocate(func(a netip.Addr) bool { return used[a] }); err != nil || a.String() != "10.9.8.7" {
		t.Errorf("Allocate after a release = %v, %v; want the freed 10.9.8.7", a, err)
	}
}

func TestLinkNames(t *testing.T) {
	h1, p1 := LinkNames("a")
	h2, _ := LinkNames("b")
	if len(h1) != 15 || len(p1) != 15 || !strings.HasPrefix(h1, HostPrefix) || !strings.HasPrefix(p1, PeerPrefix) || h1[3:] != p1[3:] {
		t.Errorf("LinkNames(a) = %s, %s; want sbx/sbp + the same 12 hex digits", h1, p1)
	}
	if h1 == h2 {
		t.Errorf("two keys got the same name %s", h1)
	}
}

// TestAddressInUse: a second sandbox given an address that is routed to
// another sandbox's veth already (two sandboxd sharing a subnet) fails,
// and the first keeps its route.
func TestAddressInUse(t *testing.T) {
	e := vethEgress(t, "10.139.250.0/24")
	ip := netip.MustParseAddr("10.139.250.7")
	keyA, keyB := "egress-test-a-"+strconv.Itoa(os.Getpid()), "egress-test-b-"+strconv.Itoa(os.Getpid())
	t.Cleanup(func() { DeleteLinks(keyA); DeleteLinks(keyB) })
	a, err := e.CreateVethIn(keyA, ip, netnsProcess(t))
	if err != nil {
		t.Fatalf("CreateVethIn(a) = %v", err)
	}
	if _, err := e.CreateVethIn(keyB, ip, netnsProcess(t)); !errors.Is(err, ErrAddressInUse) {
		t.Fatalf("CreateVethIn(b, same address) = %v; want ErrAddressInUse", err)
	}
	hostB, _ := LinkNames(keyB)
	if _, err := net.InterfaceByName(hostB); err == nil {
		t.Errorf("veth %s left after the failed create", hostB)
	}
	out, err := exec.Command("ip", "-4", "route", "show", ip.String()+"/32").Output()
	if err != nil || !strings.Contains(string(out), "dev "+a.HostIf) {
		t.Errorf("route to %s = %q, %v; want it still via %s", ip, out, err, a.HostIf)
	}
}

// vethEgress is an Egress on subnet for a test that makes veth pairs,
// which needs root: the test is skipped without.
func vethEgress(t *testing.T, subnet string) *Egress {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make veth pairs")
	}
	e, err := New(netip.MustParsePrefix(subnet))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// netnsProcess starts a process in a network namespace of its own (a
// stand-in for a sandbox's init) and returns its pid.
func netnsProcess(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ { // until unshare has made the namespace and exec'd sleep
		// Not only a namespace other than this process's: the child starts
		// in the forking thread's, which is another one when a thread was
		// left in a sandbox's namespace; sleep runs only after the unshare.
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)); err == nil && ns != self && string(comm) == "sleep\n" {
			return cmd.Process.Pid
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("unshare --net did not make a namespace")
	return 0
}

// TestDefaultDeny pins down the list's edges: the operator's networks and
// the special-purpose blocks are in, the internet (including the
// special-purpose blocks IANA marks globally reachable) is out.
func TestDefaultDeny(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		denied bool
	}{
		{"10.1.2.3", true},
		{"172.31.255.255", true},
		{"172.32.0.1", false},
		{"192.168.1.1", true},
		{"100.64.0.1", true},
		{"100.128.0.1", false},
		{"169.254.169.254", true}, // cloud metadata
		{"127.0.0.53", true},
		{"198.19.255.1", true},
		{"224.0.0.251", true}, // mDNS
		{"255.255.255.255", true},
		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"192.52.193.2", false}, // AMT, globally reachable: the tests' fake internet
		{"192.175.48.1", false}, // AS112, globally reachable
		{"192.0.0.170", true},   // NAT64 discovery, in 192.0.0.0/24
		{"11.0.0.1", false},
	} {
		a := netip.MustParseAddr(tc.addr)
		denied := false
		for _, p := range DefaultDeny {
			denied = denied || p.Contains(a)
		}
		if denied != tc.denied {
			t.Errorf("%s in DefaultDeny = %v; want %v", a, denied, tc.denied)
		}
	}
}

func TestNewAllow(t *testing.T) {
	sub := netip.MustParsePrefix("10.133.0.0/16")
	e, err := New(sub, netip.MustParsePrefix("192.168.1.9/24"))
	if err != nil || len(e.allow) != 1 || e.allow[0].String() != "192.168.1.0/24" {
		t.Errorf("New(allow 192.168.1.9/24) = %v, %v; want it masked to 192.168.1.0/24", e, err)
	}
	if _, err := New(sub, netip.MustParsePrefix("fd00::/8")); err == nil {
		t.Error("New(allow fd00::/8) succeeded; want an error: sandboxes have no IPv6")
	}
	if e.table != "sandboxd_10_133_0_0_16" {
		t.Errorf("table = %s; want sandboxd_10_133_0_0_16", e.table)
	}
}

// TestVethOneQueue: both ends of a sandbox's veth are made with one queue
// each way. Made without, they get one per possible CPU and the kernel cuts
// them to one with an RCU grace period under rtnl_mutex (CreateVethIn). On
// a one-CPU host the default is one queue too, and this cannot tell.
func TestVethOneQueue(t *testing.T) {
	e := vethEgress(t, "10.139.251.0/24")
	key := "egress-queues-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() { DeleteLinks(key) })
	pid := netnsProcess(t)
	info, err := e.CreateVethIn(key, netip.MustParseAddr("10.139.251.9"), pid)
	if err != nil {
		t.Fatalf("CreateVethIn = %v", err)
	}
	host, err := netlink.LinkByName(info.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	peer, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []netlink.Link{host, peer} {
		if a := l.Attrs(); a.NumTxQueues != 1 || a.NumRxQueues != 1 {
			t.Errorf("%s: %d tx and %d rx queues; want 1 and 1", a.Name, a.NumTxQueues, a.NumRxQueues)
		}
	}
}
