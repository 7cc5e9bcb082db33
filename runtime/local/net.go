package local

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Egress: a sandbox created with AllowInternet gets a veth pair. Its end is
// eth0 inside, with one address from the egress subnet (/32) and a default
// route to the gateway address, which every host end carries (/32, like
// Calico). The host routes the sandbox's address to its veth, forwards its
// traffic and masquerades it. One nftables table, created once, holds all
// rules; they match the interface prefix, so there is nothing to add or
// remove per sandbox:
//
//   - input from a sandbox veth is dropped: a sandbox never reaches the
//     host itself (sandboxd's port, or anything bound to 0.0.0.0);
//   - forwarding between sandbox veths is dropped: sandboxes do not reach
//     each other;
//   - link-local destinations (cloud metadata) are dropped;
//   - new connections into a sandbox are dropped; replies pass.
//
// The host end is named hostPrefix+12 hex digits of the id's hash, the
// sandbox end peerPrefix+the same until libcontainer moves it in as eth0.
const (
	hostPrefix = "sbx"
	peerPrefix = "sbp"
	nftTable   = "sandboxd"
)

const nftRuleset = `table inet sandboxd {
	chain input {
		type filter hook input priority -10; policy accept;
		iifname "sbx*" drop
	}
	chain forward {
		type filter hook forward priority -10; policy accept;
		iifname "sbx*" oifname "sbx*" drop
		iifname "sbx*" ip daddr 169.254.0.0/16 drop
		iifname "sbx*" meta nfproto ipv6 drop
		iifname "sbx*" accept
		oifname "sbx*" ct state established,related accept
		oifname "sbx*" drop
	}
	chain postrouting {
		type nat hook postrouting priority 100; policy accept;
		iifname "sbx*" oifname != "sbx*" masquerade
	}
}
`

// netInfo is what meta.json records of a sandbox's egress.
type netInfo struct {
	IP      netip.Addr `json:"ip"`
	HostIf  string     `json:"hostIf"`
	Gateway netip.Addr `json:"gateway"`
}

func linkNames(id string) (host, peer string) {
	h := sha256.Sum256([]byte(id))
	suffix := hex.EncodeToString(h[:])[:12]
	return hostPrefix + suffix, peerPrefix + suffix
}

// egress holds the state shared by all sandboxes with internet access.
type egress struct {
	subnet  netip.Prefix
	gateway netip.Addr

	once    sync.Once
	initErr error
}

func newEgress(subnet netip.Prefix) (*egress, error) {
	subnet = subnet.Masked()
	if !subnet.Addr().Is4() || subnet.Bits() > 28 {
		return nil, fmt.Errorf("egress subnet %s: want IPv4, /28 or larger", subnet)
	}
	return &egress{subnet: subnet, gateway: subnet.Addr().Next()}, nil
}

// setup enables forwarding and installs the nftables table, once per
// process. The table is replaced whole, so a changed ruleset takes effect
// and repeated runs do not stack rules.
func (e *egress) setup() error {
	e.once.Do(func() {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			e.initErr = fmt.Errorf("enable ip_forward: %w", err)
			return
		}
		script := "table inet " + nftTable + "\ndelete table inet " + nftTable + "\n" + nftRuleset
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			e.initErr = fmt.Errorf("nft: %w: %s", err, bytes.TrimSpace(out))
		}
	})
	return e.initErr
}

// allocate picks a free address in the subnet, skipping the network,
// gateway and broadcast addresses and those in used.
func (e *egress) allocate(used map[netip.Addr]bool) (netip.Addr, error) {
	last := lastAddr(e.subnet)
	for a := e.gateway.Next(); a.IsValid() && a.Less(last); a = a.Next() {
		if !used[a] {
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

// createVeth makes the pair for sandbox id: the host end up with the
// gateway address, forwarding and a route to ip; the peer with ip, left
// for libcontainer to move into the sandbox as eth0 (it keeps permanent
// addresses and brings the link up).
func (e *egress) createVeth(id string, ip netip.Addr) (netInfo, error) {
	host, peer := linkNames(id)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: peer}
	if err := netlink.LinkAdd(veth); err != nil {
		return netInfo{}, fmt.Errorf("add veth %s: %w", host, err)
	}
	fail := func(err error) (netInfo, error) {
		deleteLinks(id)
		return netInfo{}, err
	}
	hl, err := netlink.LinkByName(host)
	if err != nil {
		return fail(err)
	}
	pl, err := netlink.LinkByName(peer)
	if err != nil {
		return fail(err)
	}
	if err := netlink.AddrAdd(hl, &netlink.Addr{IPNet: ipNet(e.gateway)}); err != nil {
		return fail(fmt.Errorf("address %s on %s: %w", e.gateway, host, err))
	}
	if err := netlink.AddrAdd(pl, &netlink.Addr{IPNet: ipNet(ip)}); err != nil {
		return fail(fmt.Errorf("address %s on %s: %w", ip, peer, err))
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+host+"/forwarding", []byte("1"), 0o644); err != nil {
		return fail(err)
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		return fail(fmt.Errorf("up %s: %w", host, err))
	}
	route := &netlink.Route{LinkIndex: hl.Attrs().Index, Dst: ipNet(ip), Scope: netlink.SCOPE_LINK}
	if err := netlink.RouteReplace(route); err != nil {
		return fail(fmt.Errorf("route %s via %s: %w", ip, host, err))
	}
	return netInfo{IP: ip, HostIf: host, Gateway: e.gateway}, nil
}

// addDefaultRoute adds the default route in the network namespace of pid,
// once libcontainer has moved the peer in as eth0.
func addDefaultRoute(pid int, gw netip.Addr) error {
	ns, err := netns.GetFromPath(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0 in the sandbox: %w", err)
	}
	route := &netlink.Route{
		LinkIndex: eth0.Attrs().Index,
		Gw:        net.IP(gw.AsSlice()),
		Flags:     int(netlink.FLAG_ONLINK),
	}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("default route via %s: %w", gw, err)
	}
	return nil
}

// deleteLinks removes sandbox id's veth ends left in the host namespace (a
// failed create; once the peer is in the sandbox, the pair dies with it).
func deleteLinks(id string) {
	host, peer := linkNames(id)
	for _, name := range []string{peer, host} {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	}
}

func ipNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}

// resolvConf is the /etc/resolv.conf of a sandbox with egress: the host's
// nameservers, except loopback ones the sandbox cannot reach, or public
// resolvers if none is left.
func resolvConf() []byte {
	var servers []string
	if raw, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) >= 2 && f[0] == "nameserver" {
				if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() && !a.IsLoopback() {
					servers = append(servers, f[1])
				}
			}
		}
	}
	if len(servers) == 0 {
		servers = []string{"8.8.8.8", "1.1.1.1"}
	}
	var b bytes.Buffer
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	return b.Bytes()
}

var errNoNft = errors.New("nft not found: install the nftables package for sandboxes with internet access")

func haveNft() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return errNoNft
	}
	return nil
}
