// Package fakeinet holds the servers of the test suites' stand-in for the
// internet (runtime/egress/egresstest in Go tests, compat-tests/fakeinet
// for the SDK suites): a DNS server that knows a few names, and HTTP and
// TLS servers that say who asked and for which host. Nothing here sends a
// packet anywhere but to the resolvers a caller names.
package fakeinet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Reply starts every answer of Handler: then the client's address as the
// server saw it, and the host it asked for.
const Reply = "from-inet "

// Handler answers Reply, the client's address and " host=" and the Host
// it asked for; GET /bytes/N answers N bytes (a download to time).
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/bytes/"), 10, 64); err == nil && strings.HasPrefix(r.URL.Path, "/bytes/") && n >= 0 {
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
			chunk := make([]byte, 256<<10)
			for n > 0 {
				m := min(n, int64(len(chunk)))
				if _, err := w.Write(chunk[:m]); err != nil {
					return
				}
				n -= m
			}
			return
		}
		fmt.Fprintf(w, "%s%s host=%s", Reply, r.RemoteAddr, r.Host)
	})
}

// TLSConfig is a server configuration with a fresh self-signed certificate
// for names (clients skip verification, or trust Cert).
func TLSConfig(names ...string) (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "fakeinet"},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, nil
}

// DNS answers A questions for Names (lower case, no trailing dot) and
// forwards the rest to Upstream, or answers NXDOMAIN without one.
type DNS struct {
	Names    map[string]netip.Addr
	Upstream []netip.AddrPort
}

// ServeUDP answers queries on pc until it is closed.
func (d *DNS) ServeUDP(pc net.PacketConn) {
	buf := make([]byte, 4096)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if out := d.answer(buf[:n], "udp"); out != nil {
			_, _ = pc.WriteTo(out, from)
		}
	}
}

// ServeTCP answers length-prefixed queries on ln's connections until ln
// is closed.
func (d *DNS) ServeTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			for {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				out := d.answer(q, "tcp")
				if out == nil {
					return
				}
				if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...)); err != nil {
					return
				}
			}
		}()
	}
}

func (d *DNS) answer(q []byte, network string) []byte {
	var m dnsmessage.Message
	if m.Unpack(q) != nil || len(m.Questions) != 1 {
		return nil
	}
	qn := m.Questions[0]
	name := strings.ToLower(strings.TrimSuffix(qn.Name.String(), "."))
	addr, known := d.Names[name]
	if !known && len(d.Upstream) > 0 {
		if out, err := forward(q, network, d.Upstream); err == nil {
			return out
		}
	}
	m.Header.Response, m.Header.RecursionAvailable = true, true
	m.Answers = nil
	switch {
	case !known:
		m.Header.RCode = dnsmessage.RCodeNameError
	case qn.Type == dnsmessage.TypeA && addr.Is4():
		m.Answers = []dnsmessage.Resource{{
			Header: dnsmessage.ResourceHeader{Name: qn.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
			Body:   &dnsmessage.AResource{A: addr.As4()},
		}}
	}
	out, err := m.Pack()
	if err != nil {
		return nil
	}
	return out
}

func forward(q []byte, network string, upstream []netip.AddrPort) ([]byte, error) {
	var last error
	for _, u := range upstream {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		out, err := exchange(ctx, q, network, u)
		cancel()
		if err == nil {
			return out, nil
		}
		last = err
	}
	return nil, last
}

func exchange(ctx context.Context, q []byte, network string, u netip.AddrPort) ([]byte, error) {
	var dl net.Dialer
	c, err := dl.DialContext(ctx, network, u.String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	if network == "udp" {
		if _, err := c.Write(q); err != nil {
			return nil, err
		}
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		return buf[:n], err
	}
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		return nil, err
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, err
	}
	out := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, out); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("empty answer")
	}
	return out, nil
}
