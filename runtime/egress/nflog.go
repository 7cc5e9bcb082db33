package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime/egress/internal/audit"
	"github.com/sandboxd/sandboxd/runtime/egress/policy"
)

// The address rules' refusals reach user space through the kernel's
// packet log (nfnetlink_log, NFLOG): each reject rule logs the packet's
// headers to a netlink group first (counterReject), and the Egress reads
// the group for the audit lines and the connection counts. The log is a
// copy: a missing or slow reader loses lines, never changes a verdict.

// logSnaplen is what the kernel copies of a refused packet: an IPv4
// header with the most options (60 bytes) and the ports after it.
const logSnaplen = 64

// nfnetlink_log's protocol (linux/netfilter/nfnetlink_log.h), which
// x/sys does not name.
const (
	nfnlSubsysULOG   = 4
	nfulnlMsgPacket  = 0
	nfulnlMsgConfig  = 1
	nfulaCfgCmd      = 1
	nfulaCfgMode     = 2
	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2
	nfulaPayload     = 9
)

// Flows refused within flowTTL of their last packet are one connection
// attempt: a TCP connect the reject does not end (its ICMP lost or
// ignored) retries its SYN for up to 63 s with the kernel's defaults, and
// conntrack cannot tell: a refused packet's conntrack entry is never
// confirmed, so each retry is "new" to ct state. maxFlows bounds the
// memory; past it, a retry may count again.
const (
	flowTTL  = 2 * time.Minute
	maxFlows = 16384
)

// logGroup is the NFLOG group e's reject rules log to. One process reads
// a group (the kernel refuses a second bind), so each table has its own,
// derived from its name: two sandboxd on one host (two subnets, two
// tables) read their own sandboxes' refusals, and a restarted sandboxd
// binds the group its surviving rules log to. Groups below 1024 are left
// to ulogd and hand-written rules, whose configurations use small numbers.
func (e *Egress) logGroup() uint16 {
	h := fnv.New32a()
	h.Write([]byte(e.table))
	return uint16(1024 + h.Sum32()%(1<<16-1024))
}

// refuses reports whether p has rules the kernel rejects with, which log.
func refuses(p *policy.Policy) bool {
	for _, r := range p.Deny {
		if r.Prefix.IsValid() && r.Prefix.Addr().Is4() {
			return true
		}
	}
	return false
}

// auditReader reads e's NFLOG group until Close.
type auditReader struct {
	c       *netlink.Conn
	done    chan struct{}
	closing atomic.Bool
	read    atomic.Uint64 // refused packets read, for tests to wait on
	// Owned by the reading goroutine.
	limit audit.Limiter
	flows map[flowKey]time.Time
}

type flowKey struct {
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16
}

// startAudit starts the reader, once; e.mu is held. Enforcement does not
// depend on it: where the group cannot be bound (another process reads
// it, or the kernel has no nfnetlink_log), the refusals go on unlogged.
func (e *Egress) startAudit() {
	if e.auditTried {
		return
	}
	e.auditTried = true
	group := e.logGroup()
	c, early, err := bindNFLOG(group)
	if err != nil {
		e.log.Warn("egress: no audit lines or connection counts for the address rules' refusals", "nflog_group", group, "err", err)
		return
	}
	r := &auditReader{c: c, done: make(chan struct{}), flows: map[flowKey]time.Time{}}
	e.audit = r
	go e.readAudit(r, early)
}

// stopAudit ends the reader; e.mu is not held (the reader takes it).
func stopAudit(r *auditReader) {
	if r == nil {
		return
	}
	r.closing.Store(true)
	_ = r.c.Close() // ends the Receive in readAudit
	<-r.done
}

// bindNFLOG binds group to a new socket, copying logSnaplen bytes of
// each packet. Packets logged before the kernel's acknowledgement are
// returned for the reader.
func bindNFLOG(group uint16) (*netlink.Conn, []netlink.Message, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("netlink: %w", err)
	}
	// A burst beyond the socket's buffer loses lines, silently: the
	// reader must not stop for it.
	_ = c.SetOption(netlink.NoENOBUFS, true)
	_ = c.SetReadBuffer(1 << 20)
	mode := binary.BigEndian.AppendUint32(nil, logSnaplen)
	mode = append(mode, nfulnlCopyPacket, 0)
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}},
		{Type: nfulaCfgMode, Data: mode},
	})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	req, err := c.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(nfgenmsg(group), attrs...),
	})
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("bind NFLOG group %d: %w", group, err)
	}
	var early []netlink.Message
	for {
		msgs, err := c.Receive()
		if err != nil {
			c.Close()
			return nil, nil, fmt.Errorf("bind NFLOG group %d: %w", group, err)
		}
		for _, m := range msgs {
			if m.Header.Type == netlink.Error && m.Header.Sequence == req.Header.Sequence {
				return c, early, nil
			}
			early = append(early, m)
		}
	}
}

// nfgenmsg is nfnetlink's header: family, version, resource id (the
// group) in network order.
func nfgenmsg(group uint16) []byte {
	return []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, byte(group >> 8), byte(group)}
}

func (e *Egress) readAudit(r *auditReader, early []netlink.Message) {
	defer close(r.done)
	e.logged(r, early)
	for {
		msgs, err := r.c.Receive()
		switch {
		case err == nil:
		case r.closing.Load():
			return
		case errors.Is(err, unix.ENOBUFS):
			continue
		default:
			e.mu.Lock()
			log := e.log
			e.mu.Unlock()
			log.Warn("egress: the address rules' packet log stopped", "err", err)
			return
		}
		e.logged(r, msgs)
	}
}

func (e *Egress) logged(r *auditReader, msgs []netlink.Message) {
	now := time.Now()
	for _, m := range msgs {
		if m.Header.Type != netlink.HeaderType(nfnlSubsysULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			continue
		}
		for ad.Next() {
			if ad.Type() != nfulaPayload {
				continue
			}
			if k, ok := parseIPv4(ad.Bytes()); ok {
				e.refused(r, now, k)
			}
			r.read.Add(1)
		}
	}
}

// parseIPv4 reads the addresses, protocol and ports of an IPv4 packet's
// headers; a fragment after the first has no ports.
func parseIPv4(p []byte) (flowKey, bool) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return flowKey{}, false
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 || len(p) < ihl {
		return flowKey{}, false
	}
	k := flowKey{src: netip.AddrFrom4([4]byte(p[12:16])), dst: netip.AddrFrom4([4]byte(p[16:20])), proto: p[9]}
	first := binary.BigEndian.Uint16(p[6:8])&0x1fff == 0
	switch k.proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_UDPLITE, unix.IPPROTO_SCTP, unix.IPPROTO_DCCP:
		if first && len(p) >= ihl+4 {
			k.sport, k.dport = binary.BigEndian.Uint16(p[ihl:]), binary.BigEndian.Uint16(p[ihl+2:])
		}
	}
	return k, true
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// refused counts a refused packet's connection, if it starts one, and
// writes its audit line if the limiter allows.
func (e *Egress) refused(r *auditReader, now time.Time, k flowKey) {
	e.mu.Lock()
	sp, ok := e.policies[k.src]
	if !ok {
		e.mu.Unlock()
		return // cleared meanwhile, or an earlier process's rules
	}
	if r.newFlow(now, k) {
		e.deniedConns[sp.id]++
	}
	log := e.log
	e.mu.Unlock()
	dst := k.dst.String()
	if k.sport != 0 || k.dport != 0 {
		dst = netip.AddrPortFrom(k.dst, k.dport).String()
	}
	proto := protoName(k.proto)
	if r.limit.Allow(now, sp.id+" "+dst+" "+proto) {
		audit.Denied(log, sp.id, dst, "", proto, "address rule")
	}
}

// newFlow reports whether k starts a connection attempt: no packet of
// its flow was refused within flowTTL.
func (r *auditReader) newFlow(now time.Time, k flowKey) bool {
	t, seen := r.flows[k]
	if seen && now.Sub(t) < flowTTL {
		r.flows[k] = now
		return false
	}
	if len(r.flows) >= maxFlows {
		for f, t := range r.flows {
			if now.Sub(t) >= flowTTL {
				delete(r.flows, f)
			}
		}
		if len(r.flows) >= maxFlows {
			return true
		}
	}
	r.flows[k] = now
	return true
}
