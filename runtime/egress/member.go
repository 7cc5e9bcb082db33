package egress

import (
	"fmt"
	"net/netip"
)

// On an Incus cluster member every sandbox has a routed NIC: a /32 of the
// sandbox subnet on its eth0, a veth whose host end the member routes the
// address to. sandboxd runs elsewhere and reaches envd on the sandbox's
// address through the member's relay (incus/relay), a process on the
// member host that connects into the sandbox. The member's table is the
// single host's (Setup; one template, see rulesetTemplate), with two
// groups of rules that matter on members only:
//
//   - Replies to the relay. The sandbox's answers to the relay's
//     connection come in on the host's input hook, from sbx*/sbn*, where
//     everything but DNS is dropped. The relay marks its sockets
//     (SO_MARK RelayMark); the output chain copies the mark to the
//     connection (ct mark) when one opens towards the sandbox subnet on
//     a sandbox's veth, and the input chains accept the reply direction
//     of connections so marked, before the sandbox's own policy (pol4)
//     and the drop. A sandbox cannot use that to open anything: a packet
//     it starts is the original direction of its connection, and the
//     mark comes only from a host socket that set it (CAP_NET_ADMIN).
//     Not `ct state established` alone: any process on the host, of any
//     user, would then reach every sandbox's ports; with the mark only the
//     relay, behind its pinned certificates, does. That is also why it
//     can be in every table: on a single host (runtime/local, incus
//     without cluster) nothing sets RelayMark, envd is reached through a
//     unix socket, and the rules match nothing.
//   - The relay's connections to the sandbox subnet leave through a
//     sandbox's veth or not at all: an address of the subnet that is no
//     sandbox of this member would follow the default route onto the
//     member's network; it is rejected at once instead (host
//     unreachable), and sandboxd learns the sandbox is not here without
//     waiting for a timeout.
//   - Sandboxes without internet access. Their host end is named
//     NoNetPrefix+12 hex digits (sbx for those with it, as on a single
//     host). Nothing is forwarded from or to sbn* interfaces, and their
//     input is dropped but for the relay's replies above, IPv6 included
//     (the drops match every family; only the replies, IPv4, pass). On a
//     single host a sandbox without internet has no NIC at all, so these
//     rules match nothing there either.
//
// The rules are static, matched by interface prefix and subnet: the member
// does nothing per sandbox. Incus makes the veths and routes.

// NoNetPrefix starts the host end of a cluster member's sandbox without
// internet access (sbn + 12 hex digits, like HostPrefix's).
const NoNetPrefix = "sbn"

// RelayMark is the socket mark (SO_MARK) of the relay's connections into
// sandboxes, and the conntrack mark the member's rules give them: only
// their replies pass the input chain.
const RelayMark = 0x5bd0f118

// SetupMember installs the firewall of a cluster member for the sandboxes
// of subnet and enables forwarding; the relay calls it at start. resolvers
// are the sandboxes' resolvers (none: the host's, see New and
// UseResolvers), allow the operator's exceptions to DefaultDeny (New's).
// The returned Egress's ResolvConf is the sandboxes' resolv.conf.
//
// It is idempotent and safe while sandboxes run: the table is rewritten
// in one nft transaction (installTable), so no packet meets a half-written
// table; connections live in conntrack, not in the table, and keep their
// mark, so a restarted relay's sandboxes keep their internet connections
// and answer the new relay at once.
func SetupMember(subnet netip.Prefix, resolvers []netip.Addr, allow ...netip.Prefix) (*Egress, error) {
	e, err := New(subnet, allow...)
	if err != nil {
		return nil, err
	}
	if err := e.UseResolvers(resolvers); err != nil {
		return nil, err
	}
	if err := e.Setup(); err != nil {
		return nil, fmt.Errorf("member firewall: %w", err)
	}
	return e, nil
}
