// Package envdapi is envd's wire contract, the one package of envd that the
// control plane imports: the port and version envd serves, the headers it
// reads, the body of POST /init, the signatures of pre-signed /files URLs,
// and the client side of its CONNECT tunnel. The Connect RPC services are
// generated under it from envd/api/spec (process, filesystem and their
// *connect packages; `make generate`). envd itself lives in package envd and
// envd/internal.
//
// # Tunnel
//
// sandboxd opens a connection to envd (its unix socket or TCP port) and
// sends an HTTP/1.1 CONNECT request whose authority is the target:
//
//	CONNECT 127.0.0.1:8080 HTTP/1.1
//	Host: 127.0.0.1:8080
//	X-Access-Token: <token>            (only when envd has one)
//
// envd's outer middleware checks X-Access-Token like on any other route
// (401 JSON when wrong). envd then answers:
//
//   - 400 {"code":400,"message":...} for a malformed authority or a port
//     outside 1-65535 (decimal, no sign, no leading zeros);
//   - 403 for any host other than 127.0.0.1, ::1 (written [::1]) or localhost
//     (which is dialled as 127.0.0.1, then ::1; it is never resolved);
//   - 502 {"code":502,"message":"127.0.0.1:8080: port is not open"} when
//     nothing accepts the connection;
//   - "HTTP/1.1 200 OK" and an empty line, after which the connection carries
//     the target's bytes both ways, unframed. Bytes the client sent right
//     after its request (before reading the 200) are forwarded too.
//
// Half-close is preserved: when one side shuts down its write half (EOF), the
// other side's write half is shut down (CloseWrite) and the opposite direction
// keeps flowing, so request/response protocols that signal the end of a
// request with EOF work, as do HTTP keep-alive and websockets. When both
// directions have ended, or either fails, both connections are closed and
// the handler returns; no goroutine outlives it.
//
// Over HTTP/2 (h2c or TLS), CONNECT is served as a stream instead of a
// hijacked connection: the request body is the client-to-target direction
// and the response body the other. There the client's END_STREAM is passed
// on as a half-close, but the target's EOF ends the whole stream.
//
// Dial is the client side.
package envdapi

import (
	"encoding/base64"
	"net/http"
)

// Port is the TCP port envd serves on inside every sandbox, in E2B's
// addressing (<port>-<sandbox id>.<domain>).
const Port = 49983

// Version is the envd protocol version envd reports. E2B's SDKs gate
// features on it (wire doc §4); 0.6.13 turns all of them on, and envd
// implements every one of them.
const Version = "0.6.13"

// AccessTokenHeader carries the access token on envd requests once /init has
// set one.
const AccessTokenHeader = "X-Access-Token"

// SetAuth sets the headers E2B's SDKs send envd: the access token, when not
// empty, and the user an RPC runs as, as Basic auth without a password.
func SetAuth(h http.Header, accessToken, user string) {
	if accessToken != "" {
		h.Set(AccessTokenHeader, accessToken)
	}
	if user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

// InitRequest is the body of POST /init, which the control plane sends once
// a sandbox is up (and again when a warm sandbox is claimed). Field names are
// E2B's; fields E2B's orchestrator uses for Firecracker (volume mounts,
// hyperloop, CA bundle) are accepted and ignored by envd.
type InitRequest struct {
	EnvVars     map[string]string `json:"envVars,omitempty"`
	AccessToken *string           `json:"accessToken,omitempty"`
	// Timestamp is when the control plane sent the body (RFC 3339).
	Timestamp      string `json:"timestamp,omitempty"`
	DefaultUser    string `json:"defaultUser,omitempty"`
	DefaultWorkdir string `json:"defaultWorkdir,omitempty"`
}
