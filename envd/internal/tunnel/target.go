package tunnel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Errors ParseTarget wraps; the handler answers the first with 403 and the
// second with 400.
var (
	ErrNotLoopback = errors.New("tunnel target must be a loopback address (127.0.0.1, ::1 or localhost)")
	ErrBadTarget   = errors.New("malformed tunnel target")
)

// Target is where a tunnel goes: one of the sandbox's loopback addresses.
type Target struct {
	// Host is "127.0.0.1", "::1" or "localhost".
	Host string
	Port int
}

// addrs are the addresses to dial, in order. localhost is mapped here rather
// than resolved, so no /etc/hosts entry inside the sandbox can point a
// tunnel off the loopback.
func (t Target) addrs() []string {
	port := strconv.Itoa(t.Port)
	if t.Host == "localhost" {
		return []string{net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port)}
	}
	return []string{net.JoinHostPort(t.Host, port)}
}

func (t Target) String() string { return net.JoinHostPort(t.Host, strconv.Itoa(t.Port)) }

// ParseTarget parses a CONNECT authority such as "127.0.0.1:8080",
// "[::1]:8080" or "localhost:8080". Only the loopback may be reached and the
// port must be a plain decimal 1-65535 (no sign, no leading zeros), so the
// target that was authorised is exactly the one dialled.
func ParseTarget(authority string) (Target, error) {
	host, portStr, err := net.SplitHostPort(authority)
	if err != nil {
		return Target{}, fmt.Errorf("%w %q: %v", ErrBadTarget, authority, err)
	}
	port, ok := parsePort(portStr)
	if !ok {
		return Target{}, fmt.Errorf("%w %q: port must be a decimal number from 1 to 65535", ErrBadTarget, authority)
	}
	if strings.EqualFold(host, "localhost") {
		return Target{Host: "localhost", Port: port}, nil
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		if host == "" || strings.ContainsAny(host, "%[]/ \t") {
			return Target{}, fmt.Errorf("%w %q: bad host", ErrBadTarget, authority)
		}
		// A well-formed name other than localhost: not ours to reach.
		return Target{}, fmt.Errorf("%w: %q", ErrNotLoopback, authority)
	}
	switch {
	case addr.Zone() != "":
		return Target{}, fmt.Errorf("%w: %q", ErrNotLoopback, authority)
	case addr == netip.IPv6Loopback():
		return Target{Host: "::1", Port: port}, nil
	case addr == netip.AddrFrom4([4]byte{127, 0, 0, 1}):
		return Target{Host: "127.0.0.1", Port: port}, nil
	}
	return Target{}, fmt.Errorf("%w: %q", ErrNotLoopback, authority)
}

func parsePort(s string) (int, bool) {
	if len(s) == 0 || len(s) > 5 || s[0] == '0' {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, n <= 65535
}
