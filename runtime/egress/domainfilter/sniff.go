package domainfilter

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
)

// maxPeek bounds what is read (and kept for replay) before a decision: a
// ClientHello or a request head larger than this is refused.
const maxPeek = 16 << 10

var (
	// errNeedMore: the bytes so far are a valid prefix; read on.
	errNeedMore = errors.New("incomplete")
	// errMalformed: the bytes cannot be what they claim; fail closed.
	errMalformed = errors.New("malformed")
)

// Protocols named in logs.
const (
	protoTLS  = "tls"
	protoHTTP = "http"
	protoTCP  = "tcp"
)

// sniff tells what the first bytes of a connection are and the hostname
// they ask for. errNeedMore means read on; any other error, or an empty
// host, means no usable hostname.
func sniff(b []byte) (proto, host string, err error) {
	if len(b) == 0 {
		return protoTCP, "", errNeedMore
	}
	switch {
	case b[0] == recordHandshake:
		host, err = clientHelloServerName(b)
		return protoTLS, host, err
	case b[0] >= 'A' && b[0] <= 'Z':
		host, err = httpHost(b)
		return protoHTTP, host, err
	}
	return protoTCP, "", errMalformed
}

// canonicalHost lower-cases a hostname and drops one trailing dot; it
// returns "" for anything that is not a plausible DNS name, so that odd
// bytes never reach a policy (which might match them loosely) or a
// resolver.
func canonicalHost(h string) string {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return ""
	}
	var sb strings.Builder
	sb.Grow(len(h))
	label := 0
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		case c == '.':
			if label == 0 {
				return ""
			}
			label = -1
		default:
			return ""
		}
		label++
		if label > 63 {
			return ""
		}
		sb.WriteByte(c)
	}
	if label == 0 { // an empty last label: "a.b.." had two dots
		return ""
	}
	return sb.String()
}

const (
	recordHandshake     = 0x16
	handshakeClientHelo = 0x01
	extServerName       = 0x0000
	sniHostName         = 0x00
	maxRecordLen        = 1<<14 + 256 // plaintext limit, with some slack
)

// clientHelloServerName returns the server_name of the ClientHello that
// starts b, reassembled from as many handshake records as it spans. It
// returns "" with a nil error for a ClientHello without SNI.
func clientHelloServerName(b []byte) (string, error) {
	var hs []byte // the handshake message bytes gathered so far
	for {
		if len(b) < 5 {
			return "", errNeedMore
		}
		if b[0] != recordHandshake || b[1] != 3 {
			return "", errMalformed
		}
		n := int(b[3])<<8 | int(b[4])
		if n == 0 || n > maxRecordLen {
			return "", errMalformed
		}
		if len(b) < 5+n {
			// Use the partial record too: the handshake header inside
			// may already tell that the message is not a ClientHello.
			if err := checkHandshakeHeader(append(hs, b[5:]...)); err != nil {
				return "", err
			}
			return "", errNeedMore
		}
		hs = append(hs, b[5:5+n]...)
		b = b[5+n:]
		if err := checkHandshakeHeader(hs); err != nil {
			if err == errNeedMore {
				continue
			}
			return "", err
		}
		mlen := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
		if len(hs) < 4+mlen {
			continue
		}
		return parseClientHello(hs[4 : 4+mlen])
	}
}

// checkHandshakeHeader fails early on a handshake that is not a
// ClientHello or could never fit the peek budget.
func checkHandshakeHeader(hs []byte) error {
	if len(hs) >= 1 && hs[0] != handshakeClientHelo {
		return errMalformed
	}
	if len(hs) < 4 {
		return errNeedMore
	}
	mlen := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
	if mlen < 38 || mlen > maxPeek {
		return errMalformed
	}
	return nil
}

// reader is a bounds-checked cursor; every method reports failure
// rather than panicking on short input.
type reader struct{ b []byte }

func (r *reader) skip(n int) bool {
	if n < 0 || len(r.b) < n {
		return false
	}
	r.b = r.b[n:]
	return true
}

func (r *reader) u8() (int, bool) {
	if len(r.b) < 1 {
		return 0, false
	}
	v := int(r.b[0])
	r.b = r.b[1:]
	return v, true
}

func (r *reader) u16() (int, bool) {
	if len(r.b) < 2 {
		return 0, false
	}
	v := int(r.b[0])<<8 | int(r.b[1])
	r.b = r.b[2:]
	return v, true
}

// vec reads a vector whose length prefix is lenBytes (1 or 2) long.
func (r *reader) vec(lenBytes int) (reader, bool) {
	var n int
	var ok bool
	if lenBytes == 1 {
		n, ok = r.u8()
	} else {
		n, ok = r.u16()
	}
	if !ok || len(r.b) < n {
		return reader{}, false
	}
	v := reader{r.b[:n]}
	r.b = r.b[n:]
	return v, true
}

// parseClientHello reads the body of a ClientHello handshake message.
func parseClientHello(body []byte) (string, error) {
	r := reader{body}
	if !r.skip(2 + 32) { // legacy_version, random
		return "", errMalformed
	}
	sid, ok := r.vec(1)
	if !ok || len(sid.b) > 32 {
		return "", errMalformed
	}
	suites, ok := r.vec(2)
	if !ok || len(suites.b) < 2 || len(suites.b)%2 != 0 {
		return "", errMalformed
	}
	comp, ok := r.vec(1)
	if !ok || len(comp.b) < 1 {
		return "", errMalformed
	}
	if len(r.b) == 0 {
		return "", nil // no extensions at all: no SNI
	}
	exts, ok := r.vec(2)
	if !ok || len(r.b) != 0 {
		return "", errMalformed
	}
	var name string
	seen := false
	for len(exts.b) > 0 {
		typ, ok := exts.u16()
		if !ok {
			return "", errMalformed
		}
		data, ok := exts.vec(2)
		if !ok {
			return "", errMalformed
		}
		if typ != extServerName {
			continue
		}
		if seen {
			// Two SNIs: the server may pick either; so do not we.
			return "", errMalformed
		}
		seen = true
		n, err := parseServerName(data)
		if err != nil {
			return "", err
		}
		name = n
	}
	return name, nil
}

// parseServerName reads a server_name extension's body: exactly one
// host_name entry is accepted.
func parseServerName(data reader) (string, error) {
	list, ok := data.vec(2)
	if !ok || len(data.b) != 0 || len(list.b) == 0 {
		return "", errMalformed
	}
	var name string
	for len(list.b) > 0 {
		typ, ok := list.u8()
		if !ok {
			return "", errMalformed
		}
		v, ok := list.vec(2)
		if !ok {
			return "", errMalformed
		}
		if typ != sniHostName {
			continue
		}
		if name != "" {
			return "", errMalformed
		}
		name = canonicalHost(string(v.b))
		if name == "" {
			return "", errMalformed
		}
	}
	return name, nil
}

// httpHost returns the host of the HTTP/1.x request head starting b: the
// Host header, without port. A request that could be read two ways (two
// Host headers, folded lines, an absolute URI naming another host) gives
// an error: the upstream server might take the other reading.
func httpHost(b []byte) (string, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		// Check the request line as soon as it is there: a non-HTTP
		// protocol should not wait for the peek timeout.
		if i := bytes.Index(b, []byte("\r\n")); i >= 0 {
			if _, ok := requestTarget(b[:i]); !ok {
				return "", errMalformed
			}
		} else if !methodPrefix(b) {
			return "", errMalformed
		}
		return "", errNeedMore
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	target, ok := requestTarget([]byte(lines[0]))
	if !ok {
		return "", errMalformed
	}
	var host string
	seen := false
	for _, l := range lines[1:] {
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			return "", errMalformed
		}
		k, v, ok := strings.Cut(l, ":")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return "", errMalformed
		}
		if !strings.EqualFold(k, "host") {
			continue
		}
		if seen {
			return "", errMalformed
		}
		seen = true
		host = hostOfAuthority(strings.Trim(v, " \t"))
		if host == "" {
			return "", errMalformed
		}
	}
	if !seen {
		return "", nil
	}
	if strings.Contains(target, "://") {
		_, rest, _ := strings.Cut(target, "://")
		auth, _, _ := strings.Cut(rest, "/")
		if _, a, ok := strings.Cut(auth, "@"); ok {
			auth = a
		}
		if hostOfAuthority(auth) != host {
			return "", errMalformed
		}
	}
	return host, nil
}

// methodPrefix: could b be the start of "METHOD "?
func methodPrefix(b []byte) bool {
	for i, c := range b {
		if c == ' ' {
			return i > 0
		}
		if c < 'A' || c > 'Z' || i >= 20 {
			return false
		}
	}
	return true
}

// requestTarget checks an HTTP/1.x request line and returns its target.
func requestTarget(line []byte) (string, bool) {
	parts := strings.Split(string(line), " ")
	if len(parts) != 3 || !methodPrefix([]byte(parts[0]+" ")) || parts[1] == "" {
		return "", false
	}
	if parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0" {
		return "", false
	}
	return parts[1], true
}

// hostOfAuthority strips the port from host[:port] or [v6][:port] and
// canonicalizes the name; "" if it is none.
func hostOfAuthority(a string) string {
	if strings.HasPrefix(a, "[") {
		i := strings.IndexByte(a, ']')
		if i < 0 || !validPort(a[i+1:], true) {
			return ""
		}
		ip, err := netip.ParseAddr(a[1:i])
		if err != nil || !ip.Is6() {
			return ""
		}
		// An IP literal is not a name: no domain rule can match it,
		// but returning it keeps the log telling.
		return ip.String()
	}
	if i := strings.LastIndexByte(a, ':'); i >= 0 {
		if !validPort(a[i:], true) {
			return ""
		}
		a = a[:i]
	}
	return canonicalHost(a)
}

// validPort accepts "" (if empty is allowed) or ":digits".
func validPort(s string, emptyOK bool) bool {
	if s == "" {
		return emptyOK
	}
	if s[0] != ':' || len(s) == 1 || len(s) > 6 {
		return false
	}
	for _, c := range s[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
