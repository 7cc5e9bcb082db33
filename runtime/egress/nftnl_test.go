package egress

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/runtime/egress/policy"
)

// fakeFilter stands in for the name filter: only its ports matter here.
type fakeFilter struct{}

func (fakeFilter) ProxyPort() uint16  { return 8080 }
func (fakeFilter) DNSPort() uint16    { return 5353 }
func (fakeFilter) Recheck(netip.Addr) {}
func (fakeFilter) Forget(string)      {}
func (fakeFilter) Close() error       { return nil }

// scriptPolicy is the nft script that wrote a policy before the batches
// of nftnl.go (the reference they must match): it puts p in force for ip.
// withNat says whether to write the name-filter half (n_ and nat4) at all.
func (e *Egress) scriptPolicy(ip netip.Addr, p *policy.Policy, f NameFilter, withNat bool) string {
	var b strings.Builder
	t, x := "inet "+e.table, objSuffix(ip)
	pol, cnt, nat, allow, deny := "p_"+x, "c_"+x, "n_"+x, "a_"+x, "d_"+x
	for _, set := range []string{allow, deny} {
		fmt.Fprintf(&b, "add set %s %s { type ipv4_addr; flags interval; auto-merge; }\nflush set %s %s\n", t, set, t, set)
	}
	var allowAll, denyAll []string
	var allowPorts, denyPorts []policy.Rule
	for _, r := range p.Allow {
		switch {
		case !r.Prefix.IsValid():
		case r.AllPorts():
			allowAll = append(allowAll, r.Prefix.String())
		default:
			allowPorts = append(allowPorts, r)
		}
	}
	for _, r := range p.Deny {
		switch {
		case !r.Prefix.IsValid() || r.Prefix.Addr().Is6(): // all IPv6 is dropped
		case r.AllPorts():
			denyAll = append(denyAll, r.Prefix.String())
		default:
			denyPorts = append(denyPorts, r)
		}
	}
	if len(allowAll) > 0 {
		fmt.Fprintf(&b, "add element %s %s { %s }\n", t, allow, strings.Join(allowAll, ", "))
	}
	if len(denyAll) > 0 {
		fmt.Fprintf(&b, "add element %s %s { %s }\n", t, deny, strings.Join(denyAll, ", "))
	}
	allowRules := func(chain, verdict string) {
		fmt.Fprintf(&b, "add rule %s %s ip daddr @%s %s\n", t, chain, allow, verdict)
		for _, r := range allowPorts {
			fmt.Fprintf(&b, "add rule %s %s ip daddr %s meta l4proto { tcp, udp } th dport %s %s\n", t, chain, r.Prefix, ports(r), verdict)
		}
	}
	fmt.Fprintf(&b, "add chain %s %s\nflush chain %s %s\nadd rule %s %s ct state new counter\n", t, cnt, t, cnt, t, cnt)
	fmt.Fprintf(&b, "add chain %s %s\nflush chain %s %s\n", t, pol, t, pol)
	allowRules(pol, "goto "+cnt)
	fmt.Fprintf(&b, "add rule %s %s ip daddr @%s counter log group %d snaplen %d reject with icmpx admin-prohibited\n", t, pol, deny, e.logGroup(), logSnaplen)
	for _, r := range denyPorts {
		fmt.Fprintf(&b, "add rule %s %s ip daddr %s meta l4proto { tcp, udp } th dport %s counter log group %d snaplen %d reject with icmpx admin-prohibited\n", t, pol, r.Prefix, ports(r), e.logGroup(), logSnaplen)
	}
	fmt.Fprintf(&b, "add element %s pol4 { %s : jump %s }\n", t, ip, pol)
	if !withNat {
		return b.String()
	}
	// nat4 and n_: made whether or not p has domains, so that a policy
	// that had some loses them in the same transaction.
	fmt.Fprintf(&b, "add chain %s %s\nflush chain %s %s\n", t, nat, t, nat)
	fmt.Fprintf(&b, "add element %s nat4 { %s : jump %s }\n", t, ip, nat)
	if f != nil {
		allowRules(nat, "return")
		fmt.Fprintf(&b, "add rule %s %s meta l4proto { tcp, udp } th dport 53 ct mark set 0x%08x counter redirect to :%d\n", t, nat, FilterMark, f.DNSPort())
		fmt.Fprintf(&b, "add rule %s %s tcp dport { 80, 443 } ct mark set 0x%08x counter redirect to :%d\n", t, nat, FilterMark, f.ProxyPort())
	} else {
		fmt.Fprintf(&b, "delete element %s nat4 { %s }\ndelete chain %s %s\n", t, ip, t, nat)
	}
	return b.String()
}

func ports(r policy.Rule) string {
	if r.PortFirst == r.PortEnd {
		return fmt.Sprint(r.PortFirst)
	}
	return fmt.Sprintf("%d-%d", r.PortFirst, r.PortEnd)
}

// TestPolicyObjects: the objects a policy's batch makes are those nft made
// of the script of earlier versions, down to the rules' bytecode: the
// policies go, one after another, to one address by batch and to another
// by script, so that each case also replaces the previous one's objects.
// A clear then leaves nothing, and clears an address without objects.
func TestPolicyObjects(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for nftables")
	}
	if err := HaveNft(); err != nil {
		t.Skip(err)
	}
	e := testEgress(t, netip.MustParsePrefix("10.139.241.0/24"), nil, nil)
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	nl, ref := netip.MustParseAddr("10.139.241.2"), netip.MustParseAddr("10.139.241.3")
	nlX, refX := objSuffix(nl), objSuffix(ref)
	anon := regexp.MustCompile(`__set\d+`)
	list := func(debug bool, what ...string) string {
		args := append([]string{"list"}, what...)
		if debug {
			args = append([]string{"--debug=netlink"}, args...)
		}
		out, err := exec.Command("nft", args...).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("%v: %s", err, out)
		}
		return anon.ReplaceAllString(string(out), "__set")
	}
	compare := func(t *testing.T, withNat bool) {
		t.Helper()
		objs := [][]string{{"set", "a_"}, {"set", "d_"}, {"chain", "c_"}, {"chain", "p_"}}
		if withNat {
			objs = append(objs, []string{"chain", "n_"})
		}
		for _, o := range objs {
			// The bytecode of chains; sets as nft reads them (nft adds
			// element flags in user data that only its listing uses).
			debug := o[0] == "chain"
			got := list(debug, o[0], "inet", e.table, o[1]+nlX)
			want := strings.ReplaceAll(list(debug, o[0], "inet", e.table, o[1]+refX), refX, nlX)
			if debug {
				got, want = bytecode(got, e.table), bytecode(want, e.table)
			}
			if got != want {
				t.Errorf("%s %s%s by netlink:\n%s\nwant (by nft):\n%s", o[0], o[1], nlX, got, want)
			}
		}
		for _, m := range []string{"pol4", "nat4"} {
			got := list(false, "map", "inet", e.table, m)
			if strings.Contains(got, nl.String()+" : ") != strings.Contains(got, ref.String()+" : ") ||
				strings.Contains(got, "jump p_"+nlX) != strings.Contains(got, "jump p_"+refX) ||
				strings.Contains(got, "jump n_"+nlX) != strings.Contains(got, "jump n_"+refX) {
				t.Errorf("map %s: the elements of %s and %s differ:\n%s", m, nl, ref, got)
			}
		}
	}
	for _, tc := range []struct {
		name                 string
		allow, deny          []string
		withNat              bool
		wantSets, wantChains []string // in the listing of the netlink objects
	}{{
		name:  "ports and ranges",
		allow: []string{"1.1.1.1:443", "8.8.8.0/24:53", "9.9.9.9:1000-2000", "104.16.0.0/13:80-443", "0.0.0.0/0:22"},
		deny:  []string{policy.AllTraffic, "8.8.8.8:25", "151.101.0.0/16:6000-7000"},
		wantChains: []string{"ip daddr 104.16.0.0/13 meta l4proto { tcp, udp } th dport 80-443 goto c_" + nlX, "ct state new counter packets 0 bytes 0",
			"ip daddr 8.8.8.8 meta l4proto { tcp, udp } th dport 25 counter packets 0 bytes 0 log group " + fmt.Sprint(e.logGroup()) + " snaplen 64 reject with icmpx admin-prohibited"},
		wantSets: []string{"elements = { 0.0.0.0/0 }"},
	}, {
		name:     "overlapping prefixes",
		allow:    []string{"10.1.0.0/16", "10.0.0.0/8", "1.2.3.128/25", "1.2.3.0/25", "5.5.5.5", "5.5.5.6", "5.5.5.4/31"},
		deny:     []string{"192.168.1.0/24", "192.168.0.0/16", "255.255.255.255/32", "240.0.0.0/4", "2001:db8::/32", "7.7.7.7:1-100"},
		withNat:  true,
		wantSets: []string{"1.2.3.0/24", "10.0.0.0/8", "5.5.5.4-5.5.5.6", "192.168.0.0/16", "240.0.0.0/4"},
	}, {
		name:       "domains",
		allow:      []string{"ok.example.com", "*.example.org", "1.1.1.1", "8.8.8.8:853"},
		deny:       []string{policy.AllTraffic},
		withNat:    true,
		wantChains: []string{"meta l4proto { tcp, udp } th dport 53 ct mark set 0x5bd0f117 counter packets 0 bytes 0 redirect to :5353", "tcp dport { 80, 443 } ct mark set 0x5bd0f117 counter packets 0 bytes 0 redirect to :8080"},
	}, {
		name:    "domains gone",
		allow:   []string{"1.1.1.1"},
		deny:    []string{policy.AllTraffic},
		withNat: true,
	}, {
		name: "deny list",
		deny: []string{"9.9.9.9", "9.9.9.0/24", "1.0.0.0/8:443"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse(tc.allow, tc.deny)
			if err != nil {
				t.Fatal(err)
			}
			var f NameFilter
			if p.Domains() {
				f = fakeFilter{}
			}
			e.mu.Lock()
			err = e.commit(func(b *nlBatch) error { return b.policy(nl, p, f, tc.withNat) })
			e.mu.Unlock()
			if err != nil {
				t.Fatalf("policy batch: %v", err)
			}
			if err := runNftExec(e.scriptPolicy(ref, p, f, tc.withNat)); err != nil {
				t.Fatalf("policy script: %v", err)
			}
			compare(t, tc.withNat || p.Domains())
			table := list(false, "table", "inet", e.table)
			for _, w := range tc.wantSets {
				if got := list(false, "set", "inet", e.table, "a_"+nlX) + list(false, "set", "inet", e.table, "d_"+nlX); !strings.Contains(got, w) {
					t.Errorf("sets lack %q:\n%s", w, got)
				}
			}
			for _, w := range tc.wantChains {
				if !strings.Contains(table, w) {
					t.Errorf("chains lack %q:\n%s", w, table)
				}
			}
			if hasNat := strings.Contains(table, "chain n_"+nlX); hasNat != p.Domains() {
				t.Errorf("chain n_%s present = %v, want %v:\n%s", nlX, hasNat, p.Domains(), table)
			}
		})
	}

	e.mu.Lock()
	e.installed[nl] = true
	none := netip.MustParseAddr("10.139.241.4")
	e.installed[none] = true
	e.mu.Unlock()
	for _, ip := range []netip.Addr{nl, none} {
		if err := e.ClearPolicy(ip); err != nil {
			t.Errorf("ClearPolicy(%s) = %v", ip, err)
		}
	}
	if table := list(false, "table", "inet", e.table); strings.Contains(table, nlX) || strings.Contains(table, objSuffix(none)) || strings.Contains(table, nl.String()) {
		t.Errorf("cleared policies left objects:\n%s", table)
	}
}

// bytecode keeps, of nft's debug listing of a chain, its rules' bytecode
// and the listing (the debug output starts with the elements of every set
// of the table, which nft fetches first).
var handles = regexp.MustCompile(`( \d+)+$`)

func bytecode(out, table string) string {
	var b strings.Builder
	in := false
	for _, l := range strings.SplitAfter(out, "\n") {
		switch {
		case strings.HasPrefix(l, "inet "+table+" ") && !strings.Contains(l, "@"):
			in = true
			l = handles.ReplaceAllString(strings.TrimSuffix(l, "\n"), "") + "\n" // the rule's handle and position
		case strings.HasPrefix(l, "inet ") || strings.HasPrefix(l, "\telement"):
			in = false
		case strings.HasPrefix(l, "table "):
			in = true
		}
		if in {
			b.WriteString(l)
		}
	}
	return b.String()
}

func TestMergeSpans(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{[]string{"10.1.0.0/16", "10.0.0.0/8"}, "[{167772160 184549375}]"},
		{[]string{"1.2.3.128/25", "1.2.3.0/25", "9.9.9.9/32"}, "[{16909056 16909311} {151587081 151587081}]"},
		{[]string{"255.255.255.255/32", "240.0.0.0/4", "0.0.0.0/0"}, "[{0 4294967295}]"},
		{[]string{"255.255.255.255/32", "255.255.255.254/32"}, "[{4294967294 4294967295}]"},
	} {
		var ps []netip.Prefix
		for _, s := range tc.in {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		if got := fmt.Sprint(mergeSpans(ps)); got != tc.want {
			t.Errorf("mergeSpans(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
