package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/sandboxd/sandboxd/internal/certpin"
)

// ClientTLS is the TLS configuration of a Dialer: the client certificate
// the relays pin (clientCertPEM, clientKeyPEM), the relays' certificate
// pinned (serverCertPEM: the Incus cluster certificate, the same on every
// member), TLS 1.3, and a session cache, so that a new connection to a
// relay it has talked to resumes the session and skips the certificates'
// signatures.
func ClientTLS(clientCertPEM, clientKeyPEM, serverCertPEM []byte) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(clientCertPEM, clientKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("relay: client certificate: %w", err)
	}
	verify, err := certpin.Verifier(serverCertPEM)
	if err != nil {
		return nil, fmt.Errorf("relay: server certificate: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// The pin replaces the chain and name checks: a resumed session
		// skips it, but only a server that passed it holds the ticket's
		// secret. Without ServerName the cache is keyed by the relay's
		// address.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, chains [][]*x509.Certificate) error {
			if err := verify(raw, chains); err != nil {
				return fmt.Errorf("relay: server %w", err)
			}
			return nil
		},
		ClientSessionCache: tls.NewLRUClientSessionCache(256),
	}, nil
}

// Dialer connects to sandboxes through relays.
type Dialer struct {
	// TLS is ClientTLS's configuration (or one like it).
	TLS *tls.Config
	// Timeout bounds a Dial whose ctx has no earlier deadline; 0: 10 s.
	Timeout time.Duration
}

// Dial connects to target through the relay at relayAddr (host:port) and
// returns the connection, a *tls.Conn ready for target's bytes: CloseWrite
// half-closes towards the target. A *RefusedError (errors.Is ErrRefused)
// means the relay answered but did not reach the target; any other error,
// that the relay was not reached or not trusted, or ctx ended.
func (d *Dialer) Dial(ctx context.Context, relayAddr string, target netip.AddrPort) (net.Conn, error) {
	if d.TLS == nil {
		return nil, errors.New("relay: Dialer without TLS configuration")
	}
	if !target.Addr().Is4() || target.Port() == 0 {
		return nil, fmt.Errorf("relay: target %s: want IPv4 and a port", target)
	}
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var nd net.Dialer
	raw, err := nd.DialContext(ctx, "tcp", relayAddr)
	if err != nil {
		return nil, fmt.Errorf("relay %s: %w", relayAddr, err)
	}
	// One deadline for the handshake, the request and the answer: ctx's,
	// set when ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (net.Conn, error) {
		stop()
		raw.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("relay %s: dial %s: %w", relayAddr, target, ctx.Err())
		}
		return nil, fmt.Errorf("relay %s: dial %s: %w", relayAddr, target, err)
	}
	tc := tls.Client(raw, d.TLS)
	if err := tc.HandshakeContext(ctx); err != nil {
		return fail(err)
	}
	if _, err := io.WriteString(tc, requestLine(target)); err != nil {
		return fail(err)
	}
	// A byte at a time, so that the target's first bytes, which may
	// follow OK at once, stay in the connection. (TLS 1.3 servers reject
	// a client certificate only after the client's handshake is done:
	// this read is where an unpinned client learns it.)
	var buf [maxAnswerLine]byte
	n := 0
	for ; ; n++ {
		if n == len(buf) {
			return fail(errors.New("answer line too long"))
		}
		if _, err := io.ReadFull(tc, buf[n:n+1]); err != nil {
			return fail(fmt.Errorf("read answer: %w", err))
		}
		if buf[n] == '\n' {
			break
		}
	}
	if !stop() {
		return fail(ctx.Err()) // the deadline is set: the conn is spent
	}
	if err := parseAnswer(target, string(buf[:n])); err != nil {
		raw.Close()
		return nil, err
	}
	return tc, nil
}
