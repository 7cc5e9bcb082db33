// Package policy is a sandbox's egress policy as E2B's API states it
// (network.allowOut and network.denyOut): its parsing and checks, and the
// decisions it makes. Package egress enforces it.
package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// AllTraffic is E2B's ALL_TRAFFIC: a denyOut entry of it turns a sandbox's
// default from allow to deny.
const AllTraffic = "0.0.0.0/0"

// MaxRules bounds each list of a policy. Every address rule with ports is a
// rule in the sandbox's chain, evaluated per packet, and every entry is
// checked on each proxied connection: a list longer than this is refused
// (400) rather than slowing every sandbox of the host.
const MaxRules = 500

// Rule is one allowOut or denyOut entry: an address block or a domain name
// (allowOut only), on every port or on a range of them. E2B's forms:
// "1.2.3.4", "1.2.3.0/24", "1.2.3.0/24:1-1024", "example.com",
// "*.example.com:443", "*".
type Rule struct {
	Prefix netip.Prefix // an address rule; invalid for a domain rule
	// Domain is lower-case ASCII: "example.com", "*.example.com" (its
	// subdomains, not itself) or "*" (every name).
	Domain             string
	PortFirst, PortEnd uint16 // 0, 0: every port
}

// AllPorts reports whether r covers every port.
func (r Rule) AllPorts() bool { return r.PortFirst == 0 }

func (r Rule) coversPort(port uint16) bool {
	return r.AllPorts() || (port >= r.PortFirst && port <= r.PortEnd)
}

// Policy is a sandbox's egress policy, as E2B defines it: an allow rule
// wins over a deny rule, and what neither names is allowed. Domains are
// matched on the names a connection carries (TLS SNI on port 443, the HTTP
// Host header on port 80) and on DNS questions; E2B requires denyOut to
// hold ALL_TRAFFIC whenever allowOut names a domain, since allowing a name
// means nothing where everything is allowed. Addresses are enforced in the
// kernel. The operator's rules (DefaultDeny and its exceptions) apply on
// top: no policy reaches a private address the operator keeps closed.
type Policy struct {
	Allow, Deny []Rule
}

// ErrInvalid is the class of a policy's parse errors (a client's
// mistake: 400). The error names the field and the entry.
var ErrInvalid = errors.New("invalid network policy")

func policyErr(field string, i int, entry, format string, args ...any) error {
	return fmt.Errorf("%w: %s[%d] %q: %s", ErrInvalid, field, i, entry, fmt.Sprintf(format, args...))
}

// Parse checks and parses E2B's network.allowOut and network.denyOut.
// Sandboxes have no IPv6: an IPv6 deny rule holds already (all IPv6 is
// dropped) and is kept; an IPv6 allow rule could never hold and is refused.
func Parse(allowOut, denyOut []string) (*Policy, error) {
	p := &Policy{}
	for _, l := range []struct {
		field   string
		entries []string
		dst     *[]Rule
	}{{"network.allowOut", allowOut, &p.Allow}, {"network.denyOut", denyOut, &p.Deny}} {
		if len(l.entries) > MaxRules {
			return nil, fmt.Errorf("%w: %s has %d entries, more than the limit of %d", ErrInvalid, l.field, len(l.entries), MaxRules)
		}
		for i, entry := range l.entries {
			r, err := parseRule(entry)
			if err != nil {
				return nil, policyErr(l.field, i, entry, "%v", err)
			}
			switch {
			case r.Domain != "" && l.dst == &p.Deny:
				return nil, policyErr(l.field, i, entry, "not an IP address or CIDR: domains can only be allowed (deny ALL_TRAFFIC, %s, and allow the domains)", AllTraffic)
			case r.Prefix.IsValid() && r.Prefix.Addr().Is6() && l.dst == &p.Allow:
				return nil, policyErr(l.field, i, entry, "sandboxes have no IPv6 access to allow")
			}
			*l.dst = append(*l.dst, r)
		}
	}
	if p.Domains() && !slices.Contains(denyOut, AllTraffic) {
		return nil, fmt.Errorf("%w: network.allowOut names domains, so network.denyOut must hold %s (ALL_TRAFFIC): a domain rule means nothing where all traffic is allowed", ErrInvalid, AllTraffic)
	}
	return p, nil
}

func parseRule(s string) (Rule, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Rule{}, errors.New("empty")
	}
	host, ports, err := splitPorts(s)
	if err != nil {
		return Rule{}, err
	}
	r := Rule{}
	if ports != "" {
		if r.PortFirst, r.PortEnd, err = parsePorts(ports); err != nil {
			return Rule{}, err
		}
	}
	if pfx, ok := parseAddr(host); ok {
		if pfx.Addr().IsUnspecified() && pfx.Bits() != 0 {
			return Rule{}, errors.New("the unspecified address is no destination")
		}
		r.Prefix = pfx
		return r, nil
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if name == "*" {
		r.Domain = name
		return r, nil
	}
	bare := strings.TrimPrefix(name, "*.")
	if strings.Contains(bare, "*") {
		return Rule{}, errors.New("a wildcard may only start a domain, as in *.example.com")
	}
	if strings.ContainsAny(bare, "/:[] ") || !strings.Contains(bare, ".") && !isLabel(bare) {
		return Rule{}, errors.New("neither an IP address, a CIDR nor a domain name")
	}
	ascii, err := idna.Lookup.ToASCII(bare)
	if err != nil || ascii != bare {
		return Rule{}, errors.New("not a valid domain name (ASCII, or its punycode form)")
	}
	r.Domain = name
	return r, nil
}

func isLabel(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// splitPorts splits "host:ports" (IPv4 or a name: one colon; IPv6 needs
// brackets for a port: "[::1]:53"). A trailing colon means every port.
func splitPorts(s string) (host, ports string, err error) {
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return "", "", errors.New("no closing bracket")
		}
		rest := s[end+1:]
		if rest != "" && !strings.HasPrefix(rest, ":") {
			return "", "", errors.New("want [address]:ports")
		}
		return s[1:end], strings.TrimPrefix(rest, ":"), nil
	}
	if strings.Count(s, ":") != 1 {
		return s, "", nil // no port, or a bare IPv6 address
	}
	host, ports, _ = strings.Cut(s, ":")
	return host, ports, nil
}

func parsePorts(s string) (first, last uint16, err error) {
	a, b, isRange := strings.Cut(s, "-")
	if first, err = parsePort(a); err != nil {
		return 0, 0, err
	}
	last = first
	if isRange {
		if last, err = parsePort(b); err != nil {
			return 0, 0, err
		}
		if last < first {
			return 0, 0, fmt.Errorf("port range %d-%d runs backwards", first, last)
		}
	}
	return first, last, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q: want 1-65535", s)
	}
	return uint16(n), nil
}

func parseAddr(s string) (netip.Prefix, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Prefix{}, false
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	return netip.Prefix{}, false
}

// Empty reports whether p has no rule at all (no policy).
func (p *Policy) Empty() bool { return p == nil || len(p.Allow)+len(p.Deny) == 0 }

// Domains reports whether p allows any domain, which needs the name
// filter (DNS and the proxy for ports 80 and 443).
func (p *Policy) Domains() bool {
	return p != nil && slices.ContainsFunc(p.Allow, func(r Rule) bool { return r.Domain != "" })
}

// AllowsHost reports whether a connection naming host (its SNI or Host
// header) may reach port: a domain rule matches both.
func (p *Policy) AllowsHost(host string, port uint16) bool {
	host = normalHost(host)
	return host != "" && slices.ContainsFunc(p.Allow, func(r Rule) bool {
		return r.Domain != "" && matchDomain(r.Domain, host) && r.coversPort(port)
	})
}

// AllowsName reports whether the sandbox may resolve name: a domain rule
// matches it, on whatever ports.
func (p *Policy) AllowsName(name string) bool {
	name = normalHost(name)
	return name != "" && slices.ContainsFunc(p.Allow, func(r Rule) bool {
		return r.Domain != "" && matchDomain(r.Domain, name)
	})
}

func normalHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// matchDomain: "*" matches every name, "*.example.com" the names under
// example.com (not example.com itself), anything else itself only.
func matchDomain(pattern, host string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasPrefix(pattern, "*."):
		return strings.HasSuffix(host, pattern[1:]) && len(host) > len(pattern)-1
	default:
		return host == pattern
	}
}

// Decide is the verdict of p's address rules on a connection to ip:port,
// as the kernel takes it: allow rules first, then deny rules, then allow.
// Domain rules do not enter it (they need a name).
func (p *Policy) Decide(ip netip.Addr, port uint16) bool {
	for _, r := range p.Allow {
		if r.Prefix.IsValid() && r.Prefix.Contains(ip) && r.coversPort(port) {
			return true
		}
	}
	for _, r := range p.Deny {
		if r.Prefix.IsValid() && r.Prefix.Contains(ip) && r.coversPort(port) {
			return false
		}
	}
	return true
}
