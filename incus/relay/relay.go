// Package relay owns the byte pipe between sandboxd and the sandboxes of an
// Incus cluster member. In cluster mode a sandbox's envd listens on the
// sandbox's own address (a routed NIC, a /32 of the sandbox subnet) which
// only its member host reaches; sandboxd, anywhere else, reaches it through
// the relay that runs on every member (`sandboxd relay`).
//
// The relay is nothing but an authenticated pipe: TLS 1.3 with pinned
// certificates on both sides (the member presents the cluster certificate,
// sandboxd a client certificate the relay pins), then one request line and
// one answer, then raw bytes both ways:
//
//	client: DIAL 10.135.0.7:49983\n
//	relay:  OK\n                           (or ERR <code> <detail>\n, then close)
//
// The target must be an IPv4 address inside the relay's allowed prefixes
// (the sandbox subnet), so a stolen client certificate opens the sandboxes
// of one member and nothing else of its network. Half-closes pass through:
// a client's CloseWrite reaches the target as a FIN, and the target's FIN
// reaches the client as TLS close_notify (io.EOF), each side still able to
// write. Server is the member's side, Dialer sandboxd's.
package relay

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// MaxRequestLine is the longest request line the relay reads, its newline
// included; "DIAL 255.255.255.255:65535\n" is 27 bytes.
const MaxRequestLine = 64

// maxAnswerLine bounds the answer a Dialer reads: an ERR line carries a
// dial error's text.
const maxAnswerLine = 512

// The codes of an ERR answer (RefusedError.Code).
const (
	// CodeBadRequest: the request line is malformed or too long.
	CodeBadRequest = "bad-request"
	// CodeForbidden: the target is outside the relay's allowed prefixes.
	CodeForbidden = "forbidden"
	// CodeRefused: the target answered with a reset (nothing listens on
	// that port: envd not up yet, or gone).
	CodeRefused = "refused"
	// CodeTimeout: the target did not answer in time (no such sandbox on
	// this member, or it is paused).
	CodeTimeout = "timeout"
	// CodeUnreachable: no route or host to the target.
	CodeUnreachable = "unreachable"
	// CodeError: any other failure to dial.
	CodeError = "error"
)

// ErrRefused matches (errors.Is) every RefusedError: the relay is up and
// answered, but would not or could not reach the target. Any other error
// of Dial means the relay itself was not reached or not trusted.
var ErrRefused = errors.New("relay refused the dial")

// RefusedError is an ERR answer of the relay.
type RefusedError struct {
	Target netip.AddrPort
	Code   string // CodeForbidden, CodeRefused, ...
	Detail string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("relay: dial %s: %s: %s", e.Target, e.Code, e.Detail)
}

// Is makes every RefusedError ErrRefused.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// requestLine is the client's request for target.
func requestLine(target netip.AddrPort) string {
	return "DIAL " + target.String() + "\n"
}

// parseRequest checks a request line (without its newline): DIAL, one
// space, an IPv4 address and a port 1–65535, nothing else.
func parseRequest(line string) (netip.AddrPort, error) {
	arg, ok := strings.CutPrefix(line, "DIAL ")
	if !ok {
		return netip.AddrPort{}, errors.New("want DIAL <ipv4>:<port>")
	}
	ap, err := netip.ParseAddrPort(arg)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("target: %w", err)
	}
	if !ap.Addr().Is4() { // Is4 is false for 4-in-6 and zoned addresses too
		return netip.AddrPort{}, fmt.Errorf("target %s: want IPv4", ap)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("target %s: want a port 1-65535", ap)
	}
	return ap, nil
}

// parseAnswer splits the relay's answer line (without its newline): nil
// for OK, a RefusedError for ERR.
func parseAnswer(target netip.AddrPort, line string) error {
	if line == "OK" {
		return nil
	}
	rest, ok := strings.CutPrefix(line, "ERR ")
	if !ok {
		return fmt.Errorf("relay: malformed answer %q", line)
	}
	code, detail, _ := strings.Cut(rest, " ")
	return &RefusedError{Target: target, Code: code, Detail: detail}
}

// errLine is the ERR line of code and detail, on one line whatever
// detail holds.
func errLine(code, detail string) string {
	detail = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, detail)
	if len(detail) > maxAnswerLine-len(code)-6 {
		detail = detail[:maxAnswerLine-len(code)-6]
	}
	return "ERR " + code + " " + detail + "\n"
}
