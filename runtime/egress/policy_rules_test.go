package egress

import (
	"context"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime/egress/egresstest"
	"github.com/sandboxd/sandboxd/runtime/egress/policy"
)

// TestPolicyRules: a sandbox's address rules, in the kernel, from its own
// namespace: deny-all, an allowed address or port inside it, a deny list
// on top of the default allow, a live replacement both ways, and a clear;
// a Setup of a new process keeps the policy in force.
func TestPolicyRules(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for namespaces and nftables")
	}
	if err := HaveNft(); err != nil {
		t.Skip(err)
	}
	one, oneHost := egresstest.FakeInternet(t, "pa", 3)
	two, twoHost := egresstest.FakeInternet(t, "pb", 2) // TestRules uses slot 2 too, but never at the same time
	oneIP, twoIP := netip.MustParseAddrPort(one).Addr(), netip.MustParseAddrPort(two).Addr()
	onePort := netip.MustParseAddrPort(one).Port()

	pid := netnsProcess(t)
	subnet := netip.MustParsePrefix("10.139.249.0/24")
	e := testEgress(t, subnet, nil, nil)
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.139.249.2")
	info, err := e.CreateVethIn("egress-policy-"+strconv.Itoa(os.Getpid()), ip, pid)
	if err != nil {
		t.Fatalf("CreateVethIn = %v", err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", info.HostIf).Run() })

	reachable := func(addr string) bool {
		got, err := getIn(pid, addr)
		return err == nil && strings.HasPrefix(got, egresstest.Reply)
	}
	for _, tc := range []struct {
		name             string
		allow, deny      []string
		restart          bool // a new Egress (a restarted sandboxd) sets up the table again
		wantOne, wantTwo bool
	}{
		{name: "none", wantOne: true, wantTwo: true},
		{name: "deny all", deny: []string{policy.AllTraffic}},
		{name: "one allowed in deny all", allow: []string{oneIP.String()}, deny: []string{policy.AllTraffic}, wantOne: true},
		{name: "restart keeps it", allow: []string{oneIP.String()}, deny: []string{policy.AllTraffic}, restart: true, wantOne: true},
		{name: "one's port allowed", allow: []string{oneIP.String() + ":" + strconv.Itoa(int(onePort))}, deny: []string{policy.AllTraffic}, wantOne: true},
		{name: "another port allowed", allow: []string{oneIP.String() + ":1-79"}, deny: []string{policy.AllTraffic}},
		{name: "two denied", deny: []string{twoIP.String() + "/32"}, wantOne: true},
		{name: "allow wins over deny", allow: []string{twoIP.String()}, deny: []string{twoIP.String()}, wantOne: true, wantTwo: true},
		{name: "cleared", wantOne: true, wantTwo: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse(tc.allow, tc.deny)
			if err != nil {
				t.Fatal(err)
			}
			if tc.restart {
				fresh, err := New(subnet)
				if err != nil {
					t.Fatal(err)
				}
				fresh.table, fresh.prefix, fresh.noNetPrefix, fresh.resolvers = e.table, e.prefix, e.noNetPrefix, e.resolvers
				if err := fresh.Setup(); err != nil {
					t.Fatal(err)
				}
				if !fresh.installed[ip] {
					t.Errorf("a new process's Setup did not find the policy of %s in the table", ip)
				}
			} else if err := e.SetPolicy(context.Background(), "sbx", ip, p); err != nil {
				t.Fatal(err)
			}
			if got := reachable(one); got != tc.wantOne {
				t.Errorf("%s reachable = %v, want %v (its host end %s)", one, got, tc.wantOne, oneHost)
			}
			if got := reachable(two); got != tc.wantTwo {
				t.Errorf("%s reachable = %v, want %v (its host end %s)", two, got, tc.wantTwo, twoHost)
			}
			if !tc.wantTwo && !tc.restart {
				// The refusal is counted (sandboxd_egress_address_denied_packets_total).
				if d, _, err := e.addressCounts(); err != nil || d[ip] == 0 {
					t.Errorf("address denials = %v, %v; want some for %s", d, err, ip)
				}
			}
		})
	}
	if out, _ := exec.Command("nft", "list", "table", "inet", e.table).Output(); strings.Contains(string(out), "p_"+objSuffix(ip)) {
		t.Errorf("cleared policy left its chain:\n%s", out)
	}
}

// TestPolicyDomains: a policy with domain rules sends the sandbox's DNS
// and its TCP to ports 80 and 443 through the name filter: an allowed
// name answers, whatever address the sandbox dialled; another does not.
func TestPolicyDomains(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for namespaces and nftables")
	}
	if err := HaveNft(); err != nil {
		t.Skip(err)
	}
	one := egresstest.NewInet(t, "pd", 3)
	one.ServeDNS(t, map[string]netip.Addr{"ok.sbx.test": one.IP, "no.sbx.test": one.IP})
	one.ServeHTTPOn(t, 80)

	pid := netnsProcess(t)
	subnet := netip.MustParsePrefix("10.139.248.0/24")
	e := testEgress(t, subnet, nil, []netip.Addr{one.IP})
	t.Cleanup(func() { _ = e.Close() })
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.139.248.2")
	info, err := e.CreateVethIn("egress-domains-"+strconv.Itoa(os.Getpid()), ip, pid)
	if err != nil {
		t.Fatalf("CreateVethIn = %v", err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", info.HostIf).Run() })
	p, err := policy.Parse([]string{"ok.sbx.test"}, []string{policy.AllTraffic})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetPolicy(context.Background(), "sbx", ip, p); err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(one.IP, 80).String()
	get := func(host string) (string, error) {
		c, err := dialIn(pid, addr)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.0\r\nHost: "+host+"\r\n\r\n"); err != nil {
			return "", err
		}
		raw, err := io.ReadAll(c)
		return string(raw), err
	}
	if got, err := get("ok.sbx.test"); err != nil || !strings.Contains(got, egresstest.Reply) {
		out, _ := exec.Command("nft", "list", "table", "inet", e.table).CombinedOutput()
		t.Errorf("GET ok.sbx.test = %q, %v; want an answer\n%s", got, err, out)
	}
	if got, err := get("no.sbx.test"); err == nil && strings.Contains(got, egresstest.Reply) {
		t.Errorf("GET no.sbx.test = %q; want it refused", got)
	}
}
