package proxy

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

// Headers E2B's SDKs put on every envd request when E2B_SANDBOX_URL points
// all sandboxes at one origin.
const (
	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"
)

// EnvdPort is the port envd serves on inside a sandbox, in E2B's addressing.
const EnvdPort = envdapi.Port

var errBadRoute = errors.New("bad sandbox route")

// dataPlaneTarget says which sandbox and port a request is for, and whether
// it is a data-plane request at all. Host routing (`<port>-<id>.<domain>`)
// wins; otherwise the routing headers decide, and then both are required.
func dataPlaneTarget(r *http.Request, domain string) (id string, port int, ok bool, err error) {
	if domain != "" {
		if id, port, ok := parseSandboxHost(r.Host, domain); ok {
			return id, port, true, nil
		}
	}
	hid, hport := r.Header.Get(headerSandboxID), r.Header.Get(headerSandboxPort)
	if hid == "" && hport == "" {
		return "", 0, false, nil
	}
	if hid == "" || hport == "" {
		return "", 0, true, errors.New("both E2b-Sandbox-Id and E2b-Sandbox-Port are required")
	}
	port, perr := parsePort(hport)
	if perr != nil || !validSandboxID(hid) {
		return "", 0, true, errBadRoute
	}
	return hid, port, true, nil
}

// parseSandboxHost parses `<port>-<id>.<domain>[:listenport]`. The domain
// may carry a port too (`--domain HOST:PORT`, needed whenever the listener
// is not on 443 because the SDKs build sandbox URLs from it); ports are
// compared on neither side, since the listener that got the request already
// chose the port.
func parseSandboxHost(host, domain string) (id string, port int, ok bool) {
	label, ok := strings.CutSuffix(hostname(host), "."+hostname(domain))
	if !ok || strings.Contains(label, ".") {
		return "", 0, false
	}
	p, id, ok := strings.Cut(label, "-")
	if !ok || !validSandboxID(id) {
		return "", 0, false
	}
	port, err := parsePort(p)
	if err != nil {
		return "", 0, false
	}
	return id, port, true
}

// hostname lowercases host and drops its port and trailing dot.
func hostname(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errBadRoute
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, errBadRoute
	}
	return n, nil
}

// validSandboxID: E2B's ids are lowercase alphanumerics, no dashes (a dash
// separates the port in host routing).
func validSandboxID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
