package egress

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/runtime/egress/domainfilter"
	"github.com/sandboxd/sandboxd/runtime/egress/policy"
)

// A sandbox's policy lives in its subnet's table, keyed by its address
// (addresses are reused; a create whose address still carries rules, say
// of a sandbox that died while sandboxd was down, clears them first):
//
//   - pol4 maps the address to a chain p_<hex address> that forward and
//     input jump to before the operator's rules: the sandbox's allow
//     rules go to c_<hex>, which counts new connections and returns (the
//     operator's rules decide next), its deny rules count, log to the
//     Egress's NFLOG group (nflog.go: audit lines, connection counts) and
//     reject, and the rest returns;
//   - a policy with domain rules also maps the address in nat4 to a chain
//     n_<hex> at prerouting that redirects its DNS (port 53, to any
//     address: DNS over TCP and other resolvers too) and its TCP to ports
//     80 and 443 that no allow rule lets through to the name filter, a
//     DNS filter and transparent proxy that check the names (NameFilter);
//   - the sets a_<hex> and d_<hex> hold the address rules on every port;
//     a rule with ports is a rule of the chain.
//
// One nftables transaction (a netlink batch, nftnl.go) writes a
// sandbox's whole policy, so an update takes effect at once and a packet
// meets either the old policy or the new one.
// Forwarded packets are checked against the policy each, with no shortcut
// for established connections: a connection the new policy allows goes
// on, one it denies stops.

// FilterMark is the conntrack mark of connections redirected to a name
// filter (see the ruleset's input chain).
const FilterMark = 0x5bd0f117

// NameFilter is the user-space side of domain rules.
type NameFilter interface {
	ProxyPort() uint16
	DNSPort() uint16
	// Recheck: the policy of the sandbox at src changed; its proxied
	// connections that the policy no longer allows end.
	Recheck(src netip.Addr)
	// Forget: the sandbox is gone.
	Forget(sandboxID string)
	Close() error
}

type sandboxPolicy struct {
	id string
	p  *policy.Policy
}

// known reports whether this process knows what rules ip carries (it put
// them there, or found none): rules of an earlier process may have names.
// e.mu is held.
func (e *Egress) known(ip netip.Addr) bool {
	_, ours := e.policies[ip]
	return ours || !e.installed[ip]
}

// PolicyOf is the policy in force for the sandbox at src, and its id.
func (e *Egress) PolicyOf(src netip.Addr) (string, *policy.Policy, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sp, ok := e.policies[src]
	return sp.id, sp.p, ok
}

// SetPolicy puts p in force for sandbox id at address ip (which Setup's
// rules route), replacing its previous policy; an empty p clears it.
func (e *Egress) SetPolicy(ctx context.Context, id string, ip netip.Addr, p *policy.Policy) error {
	if p.Empty() {
		return e.ClearPolicy(ip)
	}
	if !e.subnet.Contains(ip) {
		return fmt.Errorf("egress policy: %s is not in the egress subnet %s", ip, e.subnet)
	}
	if err := e.Setup(); err != nil {
		return err
	}
	e.mu.Lock()
	var f NameFilter
	if p.Domains() {
		if err := e.startFilter(ctx); err != nil {
			e.mu.Unlock()
			return err
		}
		f = e.filter
	}
	if refuses(p) {
		e.startAudit()
	}
	// The name-filter half is written (or cleared) only where the new or
	// the old policy has names: a smaller transaction otherwise.
	nat := p.Domains() || e.policies[ip].p.Domains() || !e.known(ip)
	if err := e.commit(func(b *nlBatch) error { return b.policy(ip, p, f, nat) }); err != nil {
		e.mu.Unlock()
		return fmt.Errorf("egress policy of %s: %w", id, err)
	}
	if old, ok := e.policies[ip]; ok && old.id != id {
		delete(e.deniedConns, old.id)
	}
	e.policies[ip] = sandboxPolicy{id: id, p: p}
	e.installed[ip] = true
	f = e.filter
	e.mu.Unlock()
	if f != nil {
		f.Recheck(ip) // it asks PolicyOf: not under e.mu
	}
	return nil
}

// ClearPolicy removes the policy of the sandbox at ip, if it has one.
func (e *Egress) ClearPolicy(ip netip.Addr) error {
	e.mu.Lock()
	sp, had := e.policies[ip]
	if !e.installed[ip] {
		e.mu.Unlock()
		return nil
	}
	if err := e.commit(func(b *nlBatch) error { return b.clear(ip) }); err != nil {
		e.mu.Unlock()
		return fmt.Errorf("clear the egress policy of %s: %w", ip, err)
	}
	delete(e.policies, ip)
	delete(e.installed, ip)
	if had {
		delete(e.deniedConns, sp.id) // its chain's counters went too
	}
	f := e.filter
	e.mu.Unlock()
	if f != nil {
		f.Recheck(ip)
		if had {
			f.Forget(sp.id)
		}
	}
	return nil
}

// startFilter starts the name filter on the gateway address, once; e.mu
// is held.
func (e *Egress) startFilter(ctx context.Context) error {
	if e.filter != nil {
		return nil
	}
	var rs []netip.AddrPort
	for _, r := range e.resolvers {
		rs = append(rs, netip.AddrPortFrom(r, 53))
	}
	f, err := domainfilter.Start(context.WithoutCancel(ctx), domainfilter.Config{
		Listen: e.gateway, Resolvers: rs, Sandboxes: filterView{e}, Reachable: e.Reachable,
		Log: e.log, Registerer: e.reg,
	})
	if err != nil {
		return fmt.Errorf("start the egress name filter: %w", err)
	}
	e.filter = f
	return nil
}

// filterView is e as the name filter sees it.
type filterView struct{ e *Egress }

func (v filterView) Policy(src netip.Addr) (string, domainfilter.Policy, bool) {
	id, p, ok := v.e.PolicyOf(src)
	if !ok {
		return "", nil, false
	}
	return id, p, true
}

// Reachable reports whether sandboxes may reach ip by the operator's
// rules: not a sandbox, not the host itself, and not in DefaultDeny unless
// allowed. The name filter checks every address it dials for a sandbox.
func (e *Egress) Reachable(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.Is4() || e.subnet.Contains(ip) || isLocal(ip) {
		return false
	}
	for _, p := range e.allow {
		if p.Contains(ip) {
			return true
		}
	}
	for _, p := range DefaultDeny {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

// isLocal reports whether ip is an address of this host.
func isLocal(ip netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // fail closed
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if got, ok := netip.AddrFromSlice(n.IP); ok && got.Unmap() == ip {
				return true
			}
		}
	}
	return false
}

// Observe sets where the name filter logs and registers its metrics
// (before the first policy with domain rules).
func (e *Egress) Observe(log *slog.Logger, reg prometheus.Registerer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if log != nil {
		e.log = log
	}
	e.reg = reg
	if reg != nil {
		if err := reg.Register(denialsCollector{e}); err != nil {
			e.log.Warn("egress: register the policies' metrics", "err", err)
		}
	}
}

// Close stops the name filter and the refusals' reader, if they run. The
// rules stay: sandboxes outlive sandboxd.
func (e *Egress) Close() error {
	e.mu.Lock()
	f, r := e.filter, e.audit
	e.filter, e.audit, e.auditTried = nil, nil, false
	e.dropConn()
	e.mu.Unlock()
	stopAudit(r)
	if f != nil {
		return f.Close()
	}
	return nil
}

func objSuffix(ip netip.Addr) string {
	b := ip.As4()
	return fmt.Sprintf("%02x%02x%02x%02x", b[0], b[1], b[2], b[3])
}

func runNftExec(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// installTable writes the subnet's table. Where it exists with the
// per-sandbox maps, its base chains and sets are rewritten and the
// sandboxes' policies stay: a restarted sandboxd must not open, even for
// a moment, what the policies of its surviving sandboxes close (their
// redirects to the name filter point at the old process's ports until
// the policies are put in force again, and fail closed meanwhile).
// Anything else (an older layout) is replaced whole.
//
// The table of sandboxd's first layout (inet sandboxd, one for the host)
// goes: it drops all input from sandboxes, which the name filter and a
// resolver on the host need, whichever subnet's sandboxes they serve.
func (e *Egress) installTable() error {
	if e.prefix == HostPrefix && exec.Command("nft", "list", "table", "inet", Table).Run() == nil {
		if err := runNftExec("delete table inet " + Table + "\n"); err != nil {
			return fmt.Errorf("remove the egress table of an old sandboxd: %w", err)
		}
		e.log.Info("egress: removed the table of an old sandboxd", "table", "inet "+Table)
	}
	t := "inet " + e.table
	if out, err := exec.Command("nft", "list", "map", "inet", e.table, "pol4").Output(); err == nil {
		var b strings.Builder
		for _, c := range baseChains { // declared: output is new to tables of before the relay
			fmt.Fprintf(&b, "add chain %s %s { %s }\nflush chain %s %s\n", t, c.name, c.decl, t, c.name)
		}
		for _, s := range []string{"deny4", "allow4", "dns4"} {
			fmt.Fprintf(&b, "flush set %s %s\n", t, s)
		}
		if runNftExec(b.String()+e.ruleset()) == nil {
			for _, m := range addrRe.FindAll(out, -1) {
				if a, err := netip.ParseAddr(string(m)); err == nil && e.subnet.Contains(a) {
					e.installed[a] = true
				}
			}
			return nil
		}
	}
	return runNftExec("table " + t + "\ndelete table " + t + "\n" + e.ruleset())
}

var addrRe = regexp.MustCompile(`\b\d+\.\d+\.\d+\.\d+\b`)

// denialsCollector exports addressCounts per sandbox, and the
// connections the refused packets were (nflog.go).
type denialsCollector struct{ e *Egress }

var (
	denialsDesc = prometheus.NewDesc("sandboxd_egress_address_denied_packets_total",
		"Packets a sandbox sent that its egress policy's address rules refused, each retry of a connection too (the connections are sandboxd_egress_address_denied_connections_total; the name filter's refusals, sandboxd_egress_decisions_total).",
		[]string{"sandbox_id"}, nil)
	deniedConnsDesc = prometheus.NewDesc("sandboxd_egress_address_denied_connections_total",
		"Connection attempts (flows: a retry of the same one counts once) of a sandbox that its egress policy's address rules refused; absent where the kernel's packet log (NFLOG) cannot be read.",
		[]string{"sandbox_id"}, nil)
	allowedConnsDesc = prometheus.NewDesc("sandboxd_egress_address_allowed_connections_total",
		"New connections of a sandbox that an allow entry of its egress policy's address rules let through (the operator's rules may still refuse some; an unanswered connection's retries count too; what no entry names is not counted).",
		[]string{"sandbox_id"}, nil)
)

func (c denialsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- denialsDesc
	ch <- deniedConnsDesc
	ch <- allowedConnsDesc
}

func (c denialsCollector) Collect(ch chan<- prometheus.Metric) {
	c.e.mu.Lock()
	ids := make(map[netip.Addr]string, len(c.e.policies))
	var conns map[string]uint64 // nil: no reader, no counts
	if c.e.audit != nil {
		conns = make(map[string]uint64, len(c.e.policies))
	}
	for ip, sp := range c.e.policies {
		ids[ip] = sp.id
		if conns != nil {
			conns[sp.id] = c.e.deniedConns[sp.id]
		}
	}
	c.e.mu.Unlock()
	for id, n := range conns {
		ch <- prometheus.MustNewConstMetric(deniedConnsDesc, prometheus.CounterValue, float64(n), id)
	}
	if len(ids) == 0 {
		return
	}
	denied, allowed, err := c.e.addressCounts()
	if err != nil {
		c.e.log.Warn("egress: read the policies' counters", "err", err)
		return
	}
	for ip, id := range ids {
		ch <- prometheus.MustNewConstMetric(denialsDesc, prometheus.CounterValue, float64(denied[ip]), id)
		ch <- prometheus.MustNewConstMetric(allowedConnsDesc, prometheus.CounterValue, float64(allowed[ip]), id)
	}
}
