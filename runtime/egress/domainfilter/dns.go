package domainfilter

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

const (
	upstreamTimeout = 2 * time.Second
	maxDNSMessage   = 65535
)

var errNoUpstream = errors.New("no upstream resolver answered")

func (f *Filter) serveDNSUDP() {
	defer f.wg.Done()
	buf := make([]byte, maxDNSMessage)
	for {
		n, from, err := f.dnsUDP.ReadFromUDPAddrPort(buf)
		if err != nil {
			if f.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			f.log.Warn("dns udp read", "err", err)
			continue
		}
		select {
		case f.udpSem <- struct{}{}:
		default:
			// Too many queries in flight: drop; the client retries.
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() { <-f.udpSem }()
			resp := f.answer(q, from.Addr(), "udp")
			if resp != nil {
				_, _ = f.dnsUDP.WriteToUDPAddrPort(resp, from)
			}
		}()
	}
}

func (f *Filter) serveDNSTCP() {
	defer f.wg.Done()
	var conns sync.Map // net.Conn → struct{}: closed at shutdown
	defer conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
	for {
		c, ok := f.accept(f.dnsTCP, "dns tcp accept")
		if !ok {
			return
		}
		if c == nil {
			continue
		}
		select {
		case f.tcpSem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		conns.Store(c, struct{}{})
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() { <-f.tcpSem }()
			defer conns.Delete(c)
			defer c.Close()
			f.serveDNSConn(c)
		}()
		// Close may have run between Accept and Store; the deferred
		// Range only covers connections stored before it runs.
		if f.ctx.Err() != nil {
			c.Close()
		}
	}
}

// serveDNSConn answers length-prefixed queries in turn until the client
// is idle for dnsIdleTimeout or goes.
func (f *Filter) serveDNSConn(c net.Conn) {
	src := addrOf(c.RemoteAddr())
	if _, _, ok := f.cfg.Sandboxes.Policy(src); !ok {
		f.log.Debug("dns: tcp connection from no sandbox", "src", src)
		return
	}
	var lb [2]byte
	buf := make([]byte, maxDNSMessage)
	for {
		_ = c.SetReadDeadline(time.Now().Add(dnsIdleTimeout))
		if _, err := io.ReadFull(c, lb[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lb[:]))
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return
		}
		resp := f.answer(buf[:n], src, "tcp")
		if resp == nil {
			return
		}
		out := make([]byte, 2+len(resp))
		binary.BigEndian.PutUint16(out, uint16(len(resp)))
		copy(out[2:], resp)
		_ = c.SetWriteDeadline(time.Now().Add(dnsIdleTimeout))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// answer returns the response to query q from src over network ("udp"
// or "tcp"), or nil to send nothing.
func (f *Filter) answer(q []byte, src netip.Addr, network string) []byte {
	id, p, ok := f.cfg.Sandboxes.Policy(src.Unmap())
	if !ok {
		f.log.Debug("dns: query from no sandbox", "src", src)
		return nil
	}
	var parser dnsmessage.Parser
	h, err := parser.Start(q)
	if err != nil || h.Response {
		return nil // not even a header, or an answer: nothing to reply to
	}
	if h.OpCode != 0 {
		return reply(h, nil, dnsmessage.RCodeNotImplemented)
	}
	qd := binary.BigEndian.Uint16(q[4:6])
	if qd != 1 {
		return reply(h, nil, dnsmessage.RCodeFormatError)
	}
	question, err := parser.Question()
	if err != nil {
		return reply(h, nil, dnsmessage.RCodeFormatError)
	}
	name, ok := questionName(q)
	if !ok {
		// A name that is not plain letters, digits, '-' and '_' (a
		// dot inside a label, say) could match a rule as text and be
		// another name on the wire.
		odd := strconv.Quote(question.Name.String())
		f.decided(id, kindDNS, false, odd, odd, "dns", "odd query name")
		return reply(h, &question, dnsmessage.RCodeNameError)
	}
	if name == "" || !p.AllowsName(name) {
		f.decided(id, kindDNS, false, name, name, "dns", "no domain rule matches the name")
		return reply(h, &question, dnsmessage.RCodeNameError)
	}
	f.decided(id, kindDNS, true, name, name, "dns", "")
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	resp, err := f.exchange(ctx, q, network)
	if err != nil {
		f.log.Debug("dns: upstream", "sandbox_id", id, "name", name, "err", err)
		return reply(h, &question, dnsmessage.RCodeServerFailure)
	}
	return resp
}

// questionName reads the question's name off the wire (offset 12), so
// that label boundaries are seen: lower-case, no trailing dot.
func questionName(q []byte) (string, bool) {
	var sb strings.Builder
	for off := 12; ; {
		if off >= len(q) {
			return "", false
		}
		l := int(q[off])
		off++
		if l == 0 {
			return sb.String(), true
		}
		if l > 63 || off+l > len(q) {
			return "", false // compression pointers have no place here
		}
		if sb.Len() > 0 {
			sb.WriteByte('.')
		}
		for _, c := range q[off : off+l] {
			switch {
			case c >= 'A' && c <= 'Z':
				c += 'a' - 'A'
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			default:
				return "", false
			}
			sb.WriteByte(c)
		}
		off += l
		if sb.Len() > 253 {
			return "", false
		}
	}
}

// reply builds a local answer to a query with header h: the question
// echoed, no records.
func reply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID:                 h.ID,
		Response:           true,
		OpCode:             h.OpCode,
		RecursionDesired:   h.RecursionDesired,
		RecursionAvailable: true,
		RCode:              rcode,
	})
	if q != nil {
		if b.StartQuestions() != nil || b.Question(*q) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// exchange sends q to the resolvers in turn until one answers.
func (f *Filter) exchange(ctx context.Context, q []byte, network string) ([]byte, error) {
	if len(f.cfg.Resolvers) == 0 {
		return nil, errNoUpstream
	}
	var errs []error
	for _, r := range f.cfg.Resolvers {
		resp, err := exchangeOne(ctx, r, q, network)
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%w: %w", errNoUpstream, errors.Join(errs...))
}

func exchangeOne(ctx context.Context, r netip.AddrPort, q []byte, network string) ([]byte, error) {
	if len(q) < 2 {
		return nil, errMalformed
	}
	ctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, network, r.String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// Let cancellation (Close) interrupt the reads below, too.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if network == "tcp" {
		out := make([]byte, 2+len(q))
		binary.BigEndian.PutUint16(out, uint16(len(q)))
		copy(out[2:], q)
		if _, err := c.Write(out); err != nil {
			return nil, err
		}
		var lb [2]byte
		if _, err := io.ReadFull(c, lb[:]); err != nil {
			return nil, err
		}
		resp := make([]byte, binary.BigEndian.Uint16(lb[:]))
		if _, err := io.ReadFull(c, resp); err != nil {
			return nil, err
		}
		if len(resp) < 12 || resp[0] != q[0] || resp[1] != q[1] {
			return nil, fmt.Errorf("%s: answer for another query", r)
		}
		return resp, nil
	}
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, maxDNSMessage)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		// A stray datagram is no answer: wait on for ours.
		if n >= 12 && buf[0] == q[0] && buf[1] == q[1] && buf[2]&0x80 != 0 {
			return append([]byte(nil), buf[:n]...), nil
		}
	}
}

// lookupA resolves host to its IPv4 addresses with the resolvers
// (sandboxes have no IPv6). It is a stub resolver of its own rather than
// net.Resolver: no /etc/hosts, no search domains, exactly the resolvers
// configured, and the CNAME chain followed within one answer.
func (f *Filter) lookupA(ctx context.Context, host string) ([]netip.Addr, error) {
	name, err := dnsmessage.NewName(host + ".")
	if err != nil {
		return nil, err
	}
	id := uint16(rand.Uint32()) // with the socket's random port, against spoofed answers
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		return nil, err
	}
	q, err := b.Finish()
	if err != nil {
		return nil, err
	}
	resp, err := f.exchange(ctx, q, "udp")
	if err == nil && len(resp) > 2 && resp[2]&0x02 != 0 { // truncated
		resp, err = f.exchange(ctx, q, "tcp")
	}
	if err != nil {
		return nil, err
	}
	return parseA(resp, name)
}

// parseA returns the A records for name in an answer, following CNAMEs.
func parseA(resp []byte, name dnsmessage.Name) ([]netip.Addr, error) {
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		return nil, err
	}
	if h.RCode != dnsmessage.RCodeSuccess {
		return nil, fmt.Errorf("resolver says %v", h.RCode)
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, err
	}
	want := strings.ToLower(name.String())
	aliases := map[string]string{}
	a := map[string][]netip.Addr{}
	for {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return nil, err
		}
		owner := strings.ToLower(rh.Name.String())
		switch rh.Type {
		case dnsmessage.TypeA:
			r, err := p.AResource()
			if err != nil {
				return nil, err
			}
			a[owner] = append(a[owner], netip.AddrFrom4(r.A))
		case dnsmessage.TypeCNAME:
			r, err := p.CNAMEResource()
			if err != nil {
				return nil, err
			}
			aliases[owner] = strings.ToLower(r.CNAME.String())
		default:
			if err := p.SkipAnswer(); err != nil {
				return nil, err
			}
		}
	}
	for range 16 {
		if addrs := a[want]; len(addrs) > 0 {
			return addrs, nil
		}
		next, ok := aliases[want]
		if !ok {
			break
		}
		want = next
	}
	return nil, errors.New("no A record")
}
