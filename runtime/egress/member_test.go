package egress

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/netnsrun"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// memberNet is a cluster member in network namespaces of the test's own:
// the member host, sandboxes with routed NICs as Incus makes them (a /32
// on eth0, the default route via 169.254.0.1 on-link; on the host end
// 169.254.0.1/32 and the route of the /32), and an "outside" host on a
// public-looking address (192.52.193.0/30, globally reachable per IANA:
// see egresstest) that the member routes to. Nothing touches the test
// host's own namespace: the member's table has the real names.
type memberNet struct {
	member, outside string // namespace names
	outsideIP       netip.Addr
	memberOut       netip.Addr // the member's address towards outside
}

// sandboxNS is a sandbox of memberNet.
type sandboxNS struct {
	ns, hostIf string
	ip         netip.Addr
	ip6        netip.Addr // on eth0, with the host end's memberIP6 (no DAD)
}

var (
	memberGW  = netip.MustParseAddr("169.254.0.1")
	memberIP6 = netip.MustParseAddr("fd35::1")
)

func newMemberNet(t *testing.T) *memberNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for namespaces and nftables")
	}
	if err := HaveNft(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	m := &memberNet{
		member: testNetns(t, "sbm"), outside: testNetns(t, "sbo"),
		outsideIP: netip.MustParseAddr("192.52.193.2"), memberOut: netip.MustParseAddr("192.52.193.1"),
	}
	ip(t, "-n", m.member, "link", "set", "lo", "up")
	// A host that routes IPv6 too: only the rules keep it from sandboxes.
	if out, err := exec.Command("ip", "netns", "exec", m.member, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1").CombinedOutput(); err != nil {
		t.Fatalf("IPv6 forwarding on the member: %v: %s", err, out)
	}
	ip(t, "-n", m.member, "link", "add", "out0", "type", "veth", "peer", "name", "eth0", "netns", m.outside)
	ip(t, "-n", m.member, "addr", "add", m.memberOut.String()+"/30", "dev", "out0")
	ip(t, "-n", m.member, "link", "set", "out0", "up")
	ip(t, "-n", m.outside, "addr", "add", m.outsideIP.String()+"/30", "dev", "eth0")
	ip(t, "-n", m.outside, "link", "set", "eth0", "up")
	ip(t, "-n", m.outside, "link", "set", "lo", "up")
	// A router that would send anything to the sandbox subnet: only the
	// member's rules keep new connections out.
	ip(t, "-n", m.outside, "route", "add", "default", "via", m.memberOut.String())
	// And the member's default route leads there, as a member's leads to
	// its network.
	ip(t, "-n", m.member, "route", "add", "default", "via", m.outsideIP.String())
	return m
}

// sandbox adds a sandbox at addr whose host end is prefix+12 hex digits.
func (m *memberNet) sandbox(t *testing.T, prefix, addr, addr6 string) sandboxNS {
	t.Helper()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	s := sandboxNS{ns: testNetns(t, "sbs"), hostIf: prefix + hex.EncodeToString(rnd[:]), ip: netip.MustParseAddr(addr), ip6: netip.MustParseAddr(addr6)}
	ip(t, "-n", m.member, "link", "add", s.hostIf, "type", "veth", "peer", "name", "eth0", "netns", s.ns)
	ip(t, "-n", m.member, "addr", "add", memberGW.String()+"/32", "dev", s.hostIf)
	ip(t, "-n", m.member, "-6", "addr", "add", memberIP6.String()+"/128", "dev", s.hostIf, "nodad")
	ip(t, "-n", m.member, "link", "set", s.hostIf, "up")
	ip(t, "-n", m.member, "route", "add", s.ip.String()+"/32", "dev", s.hostIf)
	ip(t, "-n", m.member, "-6", "route", "add", s.ip6.String()+"/128", "dev", s.hostIf)
	ip(t, "-n", s.ns, "link", "set", "lo", "up")
	ip(t, "-n", s.ns, "addr", "add", s.ip.String()+"/32", "dev", "eth0")
	ip(t, "-n", s.ns, "-6", "addr", "add", s.ip6.String()+"/128", "dev", "eth0", "nodad")
	ip(t, "-n", s.ns, "link", "set", "eth0", "up")
	ip(t, "-n", s.ns, "route", "add", "default", "via", memberGW.String(), "dev", "eth0", "onlink")
	ip(t, "-n", s.ns, "-6", "route", "add", memberIP6.String()+"/128", "dev", "eth0")
	ip(t, "-n", s.ns, "-6", "route", "add", "default", "via", memberIP6.String(), "dev", "eth0")
	return s
}

// testNetns makes a network namespace named prefix-<random>, without
// IPv6 DAD, removed when the test ends (with the links in it).
func testNetns(t *testing.T, prefix string) string {
	t.Helper()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := prefix + "-" + hex.EncodeToString(rnd[:])
	ip(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	// Link-local addresses usable at once: IPv6 is not forwarded until
	// DAD is done, and an IPv6 case could pass for that alone.
	if out, err := exec.Command("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0").CombinedOutput(); err != nil {
		t.Fatalf("accept_dad in %s: %v: %s", name, err, out)
	}
	return name
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// serveHello listens on port of every address of namespace ns and
// greets each connection with "hello <peer>\n", then echoes lines.
func serveHello(t *testing.T, ns string, port int) {
	t.Helper()
	var ln net.Listener
	if err := netnsrun.RunNamed(ns, func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				fmt.Fprintf(c, "hello %s\n", c.RemoteAddr())
				_, _ = io.Copy(c, c)
			}()
		}
	}()
}

// dialNS connects from namespace ns to addr, with socket mark mark unless
// 0, and reads the greeting.
func dialNS(ns, addr string, mark int) (net.Conn, string, error) {
	d := net.Dialer{Timeout: time.Second}
	if mark != 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, mark)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	var c net.Conn
	if err := netnsrun.RunNamed(ns, func() (err error) { c, err = d.Dial("tcp", addr); return err }); err != nil {
		return nil, "", err
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return nil, "", err
	}
	return c, strings.TrimSpace(line), nil
}

// TestMember: on a member with SetupMember's table, the relay's marked
// connections into sandboxes get their replies (with and without
// internet), nothing else reaches a sandbox or the host from a sandbox,
// sandboxes without internet reach nothing at all, those with internet
// the outside (masqueraded), and IPv6 passes nowhere.
func TestMember(t *testing.T) {
	m := newMemberNet(t)
	inet := m.sandbox(t, HostPrefix, "10.135.7.2", "fd35::2")
	inet2 := m.sandbox(t, HostPrefix, "10.135.7.3", "fd35::3")
	nonet := m.sandbox(t, NoNetPrefix, "10.135.7.4", "fd35::4")
	nonet2 := m.sandbox(t, NoNetPrefix, "10.135.7.5", "fd35::5")
	const sbxPort, hostPort, outPort = 49983, 8444, 80
	for _, s := range []sandboxNS{inet, inet2, nonet, nonet2} {
		serveHello(t, s.ns, sbxPort)
	}
	serveHello(t, m.member, hostPort)
	serveHello(t, m.outside, outPort)

	hadTable := exec.Command("nft", "list", "table", "inet", tableName(netip.MustParsePrefix("10.135.0.0/16"))).Run() == nil
	setup := func() *Egress {
		t.Helper()
		var e *Egress
		if err := netnsrun.RunNamed(m.member, func() (err error) {
			e, err = SetupMember(netip.MustParsePrefix("10.135.0.0/16"), []netip.Addr{m.outsideIP})
			return err
		}); err != nil {
			t.Fatalf("SetupMember = %v", err)
		}
		return e
	}
	e := setup()
	if !hadTable && exec.Command("nft", "list", "table", "inet", e.table).Run() == nil {
		_ = exec.Command("nft", "delete", "table", "inet", e.table).Run()
		t.Fatal("SetupMember in the member's namespace wrote the test host's table")
	}
	if out, err := exec.Command("ip", "netns", "exec", m.member, "sysctl", "-n", "net.ipv4.ip_forward").Output(); err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Errorf("member's ip_forward = %q, %v; want 1", out, err)
	}
	if got := string(e.ResolvConf()); got != "nameserver 192.52.193.2\n" {
		t.Errorf("ResolvConf = %q", got)
	}

	at := func(a netip.Addr, port int) string { return netip.AddrPortFrom(a, uint16(port)).String() }
	for _, tc := range []struct {
		name     string
		from, to string
		mark     int
		seen     string // the greeting's peer address, or "" when unreachable
	}{
		{"relay to a sandbox with internet", m.member, at(inet.ip, sbxPort), RelayMark, memberGW.String()},
		{"relay to a sandbox without internet", m.member, at(nonet.ip, sbxPort), RelayMark, memberGW.String()},
		{"unmarked host process to a sandbox with internet", m.member, at(inet.ip, sbxPort), 0, ""},
		{"unmarked host process to a sandbox without internet", m.member, at(nonet.ip, sbxPort), 0, ""},
		{"relay mark, IPv6", m.member, at(nonet.ip6, sbxPort), RelayMark, ""},
		{"with internet to the outside", inet.ns, at(m.outsideIP, outPort), 0, m.memberOut.String()},
		{"with internet to the host's gateway address", inet.ns, at(memberGW, hostPort), 0, ""},
		{"with internet to the host's outside address", inet.ns, at(m.memberOut, hostPort), 0, ""},
		{"with internet to another with internet", inet.ns, at(inet2.ip, sbxPort), 0, ""},
		{"with internet to one without", inet.ns, at(nonet.ip, sbxPort), 0, ""},
		{"with internet, IPv6 to the host", inet.ns, at(memberIP6, hostPort), 0, ""},
		{"without internet to the outside", nonet.ns, at(m.outsideIP, outPort), 0, ""},
		{"without internet to the host's gateway address", nonet.ns, at(memberGW, hostPort), 0, ""},
		{"without internet to the host's outside address", nonet.ns, at(m.memberOut, hostPort), 0, ""},
		{"without internet to another without", nonet.ns, at(nonet2.ip, sbxPort), 0, ""},
		{"without internet to one with", nonet.ns, at(inet.ip, sbxPort), 0, ""},
		{"without internet, IPv6 to the host", nonet.ns, at(memberIP6, hostPort), 0, ""},
		{"without internet, IPv6 to another", nonet.ns, at(nonet2.ip6, sbxPort), 0, ""},
		{"outside to a sandbox with internet", m.outside, at(inet.ip, sbxPort), 0, ""},
		{"outside to a sandbox without internet", m.outside, at(nonet.ip, sbxPort), 0, ""},
		{"outside to the host", m.outside, at(m.memberOut, hostPort), 0, "192.52.193.2"}, // not the rules' business
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, got, err := dialNS(tc.from, tc.to, tc.mark)
			if tc.seen == "" {
				if err == nil {
					c.Close()
					t.Errorf("%s reached %s: %q; want it unreachable", tc.from, tc.to, got)
				}
				return
			}
			if err != nil || !strings.HasPrefix(got, "hello "+tc.seen+":") {
				t.Errorf("%s to %s: %q, %v; want a greeting seeing %s", tc.from, tc.to, got, err, tc.seen)
				return
			}
			c.Close()
		})
	}

	// The relay's connection to an address of the subnet that is no
	// sandbox here is not sent down the default route: it fails at once.
	t.Run("relay to no sandbox", func(t *testing.T) {
		start := time.Now()
		_, _, err := dialNS(m.member, at(netip.MustParseAddr("10.135.7.99"), sbxPort), RelayMark)
		if !errors.Is(err, syscall.EHOSTUNREACH) || time.Since(start) > 500*time.Millisecond {
			t.Errorf("relay to 10.135.7.99 = %v after %v; want host unreachable at once", err, time.Since(start))
		}
	})

	// A relay restarted with a pipe open: the connection goes on.
	t.Run("restart", func(t *testing.T) {
		c, _, err := dialNS(m.member, at(nonet.ip, sbxPort), RelayMark)
		if err != nil {
			t.Fatalf("relay to a sandbox: %v", err)
		}
		defer c.Close()
		setup()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, "still there\n"); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "still there\n" {
			t.Errorf("after a second SetupMember, the open connection read %q, %v", line, err)
		}
		if c2, _, err := dialNS(m.member, at(inet.ip, sbxPort), RelayMark); err != nil {
			t.Errorf("relay to a sandbox after a second SetupMember: %v", err)
		} else {
			c2.Close()
		}
	})
}

// TestMemberUpgrade: a table of before the relay (no output chain) with a
// sandbox's policy in it is rewritten in place: the policy stays, and the
// new chain is there.
func TestMemberUpgrade(t *testing.T) {
	m := newMemberNet(t)
	subnet := netip.MustParsePrefix("10.135.0.0/16")
	e, err := New(subnet)
	if err != nil {
		t.Fatal(err)
	}
	old := regexp.MustCompile(`(?s)\tchain output \{.*?\n\t\}\n`).ReplaceAllString(e.ruleset(), "")
	old = regexp.MustCompile(`(?m)^.*(sbn|0x5bd0f118).*\n`).ReplaceAllString(old, "")
	if strings.Contains(old, "output") || !strings.Contains(old, "chain input") {
		t.Fatalf("could not make the old layout of:\n%s", e.ruleset())
	}
	policy := fmt.Sprintf("add chain inet %s p_x\nadd element inet %s pol4 { 10.135.7.9 : jump p_x }\n", e.table, e.table)
	nft := func(script string) error {
		return netnsrun.RunNamed(m.member, func() error { return runNftExec(script) })
	}
	if err := nft(old + policy); err != nil {
		t.Fatal(err)
	}
	if err := netnsrun.RunNamed(m.member, func() (err error) { _, err = SetupMember(subnet, nil); return err }); err != nil {
		t.Fatalf("SetupMember = %v", err)
	}
	out, err := exec.Command("ip", "netns", "exec", m.member, "nft", "list", "table", "inet", e.table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	for _, want := range []string{"10.135.7.9 : jump p_x", "chain output", "meta mark 0x5bd0f118", `iifname "sbn*" drop`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("upgraded table lacks %q:\n%s", want, out)
		}
	}
}
