package egress

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime/egress/egresstest"
	"github.com/vishvananda/netns"
)

// TestRules: from a sandbox's namespace, the fake internet answers (through
// the masquerade), the fake LAN (RFC 1918) and the host's own address on
// the LAN's veth do not, unless the operator allows the LAN; a resolver in
// the LAN, or on the host, answers on port 53 only. The rules go in a
// table of the test's own, for host ends of the test's own prefix, so that
// a sandboxd or another package's tests on this host keep theirs.
func TestRules(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for namespaces and nftables")
	}
	if err := HaveNft(); err != nil {
		t.Skip(err)
	}
	inet, inetHost := egresstest.FakeInternet(t, "ei", 2)
	lan := egresstest.FakeLAN(t, "el")
	lanIP := netip.MustParseAddrPort(lan.Server).Addr()
	lanHost := netip.MustParseAddr(lan.Host)
	hostSrv := listenHost(t, ":0")
	_, hostPort, _ := net.SplitHostPort(hostSrv)
	onHost := net.JoinHostPort(lan.Host, hostPort) // an address of the host on another interface
	// A resolver on the host itself, on the host's address towards the LAN.
	hostDNS := listenHost(t, net.JoinHostPort(lan.Host, "53"))

	pid := netnsProcess(t)
	subnet := netip.MustParsePrefix("10.139.251.0/24")
	first := testEgress(t, subnet, nil, nil)
	info, err := first.CreateVethIn("egress-rules-"+strconv.Itoa(os.Getpid()), netip.MustParseAddr("10.139.251.2"), pid)
	if err != nil {
		t.Fatalf("CreateVethIn = %v", err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", info.HostIf).Run() })

	for _, tc := range []struct {
		name      string
		allow     []netip.Prefix
		resolvers []netip.Addr
		// neighbour: another subnet's table, allowing 10.0.0.0/8, is
		// there too (another sandboxd); its exceptions are not ours.
		neighbour bool
		reach     map[string]string // address → the source the server must see
		noReach   []string
	}{
		{
			name:    "default",
			reach:   map[string]string{inet: inetHost},
			noReach: []string{lan.Server, lan.DNS, onHost, hostDNS},
		},
		{
			name:      "another subnet allows the LAN",
			neighbour: true,
			reach:     map[string]string{inet: inetHost},
			noReach:   []string{lan.Server, lan.DNS, onHost, hostDNS},
		},
		{
			name:    "LAN allowed",
			allow:   []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			reach:   map[string]string{inet: inetHost, lan.Server: lan.Host, lan.DNS: lan.Host},
			noReach: []string{onHost, hostDNS}, // the host stays out of reach
		},
		{
			name:      "resolver on the LAN",
			resolvers: []netip.Addr{lanIP},
			reach:     map[string]string{inet: inetHost, lan.DNS: lan.Host},
			noReach:   []string{lan.Server, onHost, hostDNS},
		},
		{
			name:      "resolver on the host",
			resolvers: []netip.Addr{lanHost},
			reach:     map[string]string{inet: inetHost, hostDNS: "10.139.251.2"}, // not masqueraded: not forwarded
			noReach:   []string{lan.Server, lan.DNS, onHost},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.neighbour {
				other := testEgress(t, netip.MustParsePrefix("10.139.252.0/24"), []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, nil)
				if err := other.Setup(); err != nil {
					t.Fatalf("Setup(neighbour) = %v", err)
				}
			}
			if err := testEgress(t, subnet, tc.allow, tc.resolvers).Setup(); err != nil {
				t.Fatalf("Setup = %v", err)
			}
			for addr, src := range tc.reach {
				if got, err := getIn(pid, addr); err != nil || !strings.HasPrefix(got, egresstest.Reply+src+":") {
					t.Errorf("GET %s from the sandbox = %q, %v; want an answer seeing %s", addr, got, err, src)
				}
			}
			for _, addr := range tc.noReach {
				if got, err := getIn(pid, addr); err == nil {
					t.Errorf("GET %s from the sandbox = %q; want it unreachable", addr, got)
				}
			}
		})
	}
}

// testEgress is an Egress for the test's own table and link prefix, not
// set up yet: each Setup replaces the table with its rules.
func testEgress(t testing.TB, subnet netip.Prefix, allow []netip.Prefix, resolvers []netip.Addr) *Egress {
	t.Helper()
	e, err := New(subnet, allow...)
	if err != nil {
		t.Fatal(err)
	}
	// Still a table per subnet, under a name of the test's own (so not
	// DeleteTable).
	e.table, e.prefix, e.noNetPrefix, e.resolvers = "test_"+e.table, "sbt", "sbu", resolvers
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "inet", e.table).Run() })
	t.Cleanup(func() { _ = e.Close() }) // first: its NFLOG group is free for the next
	return e
}

// listenHost serves HTTP like the fake networks' servers on addr in the
// host's namespace and returns its address.
func listenHost(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return egresstest.ServeHTTP(t, ln)
}

// getIn sends an HTTP GET to addr from the network namespace of process
// pid and returns the answer's body.
func getIn(pid int, addr string) (string, error) {
	c, err := dialIn(pid, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n"); err != nil {
		return "", err
	}
	raw, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	_, body, _ := strings.Cut(string(raw), "\r\n\r\n")
	return body, nil
}

// dialIn connects to addr from the network namespace of process pid: the
// socket stays there after the thread switches back.
func dialIn(pid int, addr string) (net.Conn, error) {
	return dialInWith(pid, addr, &net.Dialer{Timeout: 1500 * time.Millisecond})
}

// dialInWith is dialIn with d.
func dialInWith(pid int, addr string, d *net.Dialer) (net.Conn, error) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	ns, err := netns.GetFromPath(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		return nil, err
	}
	c, derr := d.Dial("tcp", addr)
	if err := netns.Set(orig); err != nil {
		panic(err) // this thread must not run anything else
	}
	return c, derr
}
