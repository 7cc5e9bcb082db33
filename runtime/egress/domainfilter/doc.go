// Package domainfilter enforces the domain rules of a sandbox's egress
// policy (E2B's network.allowOut with names such as "pypi.org" or
// "*.github.com"). It owns two listeners in the sandboxd process, fed by
// the host's nftables rules, which redirect to them what a sandbox with
// domain rules sends:
//
//   - a transparent TCP proxy for its connections to ports 80 and 443
//     (but those to addresses its policy allows by CIDR): it reads the
//     TLS ClientHello (SNI) or the HTTP/1.x request head (Host), asks the
//     policy about that name and the original destination port, and
//     either resets the connection or proxies it;
//   - a DNS filter for all its DNS (UDP and TCP): queries for names some
//     domain rule matches are forwarded unchanged to the host's
//     resolvers, all others get NXDOMAIN.
//
// Names are checked on every connection rather than by remembering which
// addresses the sandbox resolved: addresses are shared (CDNs, virtual
// hosting) and a sandbox can connect to any address it likes. For the
// same reason an allowed connection is dialled to the name as the host's
// resolvers resolve it, never to the address the sandbox connected to:
// a forged SNI or Host, or a sandbox-side /etc/hosts entry, then reaches
// the allowed name's servers and nothing else. Resolved addresses the
// operator's rules make unreachable (private ranges, metadata, ...) are
// refused, so a public name pointed at 10.0.0.1 reaches nothing.
//
// Only the start of a connection is checked: later requests on a kept-
// alive HTTP/1.x connection, or whatever flows inside an allowed TLS
// session, go to the server dialled for the first name, so they reach no
// other address, but may reach another virtual host of that server
// (domain fronting on a shared CDN), as with E2B's own filter.
//
// The DNS filter is only a courtesy (sandboxes see NXDOMAIN rather than
// a reset for a name they may not use); the proxy is the enforcement.
package domainfilter
