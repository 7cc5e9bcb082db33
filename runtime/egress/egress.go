// Package egress is the host side of internet access for sandboxes, shared
// by the backends (runtime/local, incus): a sandbox created with
// AllowInternet gets a veth pair. Its end is eth0 inside, with one address
// from the egress subnet (/32) and a default route to the gateway address,
// which every host end carries (/32, like Calico). The host routes the
// sandbox's address to its veth, forwards its traffic and masquerades it.
// One nftables table per egress subnet, created once, holds all rules;
// they match the interface prefix and the subnet, so there is nothing to
// add or remove per sandbox:
//
//   - input from a sandbox veth is dropped: a sandbox never reaches the
//     host itself, on any of its addresses (sandboxd's port, or anything
//     bound to 0.0.0.0), but for DNS to a resolver of its resolv.conf
//     that is the host's, and for its replies to an Incus cluster
//     member's relay (RelayMark, member.go);
//   - a source address not routed back to the veth it came from is
//     dropped;
//   - forwarding between sandbox veths is dropped: sandboxes do not reach
//     each other;
//   - private and special-purpose destinations (DefaultDeny: the
//     operator's LAN, CGNAT, link-local cloud metadata, ...) are dropped,
//     except those the operator allows (New's allow) and the sandboxes'
//     resolvers on port 53 (ResolvConf);
//   - IPv6 is dropped (sandboxes get no IPv6 address);
//   - new connections into a sandbox are dropped; replies pass;
//   - on a cluster member, the host ends of sandboxes without internet
//     access (NoNetPrefix) forward nothing either way and take no input
//     but the replies to the relay (member.go).
//
// The host end is named HostPrefix+12 hex digits of a hash of the
// sandbox's key; the sandbox end is eth0, made right in the sandbox's
// network namespace (CreateVethIn, local) or by Incus (a p2p NIC). Every
// backend must name its host ends so: the rules match nothing else.
// (PeerPrefix+the same digits named the sandbox end while it was made in
// the host's namespace and moved; DeleteLinks still removes such
// leftovers.) When the sandbox's network namespace goes, the pair
// goes with it, and the host end's address and route with the link.
package egress

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	HostPrefix = "sbx"
	PeerPrefix = "sbp"
	// Table starts the name of the nftables table (family inet) that
	// holds the rules of an egress subnet: sandboxd_10_133_0_0_16.
	Table = "sandboxd"
)

// DefaultDeny are the destinations a sandbox does not reach unless the
// operator allows them (New's allow): every block of IANA's IPv4
// Special-Purpose Address Registry (RFC 6890 and its updates) that is not
// globally reachable, the deprecated 6to4 relay anycast block (RFC 7526)
// and multicast (RFC 5771). That covers the operator's LAN (RFC 1918),
// carrier-grade NAT (RFC 6598), loopback, link-local (cloud metadata) and
// the documentation and benchmarking nets some hosts use as LANs. The
// registry's globally reachable blocks are left alone: 192.31.196.0/24 and
// 192.175.48.0/24 (AS112) and 192.52.193.0/24 (AMT) are the internet's;
// 192.0.0.9/32 and 192.0.0.10/32 (anycast PCP and TURN, never deployed)
// go with the rest of 192.0.0.0/24. The host's own addresses, whatever
// their range, are not forwarded at all: the input chain drops everything
// from a sandbox.
var DefaultDeny = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),          // "this network", RFC 791
	netip.MustParsePrefix("10.0.0.0/8"),         // private, RFC 1918
	netip.MustParsePrefix("100.64.0.0/10"),      // shared (CGNAT), RFC 6598
	netip.MustParsePrefix("127.0.0.0/8"),        // loopback, RFC 1122
	netip.MustParsePrefix("169.254.0.0/16"),     // link-local, cloud metadata, RFC 3927
	netip.MustParsePrefix("172.16.0.0/12"),      // private, RFC 1918
	netip.MustParsePrefix("192.0.0.0/24"),       // IETF protocol assignments, RFC 6890
	netip.MustParsePrefix("192.0.2.0/24"),       // TEST-NET-1, RFC 5737
	netip.MustParsePrefix("192.88.99.0/24"),     // 6to4 relay anycast, deprecated by RFC 7526
	netip.MustParsePrefix("192.168.0.0/16"),     // private, RFC 1918
	netip.MustParsePrefix("198.18.0.0/15"),      // benchmarking, RFC 2544
	netip.MustParsePrefix("198.51.100.0/24"),    // TEST-NET-2, RFC 5737
	netip.MustParsePrefix("203.0.113.0/24"),     // TEST-NET-3, RFC 5737
	netip.MustParsePrefix("224.0.0.0/4"),        // multicast, RFC 5771
	netip.MustParsePrefix("240.0.0.0/4"),        // reserved, RFC 1112
	netip.MustParsePrefix("255.255.255.255/32"), // limited broadcast, RFC 919
}

// The rules keep addresses in nftables sets, so that later rules (such as
// per-sandbox policies) add elements or sets rather than rewrite chains:
// deny4 is DefaultDeny, allow4 the operator's exceptions to it, dns4 the
// resolvers of the sandboxes' resolv.conf, reachable on port 53 even where
// deny4 covers them (a resolver on the host's LAN) or on the host itself.
// auto-merge takes overlapping blocks (240.0.0.0/4 and the broadcast
// address; an operator's 10.1.0.0/16 and 10.1.2.0/24).
//
// Each egress subnet has a table of its own, whose exceptions apply to its
// sandboxes only (ip saddr): a packet passes the host only if no table
// drops it, so sandboxd instances with different allow lists cannot open
// what another's table closes. (The one table of sandboxd's first layout,
// inet sandboxd, is removed: it dropped all input from sandboxes.) The
// reverse-path check (fib) keeps a sandbox from borrowing another subnet's
// exceptions with a forged source. Per-sandbox policies (sandboxes.go)
// live in the same table: the maps pol4 and nat4, the set fports of the
// name filter's ports, and a chain and two sets per sandbox. A connection
// redirected to a name filter carries FilterMark, and every table's input
// accepts it: the subnets of two tables may overlap (a test's /24 inside a
// default /16), and the wider one's input would drop the narrower's
// redirected traffic as its own sandboxes'.
//
// The same table serves an Incus cluster member (member.go): the rules
// marked RelayMark and those of NoNetPrefix's interfaces are the member's,
// and match nothing on a single host, where no socket carries RelayMark
// and no host end is named sbn. One template for both, so that a sandboxd
// serve and a relay setting up the same subnet on one host write the same
// table rather than take each other's rules away.
const rulesetTemplate = `table inet {{.Table}} {
	set deny4 {
		type ipv4_addr; flags interval; auto-merge;
		elements = { {{join .Deny}} }
	}
	set allow4 {
		type ipv4_addr; flags interval; auto-merge;{{if .Allow}}
		elements = { {{join .Allow}} }{{end}}
	}
	set dns4 {
		type ipv4_addr; flags interval; auto-merge;{{if .DNS}}
		elements = { {{join .DNS}} }{{end}}
	}
	map pol4 {
		type ipv4_addr : verdict;
	}
	map nat4 {
		type ipv4_addr : verdict;
	}
	chain input {
		{{hook "input"}}
		iifname "{{.Prefix}}*" fib saddr . iif oif missing drop
		iifname "{{.Prefix}}*" ct direction reply ct mark {{.RelayMark}} accept
		iifname "{{.Prefix}}*" ct status dnat ct mark {{.FilterMark}} accept
		iifname "{{.Prefix}}*" ip saddr vmap @pol4
		iifname "{{.Prefix}}*" ip saddr {{.Subnet}} ip daddr @dns4 meta l4proto { tcp, udp } th dport 53 accept
		iifname "{{.Prefix}}*" ip saddr != {{.Subnet}} accept
		iifname "{{.Prefix}}*" drop
		iifname "{{.NoNet}}*" fib saddr . iif oif missing drop
		iifname "{{.NoNet}}*" ct direction reply ct mark {{.RelayMark}} accept
		iifname "{{.NoNet}}*" drop
	}
	chain forward {
		{{hook "forward"}}
		iifname "{{.NoNet}}*" drop
		oifname "{{.NoNet}}*" drop
		iifname "{{.Prefix}}*" oifname "{{.Prefix}}*" drop
		iifname "{{.Prefix}}*" meta nfproto ipv6 drop
		iifname "{{.Prefix}}*" fib saddr . iif oif missing drop
		iifname "{{.Prefix}}*" ip saddr != {{.Subnet}} accept
		iifname "{{.Prefix}}*" ip saddr vmap @pol4
		iifname "{{.Prefix}}*" ip daddr @allow4 accept
		iifname "{{.Prefix}}*" ip daddr @dns4 meta l4proto { tcp, udp } th dport 53 accept
		iifname "{{.Prefix}}*" ip daddr @deny4 drop
		iifname "{{.Prefix}}*" accept
		oifname "{{.Prefix}}*" ct state established,related accept
		oifname "{{.Prefix}}*" drop
	}
	chain output {
		{{hook "output"}}
		oifname "{{.Prefix}}*" ip daddr {{.Subnet}} meta l4proto tcp meta mark {{.RelayMark}} ct state new ct mark set {{.RelayMark}}
		oifname "{{.NoNet}}*" ip daddr {{.Subnet}} meta l4proto tcp meta mark {{.RelayMark}} ct state new ct mark set {{.RelayMark}}
		oifname != "{{.Prefix}}*" oifname != "{{.NoNet}}*" ip daddr {{.Subnet}} meta mark {{.RelayMark}} reject with icmpx host-unreachable
	}
	chain prerouting {
		{{hook "prerouting"}}
		iifname "{{.Prefix}}*" ip saddr vmap @nat4
	}
	chain postrouting {
		{{hook "postrouting"}}
		iifname "{{.Prefix}}*" oifname != "{{.Prefix}}*" ip saddr {{.Subnet}} masquerade
	}
}
`

// baseChains are the ruleset's base chains and their declarations, which
// installTable repeats when it rewrites a table in place.
var baseChains = []struct{ name, decl string }{
	{"input", "type filter hook input priority -10; policy accept;"},
	{"forward", "type filter hook forward priority -10; policy accept;"},
	{"output", "type filter hook output priority -10; policy accept;"},
	{"prerouting", "type nat hook prerouting priority -100; policy accept;"},
	{"postrouting", "type nat hook postrouting priority 100; policy accept;"},
}

func chainDecl(name string) string {
	for _, c := range baseChains {
		if c.name == name {
			return c.decl
		}
	}
	panic("egress: no base chain " + name) // the template is ours
}

var rulesetTmpl = template.Must(template.New("ruleset").Funcs(template.FuncMap{
	"hook": chainDecl,
	"join": func(v any) string {
		var parts []string
		switch v := v.(type) {
		case []netip.Prefix:
			for _, p := range v {
				parts = append(parts, p.String())
			}
		case []netip.Addr:
			for _, a := range v {
				parts = append(parts, a.String())
			}
		}
		return strings.Join(parts, ", ")
	},
}).Parse(rulesetTemplate))

// ruleset is the nft script of e's table.
func (e *Egress) ruleset() string {
	var b strings.Builder
	if err := rulesetTmpl.Execute(&b, map[string]any{
		"Table": e.table, "Prefix": e.prefix, "NoNet": e.noNetPrefix, "Subnet": e.subnet,
		"FilterMark": fmt.Sprintf("0x%08x", FilterMark), "RelayMark": fmt.Sprintf("0x%08x", RelayMark),
		"Deny": DefaultDeny, "Allow": e.allow, "DNS": e.resolvers,
	}); err != nil {
		panic(err) // the template and its data are ours
	}
	return b.String()
}

// ErrAddressInUse: the sandbox's address is routed to another interface
// already, by another sandboxd sharing the egress subnet.
var ErrAddressInUse = errors.New("egress address in use")

// Info is what a backend records of a sandbox's egress.
type Info struct {
	IP      netip.Addr `json:"ip"`
	HostIf  string     `json:"hostIf"`
	Gateway netip.Addr `json:"gateway"`
}

// LinkNames are the names of the veth ends of the sandbox with this key (15
// bytes each, the kernel's limit).
func LinkNames(key string) (host, peer string) {
	h := sha256.Sum256([]byte(key))
	suffix := hex.EncodeToString(h[:])[:12]
	return HostPrefix + suffix, PeerPrefix + suffix
}

// Egress holds the state shared by all sandboxes of a backend with internet
// access.
type Egress struct {
	subnet    netip.Prefix
	gateway   netip.Addr
	allow     []netip.Prefix // exceptions to DefaultDeny
	resolvers []netip.Addr   // of the sandboxes' resolv.conf
	// table, prefix and noNetPrefix are Table, HostPrefix and
	// NoNetPrefix; tests use their own, so that they do not fight a
	// sandboxd (or another package's tests) on this host over the rules.
	table, prefix, noNetPrefix string

	once    sync.Once
	initErr error
	ready   atomic.Bool // Setup succeeded

	// links is route netlink in sandboxd's network namespace, for every
	// sandbox's host end (hostLinks).
	linksOnce sync.Once
	links     *netlink.Handle

	// Per-sandbox policies (policy.go, sandboxes.go), by sandbox address.
	mu        sync.Mutex
	policies  map[netip.Addr]sandboxPolicy // in force
	installed map[netip.Addr]bool          // with rules in the table, maybe an earlier process's
	filter    NameFilter                   // started with the first domain rule
	nl        *nftables.Conn               // the policies' changes (nftnl.go)
	// The address rules' refusals (nflog.go): the reader, started with
	// the first policy that refuses, and its connection counts by sandbox
	// id.
	audit       *auditReader
	auditTried  bool
	deniedConns map[string]uint64
	log         *slog.Logger
	reg         prometheus.Registerer
}

// New checks subnet: IPv4, /28 or larger. Its first address is every
// sandbox's gateway. allow are the blocks of DefaultDeny that sandboxes
// may reach nonetheless (IPv4: sandboxes have no IPv6). The resolvers of
// the host's /etc/resolv.conf are read now: sandboxes get them
// (ResolvConf) and reach them on port 53.
func New(subnet netip.Prefix, allow ...netip.Prefix) (*Egress, error) {
	subnet = subnet.Masked()
	if !subnet.Addr().Is4() || subnet.Bits() > 28 {
		return nil, fmt.Errorf("egress subnet %s: want IPv4, /28 or larger", subnet)
	}
	e := &Egress{
		subnet: subnet, gateway: subnet.Addr().Next(), resolvers: hostResolvers(), prefix: HostPrefix, noNetPrefix: NoNetPrefix, table: tableName(subnet),
		policies: map[netip.Addr]sandboxPolicy{}, installed: map[netip.Addr]bool{}, deniedConns: map[string]uint64{}, log: slog.Default(),
	}
	for _, p := range allow {
		if !p.IsValid() || !p.Addr().Is4() {
			return nil, fmt.Errorf("egress allow %s: want an IPv4 CIDR", p)
		}
		e.allow = append(e.allow, p.Masked())
	}
	return e, nil
}

// UseResolvers makes rs the sandboxes' resolvers instead of the host's
// (before Setup; none: no change).
func (e *Egress) UseResolvers(rs []netip.Addr) error {
	for _, r := range rs {
		if !r.Is4() || r.IsUnspecified() || r.IsLoopback() {
			return fmt.Errorf("egress resolver %s: want an IPv4 address sandboxes can reach (not loopback)", r)
		}
	}
	if len(rs) > 0 {
		e.resolvers = slices.Clone(rs)
	}
	return nil
}

// Resolvers are the sandboxes' resolvers.
func (e *Egress) Resolvers() []netip.Addr { return slices.Clone(e.resolvers) }

// Subnet is where sandbox addresses come from.
func (e *Egress) Subnet() netip.Prefix { return e.subnet }

// Gateway is the address of every host end.
func (e *Egress) Gateway() netip.Addr { return e.gateway }

// Ready reports whether Setup has succeeded.
func (e *Egress) Ready() bool { return e.ready.Load() }

// Setup enables forwarding and installs the nftables table, once per
// process. The table is replaced whole, so a changed ruleset takes effect
// and repeated runs do not stack rules. The table is the subnet's: two
// sandboxd sharing a subnet (which ErrAddressInUse refuses anyway) would
// share it. Until it has run, a missing nft is
// ErrNoNft, not remembered: installing nftables later is enough.
func (e *Egress) Setup() error {
	if e.ready.Load() {
		return nil
	}
	if err := HaveNft(); err != nil {
		return err
	}
	e.once.Do(func() {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			e.initErr = fmt.Errorf("enable ip_forward: %w", err)
			return
		}
		if err := e.installTable(); err != nil {
			e.initErr = err
			return
		}
		e.ready.Store(true)
	})
	return e.initErr
}

func tableName(subnet netip.Prefix) string {
	return Table + "_" + strings.NewReplacer(".", "_", "/", "_").Replace(subnet.Masked().String())
}

// DeleteTable removes the rules of egress subnet subnet, which Setup
// leaves in place when sandboxd exits (its sandboxes may outlive it): for
// tests, and for an operator retiring a subnet.
func DeleteTable(subnet netip.Prefix) error {
	if out, err := exec.Command("nft", "delete", "table", "inet", tableName(subnet)).CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// Allocate picks a free address in the subnet, skipping the network,
// gateway and broadcast addresses and those in used.
func (e *Egress) Allocate(used func(netip.Addr) bool) (netip.Addr, error) {
	last := lastAddr(e.subnet)
	for a := e.gateway.Next(); a.IsValid() && a.Less(last); a = a.Next() {
		if !used(a) {
			// Rules of a sandbox gone while no sandboxd ran are not
			// the new sandbox's.
			if err := e.ClearPolicy(a); err != nil {
				return netip.Addr{}, err
			}
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("egress subnet %s is full", e.subnet)
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// CreateVethIn makes the pair for the sandbox with this key once its
// network namespace exists (that of process pid): the peer is created in
// it directly, as eth0, and configured there (ConfigureSandbox); the host
// end by ConfigureHost. Creating the peer in place spares moving a device
// between namespaces, which waits for an RCU grace period (about 35 ms of a
// create on this kernel, and as much again when the sandbox goes).
func (e *Egress) CreateVethIn(key string, ip netip.Addr, pid int) (Info, error) {
	host, _ := LinkNames(key)
	host = e.prefix + host[len(HostPrefix):]
	// One queue each way, asked for (both ends take the attributes): a
	// veth made without them gets a queue per CPU, and the kernel then cuts
	// it to one in an expedited RCU grace period while it holds rtnl_mutex,
	// which every other sandbox's network set-up and teardown waits for.
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: host, NumTxQueues: 1, NumRxQueues: 1},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsPid(pid),
	}
	if err := e.hostLinks().LinkAdd(veth); err != nil {
		return Info{}, fmt.Errorf("add veth %s: %w", host, err)
	}
	fail := func(err error) (Info, error) {
		DeleteLinks(key) // the peer goes with the host end
		return Info{}, err
	}
	// LinkAdd has looked up the new link's index into veth already.
	if err := e.configureHost(veth, ip); err != nil {
		return fail(err)
	}
	if err := ConfigureSandbox(pid, ip, e.gateway); err != nil {
		return fail(err)
	}
	return Info{IP: ip, HostIf: host, Gateway: e.gateway}, nil
}

// ConfigureHost sets up host end hostIf of a sandbox's veth: the gateway
// address, forwarding, link up and the route to the sandbox's address ip.
func (e *Egress) ConfigureHost(hostIf string, ip netip.Addr) error {
	if !strings.HasPrefix(hostIf, e.prefix) {
		return fmt.Errorf("host end %q: the egress rules only cover %s* interfaces", hostIf, e.prefix)
	}
	hl, err := e.hostLinks().LinkByName(hostIf)
	if err != nil {
		return fmt.Errorf("host end %s: %w", hostIf, err)
	}
	return e.configureHost(hl, ip)
}

// hostLinks is a route netlink handle in sandboxd's network namespace,
// whose one socket serves every sandbox's host end: each package-level
// call of the netlink package opens, binds, configures and closes a socket
// of its own, four of them a create. Its requests take turns on the
// socket, as the kernel's handling of them does on rtnl_mutex. It is made
// on first use, by a goroutine that is not locked to a thread (those are
// the ones that enter a sandbox's namespace): in sandboxd's namespace.
// Should the socket fail, the calls fall back to a socket each.
func (e *Egress) hostLinks() *netlink.Handle {
	e.linksOnce.Do(func() {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err == nil {
			if err = h.SetSocketTimeout(time.Duration(nl.SocketTimeoutTv.Nano())); err != nil {
				h.Close()
			}
		}
		if err != nil {
			e.log.Warn("egress: a route netlink socket of its own", "err", err)
			h = &netlink.Handle{} // a socket per call, as the package's functions
		}
		e.links = h
	})
	return e.links
}

// configureHost is ConfigureHost on a link whose index is known.
func (e *Egress) configureHost(hl netlink.Link, ip netip.Addr) error {
	hostIf := hl.Attrs().Name
	links := e.hostLinks()
	if err := links.AddrAdd(hl, &netlink.Addr{IPNet: ipNet(e.gateway)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", e.gateway, hostIf, err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+hostIf+"/forwarding", []byte("1"), 0o644); err != nil {
		return err
	}
	if err := links.LinkSetUp(hl); err != nil {
		return fmt.Errorf("up %s: %w", hostIf, err)
	}
	// Add, never replace: a route to ip that exists already belongs to a
	// live sandbox of another sandboxd with the same egress subnet, and
	// taking it over would hand that sandbox's replies to this one.
	route := &netlink.Route{LinkIndex: hl.Attrs().Index, Dst: ipNet(ip), Scope: netlink.SCOPE_LINK}
	if err := links.RouteAdd(route); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("route %s via %s: %w: %s is routed elsewhere already (does another sandboxd on this host use the same egress subnet? give each its own --egress-subnet)", ip, hostIf, ErrAddressInUse, ip)
		}
		return fmt.Errorf("route %s via %s: %w", ip, hostIf, err)
	}
	return nil
}

// ConfigureSandbox sets up eth0 in the network namespace of process pid:
// address ip/32 (unless ip is the zero Addr: a runtime that moved the peer
// in with its address), link up, the default route via gw, on-link, and
// TCP's initial receive buffer (SandboxRcvBuf).
func ConfigureSandbox(pid int, ip, gw netip.Addr) error {
	if pid <= 0 {
		return errors.New("no sandbox process to find the network namespace by")
	}
	ns, err := netns.GetFromPath(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return err
	}
	defer ns.Close()
	// Route netlink only: a handle opens a socket of every family it is
	// given (three by default), each inside the namespace and back.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0 in the sandbox: %w", err)
	}
	if ip.IsValid() {
		if err := h.AddrReplace(eth0, &netlink.Addr{IPNet: ipNet(ip)}); err != nil {
			return fmt.Errorf("address %s on eth0 in the sandbox: %w", ip, err)
		}
		if err := h.LinkSetUp(eth0); err != nil {
			return fmt.Errorf("eth0 up in the sandbox: %w", err)
		}
	}
	route := &netlink.Route{
		LinkIndex: eth0.Attrs().Index,
		Gw:        net.IP(gw.AsSlice()),
		Flags:     int(netlink.FLAG_ONLINK),
	}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("default route via %s: %w", gw, err)
	}
	return tuneSandbox(pid)
}

// DeleteLinks removes the veth ends of the sandbox with this key left in
// the host namespace (a failed create; once the peer is in the sandbox, the
// pair dies with it).
func DeleteLinks(key string) {
	host, peer := LinkNames(key)
	for _, name := range []string{peer, host} {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	}
}

func ipNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}

// hostResolvers are the host's IPv4 nameservers, except loopback ones the
// sandbox cannot reach, or public resolvers if none is left.
func hostResolvers() []netip.Addr {
	var servers []netip.Addr
	if raw, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) >= 2 && f[0] == "nameserver" {
				if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() && !a.IsLoopback() {
					servers = append(servers, a)
				}
			}
		}
	}
	if len(servers) == 0 {
		servers = []netip.Addr{netip.AddrFrom4([4]byte{8, 8, 8, 8}), netip.AddrFrom4([4]byte{1, 1, 1, 1})}
	}
	return servers
}

// ResolvConf is the /etc/resolv.conf of a sandbox with egress: the host's
// nameservers as New found them, which the rules let sandboxes reach on
// port 53 even in a private range (a resolver on the host's LAN, such as
// a cloud's VPC resolver) or on the host itself.
func (e *Egress) ResolvConf() []byte {
	var b bytes.Buffer
	for _, s := range e.resolvers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	return b.Bytes()
}

// ErrNoNft: sandboxes with internet access need the nft command.
var ErrNoNft = errors.New("nft not found: install the nftables package for sandboxes with internet access")

// HaveNft reports ErrNoNft when nft is not on PATH.
func HaveNft() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return ErrNoNft
	}
	return nil
}
