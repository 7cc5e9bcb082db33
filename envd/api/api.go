// Package envdapi is envd's wire contract, the one package of envd that the
// control plane imports: the port and version envd serves, the headers it
// reads, the body of POST /init, the signatures of pre-signed /files URLs,
// and the client side of its CONNECT tunnel. The Connect RPC services are
// generated under it from envd/api/spec (process, filesystem and their
// *connect packages; `make generate`). envd itself lives in package envd and
// envd/internal.
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
