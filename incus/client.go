package incus

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

// DefaultSocket is where a Debian-packaged incusd listens.
const DefaultSocket = "/var/lib/incus/unix.socket"

// Client is a small client of the Incus REST API (/1.0), over the daemon's
// unix socket or over HTTPS with a client certificate. It covers what the
// backend needs: the server, instances and their state, operations, images
// and storage pools. It is safe for concurrent use.
type Client struct {
	hc   *http.Client
	base string // scheme://host, no trailing slash
	// Project, when set, is sent as ?project= on every call.
	Project string

	// endpoints are other addresses of the same server (a cluster's
	// members, SetEndpoints); cur indexes the one in use, base when
	// there are none.
	epMu      sync.Mutex
	endpoints []string
	cur       int
}

// SetEndpoints gives the client every address of the server (a cluster's
// members' https://host:port, which serve the same certificate): when the
// one in use fails to answer, the next request goes to the next, and a GET
// is retried there once. Other requests are not retried: a create whose
// answer was lost may have happened.
func (c *Client) SetEndpoints(urls []string) {
	c.epMu.Lock()
	defer c.epMu.Unlock()
	cur := c.endpointLocked()
	c.endpoints = nil
	for _, u := range urls {
		if p, err := url.Parse(u); err == nil && p.Scheme == "https" && p.Host != "" {
			c.endpoints = append(c.endpoints, "https://"+p.Host)
		}
	}
	c.cur = max(0, slices.Index(c.endpoints, cur)) // stay on the one in use
}

func (c *Client) endpoint() string {
	c.epMu.Lock()
	defer c.epMu.Unlock()
	return c.endpointLocked()
}

func (c *Client) endpointLocked() string {
	if len(c.endpoints) == 0 {
		return c.base
	}
	return c.endpoints[c.cur%len(c.endpoints)]
}

// Avoid moves the client off address u (https://host:port) if it is the
// one in use: the caller knows that server is down (the cluster's probes).
func (c *Client) Avoid(u string) {
	p, err := url.Parse(u)
	if err != nil {
		return
	}
	c.failed("https://" + p.Host)
}

// failed moves off endpoint ep after a transport error, unless another
// request did already; it reports whether there is another to try.
func (c *Client) failed(ep string) bool {
	c.epMu.Lock()
	defer c.epMu.Unlock()
	if len(c.endpoints) < 2 {
		return false
	}
	if c.endpointLocked() == ep {
		c.cur = (c.cur + 1) % len(c.endpoints)
	}
	return true
}

// NewUnixClient returns a client of the daemon listening on socket (empty:
// DefaultSocket).
func NewUnixClient(socket string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		// Keep-alive off: with connections reused, some /wait calls on
		// incusd 6.0.4 returned only at their timeout (30 s) although the
		// operation had ended (10 parallel creates). A new connection over
		// the socket costs about 0.1 ms.
		DisableKeepAlives: true,
	}
	// Any host name works over the socket.
	return &Client{hc: &http.Client{Transport: tr}, base: "http://incus"}
}

// RemoteConfig configures a client of a remote (or clustered) Incus over
// HTTPS. The client certificate must be trusted by the server
// (`incus config trust add-certificate`).
type RemoteConfig struct {
	// URL is the server's base URL, e.g. https://10.0.0.5:8443.
	URL string
	// Certificate is the client certificate and key.
	Certificate tls.Certificate
	// ServerCA, when set, verifies the server; otherwise ServerCert pins
	// the server's own (often self-signed) certificate, PEM.
	ServerCA   *tls.Config
	ServerCert []byte
}

// NewRemoteClient returns a client of the Incus server at cfg.URL,
// authenticating with cfg.Certificate.
func NewRemoteClient(cfg RemoteConfig) (*Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("incus: remote URL %q: want https://host:port", cfg.URL)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cfg.Certificate}}
	if cfg.ServerCA != nil {
		tc = cfg.ServerCA.Clone()
		tc.Certificates = []tls.Certificate{cfg.Certificate}
	} else if len(cfg.ServerCert) > 0 {
		pinned, err := pinnedVerifier(cfg.ServerCert)
		if err != nil {
			return nil, err
		}
		tc.InsecureSkipVerify = true // replaced by the pin below
		tc.VerifyPeerCertificate = pinned
	}
	// A dial bounded well under the callers' deadlines: a member that
	// died leaves its address unanswered (no RST), and only a dial error,
	// not a caller's deadline, moves the client to another member.
	d := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}
	tr := &http.Transport{TLSClientConfig: tc, DialContext: d.DialContext, TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}
	return &Client{hc: &http.Client{Transport: tr}, base: "https://" + u.Host}, nil
}

// LoadRemoteConfig reads a RemoteConfig's certificates from PEM files: the
// client certificate and key, and the server certificate to pin.
func LoadRemoteConfig(url, certFile, keyFile, serverCertFile string) (RemoteConfig, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return RemoteConfig{}, fmt.Errorf("incus: client certificate: %w", err)
	}
	srv, err := os.ReadFile(serverCertFile)
	if err != nil {
		return RemoteConfig{}, fmt.Errorf("incus: server certificate: %w", err)
	}
	return RemoteConfig{URL: url, Certificate: cert, ServerCert: srv}, nil
}

// NewClientWith returns a client that sends requests to base through hc; for
// tests.
func NewClientWith(hc *http.Client, base string) *Client {
	return &Client{hc: hc, base: strings.TrimSuffix(base, "/")}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// response is Incus' envelope around every answer.
type response struct {
	Type       string          `json:"type"` // sync, async, error
	Status     string          `json:"status"`
	StatusCode int             `json:"status_code"`
	Operation  string          `json:"operation"`
	ErrorCode  int             `json:"error_code"`
	Error      string          `json:"error"`
	Metadata   json.RawMessage `json:"metadata"`
}

// Error is a failed call: an error envelope, or a failed operation
// (StatusCode then is the operation's, usually 400).
type Error struct {
	Method, Path string
	StatusCode   int
	Message      string
	kind         error
}

func (e *Error) Error() string {
	return fmt.Sprintf("incus: %s %s: %d %s", e.Method, e.Path, e.StatusCode, e.Message)
}

// Unwrap gives the runtime error the failure maps to (see errorKind), so
// that errors.Is(err, runtime.ErrNotFound) works on a 404.
func (e *Error) Unwrap() error { return e.kind }

// errorKind maps an Incus failure to the runtime error callers branch on.
// It is the only place that does: HTTP-level codes first, then the messages
// of failed operations, which carry no code of their own.
func errorKind(code int, msg string) error {
	switch {
	case code == http.StatusNotFound || strings.Contains(msg, "not found"):
		return runtime.ErrNotFound
	case code == http.StatusConflict || strings.Contains(msg, "already exists") ||
		strings.Contains(msg, "UNIQUE constraint failed"):
		return runtime.ErrAlreadyExists
	case strings.Contains(msg, "is already frozen") || strings.Contains(msg, "The instance is already frozen"):
		return errAlreadyFrozen
	case strings.Contains(msg, "not frozen") || strings.Contains(msg, "already running"):
		return errNotFrozen
	case strings.Contains(msg, "already stopped") || strings.Contains(msg, "isn't running") ||
		strings.Contains(msg, "not running"):
		return runtime.ErrNotRunning
	case code == http.StatusBadRequest:
		return runtime.ErrInvalidSpec
	case code == http.StatusForbidden || code == http.StatusUnauthorized ||
		code >= 500 || code == 0:
		return runtime.ErrUnavailable
	}
	return nil
}

// Errors for state changes that are already done; the backend treats them
// as success.
var (
	errAlreadyFrozen = errors.New("instance already frozen")
	errNotFrozen     = errors.New("instance not frozen")
)

// do sends a request and decodes the envelope. A transport failure wraps
// runtime.ErrUnavailable.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body any) (*response, error) {
	var rd io.Reader
	var header http.Header
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
		header = http.Header{"Content-Type": {"application/json"}}
	}
	return c.send(ctx, method, path, query, rd, header)
}

// send is do with a body of any kind (an image upload) and its headers.
func (c *Client) send(ctx context.Context, method, path string, query url.Values, rd io.Reader, header http.Header) (*response, error) {
	if c.Project != "" {
		if query == nil {
			query = url.Values{}
		}
		query.Set("project", c.Project)
	}
	var resp *http.Response
	for attempt := 0; ; attempt++ {
		ep := c.endpoint()
		u := ep + path
		if len(query) > 0 {
			u += "?" + query.Encode()
		}
		req, err := http.NewRequestWithContext(ctx, method, u, rd)
		if err != nil {
			return nil, err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err = c.hc.Do(req)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("incus: %s %s: %w", method, path, ctx.Err())
		}
		if !c.failed(ep) || method != http.MethodGet || attempt > 0 {
			return nil, fmt.Errorf("incus: %s %s: %w: %w", method, path, runtime.ErrUnavailable, err)
		}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("incus: %s %s: %w: %w", method, path, runtime.ErrUnavailable, err)
	}
	var r response
	if err := json.Unmarshal(raw, &r); err != nil {
		msg := strings.TrimSpace(string(raw))
		if len(msg) > 200 {
			msg = msg[:200]
		}
		return nil, newError(method, path, resp.StatusCode, "undecodable answer: "+msg)
	}
	if r.Type == "error" || resp.StatusCode >= 400 {
		code := r.ErrorCode
		if code == 0 {
			code = resp.StatusCode
		}
		return nil, newError(method, path, code, r.Error)
	}
	return &r, nil
}

func newError(method, path string, code int, msg string) *Error {
	return &Error{Method: method, Path: path, StatusCode: code, Message: msg, kind: errorKind(code, msg)}
}

// query does a sync call and decodes its metadata into out (when non-nil).
func (c *Client) query(ctx context.Context, method, path string, q url.Values, body, out any) error {
	r, err := c.do(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	if out != nil && len(r.Metadata) > 0 {
		if err := json.Unmarshal(r.Metadata, out); err != nil {
			return fmt.Errorf("incus: %s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// async does a call answered with an operation and returns its id.
func (c *Client) async(ctx context.Context, method, path string, body any) (string, error) {
	return c.asyncQuery(ctx, method, path, nil, body)
}

// asyncQuery is async with query parameters.
func (c *Client) asyncQuery(ctx context.Context, method, path string, q url.Values, body any) (string, error) {
	r, err := c.do(ctx, method, path, q, body)
	if err != nil {
		return "", err
	}
	if r.Type != "async" || r.Operation == "" {
		return "", newError(method, path, r.StatusCode, "expected an async answer, got "+r.Type)
	}
	return trimOperation(r.Operation), nil
}

// trimOperation is the id in an operation's URL: a cluster member that
// forwards a request answers with "/1.0/operations/<id>?project=default".
func trimOperation(op string) string {
	op, _, _ = strings.Cut(op, "?")
	return strings.TrimPrefix(op, "/1.0/operations/")
}

// Operation is a background task of the daemon.
type Operation struct {
	ID          string              `json:"id"`
	Class       string              `json:"class"`
	Description string              `json:"description"`
	Status      string              `json:"status"`
	StatusCode  int                 `json:"status_code"`
	Resources   map[string][]string `json:"resources"`
	Metadata    json.RawMessage     `json:"metadata"`
	Err         string              `json:"err"`
}

// Wait waits for operation id to end, for as long as ctx allows, and returns
// it. An operation that failed is returned with an *Error.
func (c *Client) Wait(ctx context.Context, id string) (*Operation, error) {
	path := "/1.0/operations/" + url.PathEscape(id) + "/wait"
	for {
		// The server-side timeout bounds each call; ctx bounds the whole.
		timeout := 30
		if dl, ok := ctx.Deadline(); ok {
			if s := int(time.Until(dl).Seconds()) + 1; s < timeout {
				timeout = s
			}
		}
		var op Operation
		err := c.query(ctx, http.MethodGet, path, url.Values{"timeout": {strconv.Itoa(timeout)}}, nil, &op)
		var ie *Error
		if errors.As(err, &ie) && ie.StatusCode == http.StatusInternalServerError &&
			strings.Contains(ie.Message, "deadline exceeded") && ctx.Err() == nil {
			continue // the server's wait timed out, ours did not
		}
		if err != nil {
			return nil, err
		}
		switch {
		case op.StatusCode == 200: // Success
			return &op, nil
		case op.StatusCode >= 400: // Failure, Cancelled
			e := newError("OP", op.Description, op.StatusCode, op.Err)
			return &op, e
		}
		if err := ctx.Err(); err != nil {
			return &op, fmt.Errorf("incus: wait for %s: %w", op.Description, err)
		}
	}
}

// RunningOperations lists the daemon's operations that have not ended
// (pending, running, or waiting to be cancelled).
func (c *Client) RunningOperations(ctx context.Context) ([]*Operation, error) {
	var byStatus map[string][]*Operation
	if err := c.query(ctx, http.MethodGet, "/1.0/operations", url.Values{"recursion": {"1"}}, nil, &byStatus); err != nil {
		return nil, err
	}
	var out []*Operation
	for status, ops := range byStatus {
		if status != "success" && status != "failure" && status != "cancelled" {
			out = append(out, ops...)
		}
	}
	return out, nil
}

// run does an async call and waits for its operation.
func (c *Client) run(ctx context.Context, method, path string, body any) (*Operation, error) {
	id, err := c.async(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	return c.Wait(ctx, id)
}

// Server is the part of GET /1.0 the backend checks.
type Server struct {
	APIExtensions []string `json:"api_extensions"`
	APIVersion    string   `json:"api_version"`
	Auth          string   `json:"auth"`
	Environment   struct {
		ServerVersion  string `json:"server_version"`
		Driver         string `json:"driver"`
		DriverVersion  string `json:"driver_version"`
		KernelVersion  string `json:"kernel_version"`
		StorageDrivers []struct {
			Name string `json:"name"`
		} `json:"storage_supported_drivers"`
		ServerClustered bool   `json:"server_clustered"`
		ServerName      string `json:"server_name"`
	} `json:"environment"`
}

// HasExtension reports whether the server has API extension name.
func (s *Server) HasExtension(name string) bool {
	for _, e := range s.APIExtensions {
		if e == name {
			return true
		}
	}
	return false
}

// Server returns GET /1.0.
func (c *Client) Server(ctx context.Context) (*Server, error) {
	var s Server
	if err := c.query(ctx, http.MethodGet, "/1.0", nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// InstanceSource is where a new instance's root comes from.
type InstanceSource struct {
	Type        string `json:"type"` // "image" or "copy"
	Alias       string `json:"alias,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// Source is the instance a "copy" copies; InstanceOnly leaves its
	// snapshots behind.
	Source       string `json:"source,omitempty"`
	InstanceOnly bool   `json:"instance_only,omitempty"`
}

// InstancesPost creates an instance.
type InstancesPost struct {
	Name string `json:"name"`
	Type string `json:"type"` // "container"
	// Architecture is required of a copy from another cluster member
	// (incusd makes it a migration); "" otherwise.
	Architecture string                       `json:"architecture,omitempty"`
	Ephemeral    bool                         `json:"ephemeral"`
	Start        bool                         `json:"start"`
	Source       InstanceSource               `json:"source"`
	Config       map[string]string            `json:"config,omitempty"`
	Devices      map[string]map[string]string `json:"devices,omitempty"`
	// Profiles nil means the "default" profile; an empty non-nil slice
	// means none.
	Profiles []string `json:"profiles"`
	// Target is the cluster member to create the instance on (?target=);
	// empty: the server's (a cluster's scheduler picks).
	Target string `json:"-"`
}

// Instance is GET /1.0/instances/<name> (and one entry of a recursion=1
// list; recursion=2 also fills State).
type Instance struct {
	Name            string                       `json:"name"`
	Status          string                       `json:"status"` // Running, Frozen, Stopped, …
	StatusCode      int                          `json:"status_code"`
	Type            string                       `json:"type"`
	Architecture    string                       `json:"architecture"`
	Ephemeral       bool                         `json:"ephemeral"`
	Config          map[string]string            `json:"config"`
	Devices         map[string]map[string]string `json:"devices"`
	ExpandedConfig  map[string]string            `json:"expanded_config"`
	ExpandedDevices map[string]map[string]string `json:"expanded_devices"`
	CreatedAt       time.Time                    `json:"created_at"`
	State           *InstanceState               `json:"state,omitempty"`
	// Location is the cluster member the instance is on ("none" on a
	// server that is not clustered).
	Location string `json:"location"`
}

// InstanceState is GET /1.0/instances/<name>/state.
type InstanceState struct {
	Status     string `json:"status"`
	StatusCode int    `json:"status_code"`
	Disk       map[string]struct {
		Usage int64 `json:"usage"`
		Total int64 `json:"total"`
	} `json:"disk"`
	Memory struct {
		Usage     int64 `json:"usage"`
		UsagePeak int64 `json:"usage_peak"`
		Total     int64 `json:"total"`
		SwapUsage int64 `json:"swap_usage"`
	} `json:"memory"`
	CPU struct {
		Usage         int64 `json:"usage"` // ns
		AllocatedTime int64 `json:"allocated_time"`
	} `json:"cpu"`
	Pid       int64 `json:"pid"`
	Processes int64 `json:"processes"`
}

// StatePut changes an instance's state.
type StatePut struct {
	Action   string `json:"action"` // start, stop, restart, freeze, unfreeze
	Timeout  int    `json:"timeout"`
	Force    bool   `json:"force"`
	Stateful bool   `json:"stateful"`
}

// CreateInstance starts creating an instance and returns the operation id:
// the instance exists (and, with Start, runs) once Wait on it returns.
func (c *Client) CreateInstance(ctx context.Context, req InstancesPost) (string, error) {
	var q url.Values
	if req.Target != "" {
		q = url.Values{"target": {req.Target}}
	}
	return c.asyncQuery(ctx, http.MethodPost, "/1.0/instances", q, req)
}

// Instance returns one instance.
func (c *Client) Instance(ctx context.Context, name string) (*Instance, error) {
	var in Instance
	if err := c.query(ctx, http.MethodGet, "/1.0/instances/"+url.PathEscape(name), nil, nil, &in); err != nil {
		return nil, err
	}
	return &in, nil
}

// InstanceState returns an instance's live state.
func (c *Client) InstanceState(ctx context.Context, name string) (*InstanceState, error) {
	var st InstanceState
	if err := c.query(ctx, http.MethodGet, "/1.0/instances/"+url.PathEscape(name)+"/state", nil, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// Instances lists all instances with their config (recursion=1). When
// configKey is set, only those whose config has that key are returned.
func (c *Client) Instances(ctx context.Context, configKey string) ([]*Instance, error) {
	var all []*Instance
	if err := c.query(ctx, http.MethodGet, "/1.0/instances", url.Values{"recursion": {"1"}}, nil, &all); err != nil {
		return nil, err
	}
	if configKey == "" {
		return all, nil
	}
	out := all[:0]
	for _, in := range all {
		if _, ok := in.Config[configKey]; ok {
			out = append(out, in)
		}
	}
	return out, nil
}

// SetState changes an instance's state (freeze, unfreeze, stop, …) and waits
// for it.
func (c *Client) SetState(ctx context.Context, name string, s StatePut) error {
	_, err := c.run(ctx, http.MethodPut, "/1.0/instances/"+url.PathEscape(name)+"/state", s)
	return err
}

// InstancePatch is a partial update of an instance: only the fields set
// change, and Config is merged into the instance's own keys.
type InstancePatch struct {
	Ephemeral *bool             `json:"ephemeral,omitempty"`
	Config    map[string]string `json:"config,omitempty"`
}

// PatchInstance updates an instance (PATCH), waiting for the operation when
// the server answers with one.
func (c *Client) PatchInstance(ctx context.Context, name string, p InstancePatch) error {
	path := "/1.0/instances/" + url.PathEscape(name)
	r, err := c.do(ctx, http.MethodPatch, path, nil, p)
	if err != nil {
		return err
	}
	if r.Type == "async" && r.Operation != "" {
		_, err = c.Wait(ctx, trimOperation(r.Operation))
	}
	return err
}

// InstancePut replaces an instance's own config, devices and profiles
// (PUT); Incus keeps the volatile keys it is given back.
type InstancePut struct {
	Config      map[string]string            `json:"config"`
	Devices     map[string]map[string]string `json:"devices"`
	Profiles    []string                     `json:"profiles"`
	Ephemeral   bool                         `json:"ephemeral"`
	Description string                       `json:"description,omitempty"`
}

// PutInstance replaces instance name's configuration, waiting for the
// operation when the server answers with one.
func (c *Client) PutInstance(ctx context.Context, name string, p InstancePut) error {
	return c.maybeWait(ctx, http.MethodPut, "/1.0/instances/"+url.PathEscape(name), p)
}

// RenameInstance renames a stopped instance and waits for it; a name taken
// already is ErrAlreadyExists.
func (c *Client) RenameInstance(ctx context.Context, name, to string) error {
	_, err := c.run(ctx, http.MethodPost, "/1.0/instances/"+url.PathEscape(name), map[string]string{"name": to})
	return err
}

// DeleteInstance deletes a stopped instance and waits for it.
// CancelOperation asks Incus to cancel operation id; one that cannot be
// cancelled (not may_cancel) answers an error.
func (c *Client) CancelOperation(ctx context.Context, id string) error {
	return c.query(ctx, http.MethodDelete, "/1.0/operations/"+url.PathEscape(id), nil, nil, nil)
}

func (c *Client) DeleteInstance(ctx context.Context, name string) error {
	_, err := c.run(ctx, http.MethodDelete, "/1.0/instances/"+url.PathEscape(name), nil)
	return err
}

// ImageAlias resolves an image alias to its fingerprint.
func (c *Client) ImageAlias(ctx context.Context, alias string) (string, error) {
	var a struct {
		Target string `json:"target"`
	}
	if err := c.query(ctx, http.MethodGet, "/1.0/images/aliases/"+url.PathEscape(alias), nil, nil, &a); err != nil {
		return "", err
	}
	return a.Target, nil
}

// Image is GET /1.0/images/<fingerprint>.
type Image struct {
	Fingerprint string `json:"fingerprint"`
	Size        int64  `json:"size"`
	Type        string `json:"type"`
	Aliases     []struct {
		Name string `json:"name"`
	} `json:"aliases"`
	Properties map[string]string `json:"properties"`
}

// Image returns an image by fingerprint.
func (c *Client) Image(ctx context.Context, fingerprint string) (*Image, error) {
	var im Image
	if err := c.query(ctx, http.MethodGet, "/1.0/images/"+url.PathEscape(fingerprint), nil, nil, &im); err != nil {
		return nil, err
	}
	return &im, nil
}

// StoragePool is GET /1.0/storage-pools/<name>.
type StoragePool struct {
	Name   string            `json:"name"`
	Driver string            `json:"driver"`
	Status string            `json:"status"`
	Config map[string]string `json:"config"`
}

// StoragePool returns a storage pool.
func (c *Client) StoragePool(ctx context.Context, name string) (*StoragePool, error) {
	var p StoragePool
	if err := c.query(ctx, http.MethodGet, "/1.0/storage-pools/"+url.PathEscape(name), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
