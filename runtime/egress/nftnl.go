package egress

import (
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime/egress/policy"
)

// The per-sandbox objects go to the kernel over netlink, one batch (one
// nftables transaction) per change. nft, even a long-lived `nft -i`,
// fetches the host's whole ruleset before each command: 3 ms for a
// 20-rule policy with few sandboxes, over 6 ms with 120 policies in the
// table. A batch is what nft would send, without the cache: the same
// objects, expressions and set flags, so that `nft list` shows what the
// scripts of earlier versions wrote, and a sandboxd of either kind finds
// the other's objects. The table and its base chains, written once per
// process, still go through nft (installTable).

// nlConn is e's netlink socket, opened on first use; e.mu is held.
func (e *Egress) nlConn() (*nftables.Conn, error) {
	if e.nl == nil {
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return nil, fmt.Errorf("nftables netlink: %w", err)
		}
		e.nl = c
	}
	return e.nl, nil
}

// dropConn closes e's socket after a failed batch: a Conn keeps a
// serialisation error and the failed batch's unread acknowledgements, and
// the next batch must not meet either. e.mu is held.
func (e *Egress) dropConn() {
	if e.nl != nil {
		_ = e.nl.CloseLasting()
		e.nl = nil
	}
}

// commit sends what build queues as one transaction; e.mu is held.
func (e *Egress) commit(build func(b *nlBatch) error) error {
	c, err := e.nlConn()
	if err != nil {
		return err
	}
	b := &nlBatch{c: c, t: &nftables.Table{Name: e.table, Family: nftables.TableFamilyINet}}
	if e.audit != nil || !e.auditTried {
		b.group = e.logGroup()
	}
	if err := build(b); err != nil {
		e.dropConn() // the queued half of the batch goes with it
		return err
	}
	if err := c.Flush(); err != nil {
		e.dropConn()
		return err
	}
	return nil
}

// nlBatch queues one transaction's messages for a table.
type nlBatch struct {
	c *nftables.Conn
	t *nftables.Table
	// lastID numbers the sets the batch adds: the kernel resolves an
	// anonymous set by this id within the transaction. The library's own
	// counter is a global shared by every Conn without a lock.
	lastID uint32
	group  uint16 // the refusals' NFLOG group (nflog.go); 0: none
}

func (b *nlBatch) nextID() uint32 {
	b.lastID++
	return b.lastID
}

// addrSet is a_ or d_: `type ipv4_addr; flags interval; auto-merge;`.
// auto-merge is only nft's (the elements are merged here, mergeSpans); the
// flag is kept so that nft, listing or changing the set, treats it alike.
func (b *nlBatch) addrSet(name string) *nftables.Set {
	return &nftables.Set{Table: b.t, Name: name, KeyType: nftables.TypeIPAddr, Interval: true, AutoMerge: true, ID: b.nextID()}
}

func (b *nlBatch) vmap(name string) *nftables.Set {
	return &nftables.Set{Table: b.t, Name: name, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
}

func (b *nlBatch) chain(name string) *nftables.Chain {
	return &nftables.Chain{Table: b.t, Name: name}
}

func (b *nlBatch) rule(c *nftables.Chain, exprs ...expr.Any) {
	b.c.AddRule(&nftables.Rule{Table: b.t, Chain: c, Exprs: exprs})
}

// anonSet is an anonymous constant set such as nft makes of `{ tcp, udp }`
// in a rule: it lives and dies with the rule.
func (b *nlBatch) anonSet(kt nftables.SetDatatype, keys ...[]byte) (*nftables.Set, error) {
	s := &nftables.Set{Table: b.t, Name: "__set%d", Anonymous: true, Constant: true, KeyType: kt, ID: b.nextID()}
	elems := make([]nftables.SetElement, len(keys))
	for i, k := range keys {
		elems[i] = nftables.SetElement{Key: k}
	}
	return s, b.c.AddSet(s, elems)
}

func lookup(s *nftables.Set) *expr.Lookup {
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}
}

// ipv4 is the dependency nft puts before an `ip` match in an inet table.
func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

func daddr(n uint32) *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: n}
}

// daddrIn is `ip daddr @set`.
func daddrIn(s *nftables.Set) []expr.Any {
	return append(ipv4(), daddr(4), lookup(s))
}

// daddrPrefix is `ip daddr p` as nft compiles it: a whole-byte prefix
// compares its bytes only, any other is masked.
func daddrPrefix(p netip.Prefix) []expr.Any {
	a := p.Masked().Addr().As4()
	bits := p.Bits()
	if bits > 0 && bits%8 == 0 {
		n := uint32(bits / 8)
		return append(ipv4(), daddr(n), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:n]})
	}
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-bits))
	if bits == 0 {
		mask = make([]byte, 4)
	}
	return append(ipv4(), daddr(4),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]})
}

func port(p uint16) []byte { return binaryutil.BigEndian.PutUint16(p) }

func dport() *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// l4Ports is `meta l4proto { tcp, udp } th dport first-end`.
func (b *nlBatch) l4Ports(first, end uint16) ([]expr.Any, error) {
	protos, err := b.anonSet(nftables.TypeInetProto, []byte{unix.IPPROTO_TCP}, []byte{unix.IPPROTO_UDP})
	if err != nil {
		return nil, err
	}
	x := []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, lookup(protos), dport()}
	if first == end {
		return append(x, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port(first)}), nil
	}
	return append(x,
		&expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: port(first)},
		&expr.Cmp{Op: expr.CmpOpLte, Register: 1, Data: port(end)}), nil
}

// counterReject is `counter log group G snaplen 64 reject with icmpx
// admin-prohibited`: the log sends the packet's headers to the Egress's
// reader for the audit line (nflog.go), and changes nothing of the
// verdict; with no reader bound to the group, the kernel drops the copy.
// Where the reader could not bind, the rules go without the log: a kernel
// without nfnetlink_log refuses a rule that logs to a group, and the
// policy must hold all the same.
func (b *nlBatch) counterReject() []expr.Any {
	reject := &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}
	if b.group == 0 {
		return []expr.Any{&expr.Counter{}, reject}
	}
	return []expr.Any{
		&expr.Counter{},
		&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_SNAPLEN, Group: b.group, Snaplen: logSnaplen},
		reject,
	}
}

// markRedirect is `ct mark set FilterMark counter redirect to :to`.
func markRedirect(to uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(FilterMark)}, // the kernel's ct mark is host order
		&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true},
		&expr.Counter{},
		&expr.Immediate{Register: 1, Data: port(to)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

var returns = &expr.Verdict{Kind: expr.VerdictReturn}

// ctNew is `ct state new`, a connection's packets until the reply's
// first: a refused flow's each (its conntrack entry is never confirmed),
// an allowed one's first, and its retries where nothing answers.
func ctNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// span is an interval of IPv4 addresses, both ends included.
type span struct{ lo, hi uint32 }

func toSpan(p netip.Prefix) span {
	a := p.Masked().Addr().As4()
	lo := binary.BigEndian.Uint32(a[:])
	return span{lo, lo | uint32(uint64(1)<<(32-p.Bits())-1)}
}

// mergeSpans sorts ps and joins those that overlap or touch, as nft's
// auto-merge does: the kernel refuses overlapping intervals in one set,
// and a policy may well list 10.0.0.0/8 and 10.1.0.0/16.
func mergeSpans(ps []netip.Prefix) []span {
	spans := make([]span, 0, len(ps))
	for _, p := range ps {
		spans = append(spans, toSpan(p))
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	var out []span
	for _, s := range spans {
		if n := len(out); n > 0 && (out[n-1].hi == math.MaxUint32 || s.lo <= out[n-1].hi+1) {
			out[n-1].hi = max(out[n-1].hi, s.hi)
			continue
		}
		out = append(out, s)
	}
	return out
}

// intervalElements are spans as an interval set holds them: each start,
// and the address after each end flagged as an interval end; an interval
// up to 255.255.255.255 has no end (nft sends the same).
func intervalElements(spans []span) []nftables.SetElement {
	var elems []nftables.SetElement
	for _, s := range spans {
		elems = append(elems, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, s.lo)})
		if s.hi != math.MaxUint32 {
			elems = append(elems, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, s.hi+1), IntervalEnd: true})
		}
	}
	return elems
}

// policy queues the transaction that puts p in force for ip (the
// objects are described at the top of sandboxes.go). withNat says whether
// to write the name-filter half (n_ and nat4) at all; f is nil where p
// has no domain rules, and the half is then removed.
func (b *nlBatch) policy(ip netip.Addr, p *policy.Policy, f NameFilter, withNat bool) error {
	x := objSuffix(ip)
	key := ip.AsSlice()
	var allowAll, denyAll []netip.Prefix
	var allowPorts, denyPorts []policy.Rule
	for _, r := range p.Allow {
		switch {
		case !r.Prefix.IsValid() || r.Prefix.Addr().Is6(): // refused by policy.Parse
		case r.AllPorts():
			allowAll = append(allowAll, r.Prefix)
		default:
			allowPorts = append(allowPorts, r)
		}
	}
	for _, r := range p.Deny {
		switch {
		case !r.Prefix.IsValid() || r.Prefix.Addr().Is6(): // all IPv6 is dropped
		case r.AllPorts():
			denyAll = append(denyAll, r.Prefix)
		default:
			denyPorts = append(denyPorts, r)
		}
	}
	allow, deny := b.addrSet("a_"+x), b.addrSet("d_"+x)
	for _, s := range []struct {
		set *nftables.Set
		ps  []netip.Prefix
	}{{allow, allowAll}, {deny, denyAll}} {
		if err := b.c.AddSet(s.set, nil); err != nil {
			return err
		}
		b.c.FlushSet(s.set)
		if len(s.ps) > 0 {
			if err := b.c.SetAddElements(s.set, intervalElements(mergeSpans(s.ps))); err != nil {
				return err
			}
		}
	}
	allowRules := func(c *nftables.Chain, v *expr.Verdict) error {
		b.rule(c, append(daddrIn(allow), v)...)
		for _, r := range allowPorts {
			l4, err := b.l4Ports(r.PortFirst, r.PortEnd)
			if err != nil {
				return err
			}
			b.rule(c, slices.Concat(daddrPrefix(r.Prefix), l4, []expr.Any{v})...)
		}
		return nil
	}
	// An allowed packet goes to c_, which counts new connections and
	// returns (a goto's return is p_'s): one rule more for an allowed
	// packet, and none for the others.
	cnt := b.c.AddChain(b.chain("c_" + x))
	b.c.FlushChain(cnt)
	b.rule(cnt, append(ctNew(), &expr.Counter{})...)
	pol := b.c.AddChain(b.chain("p_" + x))
	b.c.FlushChain(pol)
	if err := allowRules(pol, &expr.Verdict{Kind: expr.VerdictGoto, Chain: cnt.Name}); err != nil {
		return err
	}
	b.rule(pol, append(daddrIn(deny), b.counterReject()...)...)
	for _, r := range denyPorts {
		l4, err := b.l4Ports(r.PortFirst, r.PortEnd)
		if err != nil {
			return err
		}
		b.rule(pol, slices.Concat(daddrPrefix(r.Prefix), l4, b.counterReject())...)
	}
	if err := b.c.SetAddElements(b.vmap("pol4"), []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: pol.Name}}}); err != nil {
		return err
	}
	if !withNat {
		return nil
	}
	// nat4 and n_: made whether or not p has domains, so that a policy
	// that had some loses them in the same transaction.
	nat := b.c.AddChain(b.chain("n_" + x))
	b.c.FlushChain(nat)
	nat4 := b.vmap("nat4")
	if err := b.c.SetAddElements(nat4, []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: nat.Name}}}); err != nil {
		return err
	}
	if f == nil {
		if err := b.c.SetDeleteElements(nat4, []nftables.SetElement{{Key: key}}); err != nil {
			return err
		}
		b.c.DelChain(nat)
		return nil
	}
	if err := allowRules(nat, returns); err != nil {
		return err
	}
	dns, err := b.l4Ports(53, 53)
	if err != nil {
		return err
	}
	b.rule(nat, append(dns, markRedirect(f.DNSPort())...)...)
	web, err := b.anonSet(nftables.TypeInetService, port(80), port(443))
	if err != nil {
		return err
	}
	b.rule(nat, append([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		dport(), lookup(web),
	}, markRedirect(f.ProxyPort())...)...)
	return nil
}

// clear queues the removal of every object of ip's policy, whichever
// exist: each is added first (a no-op where it exists), so that the
// deletes cannot fail on a missing one.
func (b *nlBatch) clear(ip netip.Addr) error {
	x := objSuffix(ip)
	for _, m := range []struct{ vmap, chain string }{{"pol4", "p_" + x}, {"nat4", "n_" + x}} {
		c := b.c.AddChain(b.chain(m.chain))
		vmap := b.vmap(m.vmap)
		if err := b.c.SetAddElements(vmap, []nftables.SetElement{{Key: ip.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: c.Name}}}); err != nil {
			return err
		}
		if err := b.c.SetDeleteElements(vmap, []nftables.SetElement{{Key: ip.AsSlice()}}); err != nil {
			return err
		}
		b.c.FlushChain(c)
		b.c.DelChain(c)
	}
	c := b.c.AddChain(b.chain("c_" + x)) // after p_, which goes to it
	b.c.FlushChain(c)
	b.c.DelChain(c)
	for _, name := range []string{"a_" + x, "d_" + x} {
		s := b.addrSet(name)
		if err := b.c.AddSet(s, nil); err != nil {
			return err
		}
		b.c.DelSet(s)
	}
	return nil
}

// addressCounts are the kernel's counts of each policy's address rules,
// by sandbox address: the packets its chain's reject rules refused, and
// the new connections its allow rules let through (c_). It reads them
// over a socket of its own: a scrape must not wait for, or interleave
// with, a policy's batch.
func (e *Egress) addressCounts() (denied, allowed map[netip.Addr]uint64, err error) {
	c, err := nftables.New()
	if err != nil {
		return nil, nil, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, nil, fmt.Errorf("list the chains of %s: %w", e.table, err)
	}
	denied, allowed = map[netip.Addr]uint64{}, map[netip.Addr]uint64{}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != e.table || len(ch.Name) != 10 || (ch.Name[:2] != "p_" && ch.Name[:2] != "c_") {
			continue
		}
		b, err := hex.DecodeString(ch.Name[2:])
		if err != nil || len(b) != 4 {
			continue
		}
		ip := netip.AddrFrom4([4]byte(b))
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return nil, nil, fmt.Errorf("list chain %s of %s: %w", ch.Name, e.table, err)
		}
		for _, r := range rules {
			var n uint64
			reject := false
			for _, x := range r.Exprs {
				switch x := x.(type) {
				case *expr.Counter:
					n += x.Packets
				case *expr.Reject:
					reject = true
				}
			}
			switch {
			case ch.Name[0] == 'c':
				allowed[ip] += n
			case reject:
				denied[ip] += n
			}
		}
	}
	return denied, allowed, nil
}
