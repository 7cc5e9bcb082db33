package envdconn

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"

	"connectrpc.com/connect"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/envd/api/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/envd/api/process/processconnect"
)

// baseURL is the URL of envd on a connection from a DialFunc: the host is
// never resolved, the dial decides where requests go.
const baseURL = "http://envd"

// Client is the control plane's client of one sandbox's envd, as one user,
// for calls that come in numbers (an exec's RPCs, a file transfer): its
// Connect services and its /files. Its connections come from a DialFunc (the
// backend's private channel) and are kept for the Client's life; Close drops
// them. A single control request (/init, /health) needs no Client: Ask.
type Client struct {
	accessToken, user string
	tr                *http.Transport
	hc                *http.Client
}

// NewClient returns a Client that reaches envd through dial, sending
// accessToken (when not empty) and acting as user (envd's default when
// empty).
func NewClient(dial DialFunc, accessToken, user string) *Client {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost: 4,
		DisableCompression:  true, // /files streams; gzip would buffer and cost CPU on both ends
	}
	return &Client{accessToken: accessToken, user: user, tr: tr, hc: &http.Client{Transport: tr}}
}

// Close drops the idle connections; a request still running keeps its own
// until it ends.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// Auth sets envd's headers on an RPC's request: the access token and the
// user (envdapi.SetAuth).
func (c *Client) Auth(h http.Header) { envdapi.SetAuth(h, c.accessToken, c.user) }

// Process is envd's process service. Its requests need Auth.
func (c *Client) Process() processconnect.ProcessClient {
	return processconnect.NewProcessClient(c.hc, baseURL, connect.WithProtoJSON())
}

// Filesystem is envd's filesystem service. Its requests need Auth.
func (c *Client) Filesystem() filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(c.hc, baseURL, connect.WithProtoJSON())
}

// Files sends one request to envd's /files for path: GET downloads it, POST
// uploads body (size bytes, -1 when unknown) to it. The caller closes the
// response's body, whatever its status.
func (c *Client) Files(ctx context.Context, method, path string, body io.Reader, size int64) (*http.Response, error) {
	q := url.Values{"path": {path}}
	if c.user != "" {
		// /files takes the user from ?username, not from Basic auth.
		q.Set("username", c.user)
	}
	req, err := http.NewRequestWithContext(ctx, method, baseURL+"/files?"+q.Encode(), body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.ContentLength = size
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	envdapi.SetAuth(req.Header, c.accessToken, "")
	return c.hc.Do(req)
}
