// Package e2b implements E2B's control-plane REST API (openapi/e2b.yaml,
// generated into e2bapi) on the lifecycle manager: it renders sandbox views
// into E2B's wire types. Routing, auth and error answers are the server's.
package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/e2bapi"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/template"
	"github.com/sandboxd/sandboxd/volume"
)

// API implements E2B's control-plane REST surface on the lifecycle
// manager. Wire types stop here: nothing below sees e2bapi.
type API struct {
	notImplemented
	mgr         *sandbox.Manager
	templates   runtime.TemplateLister // nil if the backend cannot list
	tpl         *template.Service      // nil: no template builds
	vol         *volume.Service        // nil: volumes answer 501
	envdVersion string
	domain      string // returned as the sandbox domain; "" = the client's own
	log         *slog.Logger
	// started is reported as the built-in templates' creation time (they
	// are made, or found, when the server starts).
	started time.Time
}

var _ e2bapi.StrictServerInterface = (*API)(nil)

// Config configures an API.
type Config struct {
	Manager   *sandbox.Manager
	Templates runtime.TemplateLister // optional
	// Builds serves the template build API; nil answers it with 501.
	Builds *template.Service
	// Volumes serves E2B's volumes; nil answers them with 501.
	Volumes     *volume.Service
	EnvdVersion string
	// Domain is returned to SDKs as the sandbox domain; "": the client's own.
	Domain string
	Log    *slog.Logger
}

// New returns E2B's API on cfg.Manager.
func New(cfg Config) *API {
	return &API{mgr: cfg.Manager, templates: cfg.Templates, tpl: cfg.Builds, vol: cfg.Volumes, envdVersion: cfg.EnvdVersion, domain: cfg.Domain, log: cfg.Log,
		started: time.Now().UTC()}
}

// clientID is a dead field E2B's Python SDK still requires.
const clientID = "sandboxd"

func ptr[T any](v T) *T { return &v }

// templateID is the template a sandbox reports: a built template's id
// rather than the build it runs (which the backend knows it by).
func (a *API) templateID(sb sandbox.View) string {
	if a.tpl != nil {
		if cfg, ok := a.tpl.Config(sb.Template); ok {
			return cfg.TemplateID
		}
	}
	return sb.Template
}

func (a *API) sandboxBody(sb sandbox.View) e2bapi.Sandbox {
	out := e2bapi.Sandbox{
		SandboxID:   sb.ID,
		TemplateID:  a.templateID(sb),
		ClientID:    clientID,
		EnvdVersion: a.envdVersion,
	}
	if sb.Alias != "" {
		out.Alias = ptr(sb.Alias)
	}
	if sb.EnvdAccessToken != "" {
		out.EnvdAccessToken = ptr(sb.EnvdAccessToken)
	}
	if tok := sb.TrafficAccessToken(); tok != "" {
		out.TrafficAccessToken = ptr(tok)
	}
	if a.domain != "" {
		out.Domain = ptr(a.domain)
	}
	return out
}

// newSandbox is the common part of NewSandbox and NewSandboxV2.
type newSandbox struct {
	template      string
	timeout       *int32
	secure        bool
	allowInternet *bool
	metadata      *e2bapi.SandboxMetadata
	envVars       *e2bapi.EnvVars
	autoPause     *bool
	autoPauseMem  *bool // with autoPause: false pauses to disk
	autoResume    *e2bapi.SandboxAutoResumeConfig
	network       *e2bapi.SandboxNetworkConfig
	mcp           bool
	mounts        []volume.MountRequest
	iam           bool
}

// MaxBody bounds every E2B request body (openapi/e2b.yaml states it): E2B
// publishes none, and no control-plane call needs more.
const MaxBody = 1 << 20

func (a *API) create(ctx context.Context, n newSandbox) (sandbox.View, error) {
	if n.template == "" {
		return sandbox.View{}, errdefs.New(errdefs.ErrInvalidArgument, "templateID must not be empty")
	}
	if err := httpx.CheckMap("metadata", httpx.Deref(n.metadata), httpx.MetadataLimits); err != nil {
		return sandbox.View{}, err
	}
	if err := httpx.CheckMap("envVars", httpx.Deref(n.envVars), httpx.EnvLimits); err != nil {
		return sandbox.View{}, err
	}
	if n.mcp {
		return sandbox.View{}, errdefs.New(errdefs.ErrNotImplemented, "MCP gateway sandboxes are not supported by sandboxd")
	}
	if n.iam {
		return sandbox.View{}, errdefs.New(errdefs.ErrNotImplemented, "iam: workload identity tokens are not supported by sandboxd")
	}
	req := sandbox.CreateRequest{
		Template:      n.template,
		Secure:        n.secure,
		AllowInternet: n.allowInternet == nil || *n.allowInternet,
	}
	if len(n.mounts) > 0 {
		ms, err := a.vol.Mounts(ctx, n.mounts)
		if err != nil {
			return sandbox.View{}, err
		}
		req.Volumes = ms
	}
	if n.timeout != nil {
		if *n.timeout < 0 {
			return sandbox.View{}, errdefs.New(errdefs.ErrInvalidArgument, "timeout must not be negative")
		}
		req.Timeout = time.Duration(*n.timeout) * time.Second
	}
	if n.metadata != nil {
		req.Metadata = *n.metadata
	}
	if n.envVars != nil {
		req.EnvVars = *n.envVars
	}
	if n.autoPause != nil && *n.autoPause {
		req.Lifecycle.OnTimeout = sandbox.OnTimeoutPause
		if n.autoPauseMem != nil && !*n.autoPauseMem {
			req.Lifecycle.OnTimeout = sandbox.OnTimeoutPauseDisk
		}
	}
	if n.autoResume != nil {
		req.Lifecycle.AutoResume = n.autoResume.Enabled
	}
	if nw := n.network; nw != nil {
		if err := unsupportedNetwork(nw.EgressProxy != nil, nw.Rules, nw.HttpsPorts); err != nil {
			return sandbox.View{}, err
		}
		mask := httpx.Deref(nw.MaskRequestHost)
		if mask != "" && !httpguts.ValidHostHeader(strings.ReplaceAll(mask, "${PORT}", "1")) {
			return sandbox.View{}, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("network.maskRequestHost %q: not a valid Host header (host, host:port, ${PORT} for the port)", mask))
		}
		allowOut, denyOut := httpx.Deref(nw.AllowOut), httpx.Deref(nw.DenyOut)
		switch {
		case !req.AllowInternet && len(allowOut) > 0:
			// allow_internet_access=false is denyOut ALL_TRAFFIC, which
			// allowOut opens holes in.
			req.AllowInternet, denyOut = true, append(denyOut, sandbox.AllTraffic)
		case !req.AllowInternet:
			// No veth at all: stricter than any deny list. (A denyOut
			// of ALL_TRAFFIC alone keeps the veth, with every packet
			// refused, so that updateNetwork can open it later.)
			denyOut = nil
		}
		req.Network = &sandbox.NetworkConfig{
			AllowPublicTraffic: nw.AllowPublicTraffic, AllowOut: allowOut, DenyOut: denyOut, DNSServers: httpx.Deref(nw.DnsServers),
			MaskRequestHost: mask,
		}
	}
	return a.mgr.CreateView(ctx, req)
}

func (a *API) CreateSandbox(ctx context.Context, req e2bapi.CreateSandboxRequestObject) (e2bapi.CreateSandboxResponseObject, error) {
	if req.Body == nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "missing body")
	}
	b := req.Body
	sb, err := a.create(ctx, newSandbox{
		template: b.TemplateID, timeout: b.Timeout, secure: b.Secure == nil || *b.Secure,
		allowInternet: b.AllowInternetAccess, metadata: b.Metadata, envVars: b.EnvVars,
		autoPause: b.AutoPause, autoPauseMem: b.AutoPauseMemory, autoResume: b.AutoResume, network: b.Network,
		mcp: b.Mcp != nil, mounts: mountRequests(b.VolumeMounts), iam: b.Iam != nil && b.Iam.Tokens != nil && len(*b.Iam.Tokens) > 0,
	})
	if err != nil {
		return nil, err
	}
	return e2bapi.CreateSandbox201JSONResponse(a.sandboxBody(sb)), nil
}

// CreateSandboxV2 is the current SDKs' create. Its body has no `secure`:
// every v2 sandbox gets an envd access token, as on E2B.
func (a *API) CreateSandboxV2(ctx context.Context, req e2bapi.CreateSandboxV2RequestObject) (e2bapi.CreateSandboxV2ResponseObject, error) {
	if req.Body == nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "missing body")
	}
	b := req.Body
	sb, err := a.create(ctx, newSandbox{
		template: b.TemplateID, timeout: b.Timeout, secure: true,
		allowInternet: b.AllowInternetAccess, metadata: b.Metadata, envVars: b.EnvVars,
		autoPause: b.AutoPause, autoPauseMem: b.AutoPauseMemory, autoResume: b.AutoResume, network: b.Network,
		mcp: b.Mcp != nil, mounts: mountRequests(b.VolumeMounts), iam: b.Iam != nil && b.Iam.Tokens != nil && len(*b.Iam.Tokens) > 0,
	})
	if err != nil {
		return nil, err
	}
	return e2bapi.CreateSandboxV2201JSONResponse(a.sandboxBody(sb)), nil
}

func (a *API) detail(sb sandbox.View) e2bapi.SandboxDetail {
	d := e2bapi.SandboxDetail{
		SandboxID:           sb.ID,
		TemplateID:          a.templateID(sb),
		ClientID:            clientID,
		EnvdVersion:         a.envdVersion,
		StartedAt:           sb.StartedAt,
		EndAt:               sb.EndAt,
		CpuCount:            int32(sb.CPUCount),
		MemoryMB:            int32(sb.MemoryMB),
		DiskSizeMB:          int32(sb.DiskMB),
		State:               apiState(sb.State),
		Metadata:            ptr(e2bapi.SandboxMetadata(nonNil(sb.Metadata))),
		AllowInternetAccess: ptr(sb.AllowInternetAccess),
		Lifecycle: &e2bapi.SandboxLifecycle{
			OnTimeout:  e2bapi.SandboxOnTimeoutKill,
			AutoResume: sb.Lifecycle.AutoResume,
		},
	}
	if sb.Lifecycle.OnTimeout == sandbox.OnTimeoutPause || sb.Lifecycle.OnTimeout == sandbox.OnTimeoutPauseDisk {
		d.Lifecycle.OnTimeout = e2bapi.SandboxOnTimeoutPause
	}
	if sb.Alias != "" {
		d.Alias = ptr(sb.Alias)
	}
	if sb.EnvdAccessToken != "" {
		d.EnvdAccessToken = ptr(sb.EnvdAccessToken)
	}
	if a.domain != "" {
		d.Domain = ptr(a.domain)
	}
	if len(sb.VolumeMounts) > 0 {
		ms := make([]e2bapi.SandboxVolumeMount, 0, len(sb.VolumeMounts))
		for _, v := range sb.VolumeMounts {
			ms = append(ms, e2bapi.SandboxVolumeMount{Name: v.Name, Path: v.Path})
		}
		d.VolumeMounts = &ms
	}
	if n := sb.Network; n != nil {
		nc := &e2bapi.SandboxNetworkConfig{AllowPublicTraffic: n.AllowPublicTraffic}
		if len(n.AllowOut) > 0 {
			nc.AllowOut = ptr(n.AllowOut)
		}
		if len(n.DenyOut) > 0 {
			nc.DenyOut = ptr(n.DenyOut)
		}
		if len(n.DNSServers) > 0 {
			nc.DnsServers = ptr(n.DNSServers)
		}
		if n.MaskRequestHost != "" {
			nc.MaskRequestHost = ptr(n.MaskRequestHost)
		}
		if len(n.Rules) > 0 {
			var rules map[string][]e2bapi.SandboxNetworkRule
			if json.Unmarshal(n.Rules, &rules) == nil {
				nc.Rules = &rules
			}
		}
		d.Network = nc
	}
	return d
}

func listed(d e2bapi.SandboxDetail) e2bapi.ListedSandbox {
	return e2bapi.ListedSandbox{
		SandboxID: d.SandboxID, TemplateID: d.TemplateID, ClientID: d.ClientID, Alias: d.Alias,
		EnvdVersion: d.EnvdVersion, StartedAt: d.StartedAt, EndAt: d.EndAt, CpuCount: d.CpuCount,
		MemoryMB: d.MemoryMB, DiskSizeMB: d.DiskSizeMB, State: d.State, Metadata: d.Metadata,
	}
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// apiState folds the in-progress states into the two E2B knows (anything
// else crashes the Python SDK). A resuming sandbox is not reachable until
// its envd has its /init, and a connect settles one a failure left so: it
// reads as paused.
func apiState(s sandbox.State) e2bapi.SandboxState {
	switch s {
	case sandbox.StatePaused, sandbox.StatePausing, sandbox.StateResuming:
		return e2bapi.SandboxStatePaused
	}
	return e2bapi.SandboxStateRunning
}

func (a *API) GetSandbox(ctx context.Context, req e2bapi.GetSandboxRequestObject) (e2bapi.GetSandboxResponseObject, error) {
	sb, err := a.mgr.GetView(ctx, req.SandboxID)
	if err != nil {
		return nil, err
	}
	return e2bapi.GetSandbox200JSONResponse(a.detail(sb)), nil
}

func (a *API) KillSandbox(ctx context.Context, req e2bapi.KillSandboxRequestObject) (e2bapi.KillSandboxResponseObject, error) {
	if err := a.mgr.Kill(ctx, req.SandboxID); err != nil {
		return nil, err
	}
	return e2bapi.KillSandbox204Response{}, nil
}

// parseMetadataFilter decodes E2B's metadata query: the SDKs percent-encode
// each key and value, join them as a form, and encode that once more; the
// HTTP stack has undone one layer already.
func parseMetadataFilter(q *string) (map[string]string, error) {
	if q == nil || *q == "" {
		return nil, nil
	}
	raw, err := url.QueryUnescape(*q)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "metadata filter: "+err.Error())
	}
	out := map[string]string{}
	for _, pair := range strings.Split(raw, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil || key == "" {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("metadata filter: bad pair %q", pair))
		}
		out[key] = val
	}
	return out, nil
}

func (a *API) ListSandboxes(ctx context.Context, req e2bapi.ListSandboxesRequestObject) (e2bapi.ListSandboxesResponseObject, error) {
	md, err := parseMetadataFilter(req.Params.Metadata)
	if err != nil {
		return nil, err
	}
	out := e2bapi.ListSandboxes200JSONResponse{}
	f := sandbox.ListFilter{Metadata: md, States: []sandbox.State{sandbox.StateRunning}, Limit: 100}
	for {
		page, next, err := a.mgr.ListViews(ctx, f)
		if err != nil {
			return nil, err
		}
		for i := range page {
			out = append(out, listed(a.detail(page[i])))
		}
		if next == "" {
			return out, nil
		}
		f.Cursor = next
	}
}

func (a *API) ListSandboxesV2(ctx context.Context, req e2bapi.ListSandboxesV2RequestObject) (e2bapi.ListSandboxesV2ResponseObject, error) {
	p := req.Params
	md, err := parseMetadataFilter(p.Metadata)
	if err != nil {
		return nil, err
	}
	f := sandbox.ListFilter{Metadata: md, Order: sandbox.OrderDesc}
	if p.State != nil {
		for _, s := range *p.State {
			switch s {
			case e2bapi.SandboxStateRunning:
				f.States = append(f.States, sandbox.StateRunning)
			case e2bapi.SandboxStatePaused:
				// What apiState shows as paused.
				f.States = append(f.States, sandbox.StatePaused, sandbox.StatePausing, sandbox.StateResuming)
			default:
				return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("state %q: want running or paused", s))
			}
		}
	}
	if len(f.States) == 0 {
		f.States = []sandbox.State{sandbox.StateRunning, sandbox.StatePaused, sandbox.StatePausing, sandbox.StateResuming}
	}
	if p.StartedAfter != nil {
		f.StartedAfter = *p.StartedAfter
	}
	if p.Template != nil {
		f.Template = *p.Template
	}
	if p.Order != nil {
		switch *p.Order {
		case e2bapi.OrderDirectionAsc:
			f.Order = sandbox.OrderAsc
		case e2bapi.OrderDirectionDesc:
		default:
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "order: want asc or desc")
		}
	}
	f.Limit = 100
	if p.Limit != nil {
		if *p.Limit < 1 || *p.Limit > 100 {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "limit: want 1..100")
		}
		f.Limit = int(*p.Limit)
	}
	if p.NextToken != nil {
		f.Cursor = *p.NextToken
	}
	page, next, err := a.mgr.ListViews(ctx, f)
	if err != nil {
		return nil, err
	}
	resp := e2bapi.ListSandboxesV2200JSONResponse{Body: []e2bapi.ListedSandbox{}}
	for i := range page {
		resp.Body = append(resp.Body, listed(a.detail(page[i])))
	}
	if next != "" {
		resp.Headers.XNextToken = ptr(next)
	}
	return resp, nil
}

func timeoutOf(t *int32, def time.Duration) (time.Duration, error) {
	if t == nil {
		return def, nil
	}
	if *t < 0 {
		return 0, errdefs.New(errdefs.ErrInvalidArgument, "timeout must not be negative")
	}
	return time.Duration(*t) * time.Second, nil
}

func (a *API) connect(ctx context.Context, id string, timeout *int32) (e2bapi.Sandbox, bool, error) {
	d, err := timeoutOf(timeout, 0)
	if err != nil {
		return e2bapi.Sandbox{}, false, err
	}
	sb, resumed, err := a.mgr.ConnectView(ctx, id, d)
	if err != nil {
		return e2bapi.Sandbox{}, false, err
	}
	return a.sandboxBody(sb), resumed, nil
}

func (a *API) ConnectSandbox(ctx context.Context, req e2bapi.ConnectSandboxRequestObject) (e2bapi.ConnectSandboxResponseObject, error) {
	var t *int32
	if req.Body != nil {
		t = &req.Body.Timeout
	}
	sb, resumed, err := a.connect(ctx, req.SandboxID, t)
	if err != nil {
		return nil, err
	}
	if resumed {
		return e2bapi.ConnectSandbox201JSONResponse(sb), nil
	}
	return e2bapi.ConnectSandbox200JSONResponse(sb), nil
}

func (a *API) ConnectSandboxV2(ctx context.Context, req e2bapi.ConnectSandboxV2RequestObject) (e2bapi.ConnectSandboxV2ResponseObject, error) {
	var t *int32
	if req.Body != nil {
		t = req.Body.Timeout
	}
	sb, resumed, err := a.connect(ctx, req.SandboxID, t)
	if err != nil {
		return nil, err
	}
	if resumed {
		return e2bapi.ConnectSandboxV2201JSONResponse(sb), nil
	}
	return e2bapi.ConnectSandboxV2200JSONResponse(sb), nil
}

func (a *API) ResumeSandbox(ctx context.Context, req e2bapi.ResumeSandboxRequestObject) (e2bapi.ResumeSandboxResponseObject, error) {
	var t *int32
	if req.Body != nil {
		t = req.Body.Timeout
	}
	d, err := timeoutOf(t, 0)
	if err != nil {
		return nil, err
	}
	sb, err := a.mgr.ResumeView(ctx, req.SandboxID, d)
	if err != nil {
		return nil, err
	}
	return e2bapi.ResumeSandbox201JSONResponse(a.sandboxBody(sb)), nil
}

func (a *API) PauseSandbox(ctx context.Context, req e2bapi.PauseSandboxRequestObject) (e2bapi.PauseSandboxResponseObject, error) {
	memory := true
	if req.Body != nil && req.Body.Memory != nil {
		memory = *req.Body.Memory
	}
	if err := a.mgr.Pause(ctx, req.SandboxID, memory); err != nil {
		return nil, err
	}
	return e2bapi.PauseSandbox204Response{}, nil
}

func (a *API) SetSandboxTimeout(ctx context.Context, req e2bapi.SetSandboxTimeoutRequestObject) (e2bapi.SetSandboxTimeoutResponseObject, error) {
	if req.Body == nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "missing body")
	}
	if err := a.mgr.SetTimeout(ctx, req.SandboxID, time.Duration(req.Body.Timeout)*time.Second); err != nil {
		return nil, err
	}
	return e2bapi.SetSandboxTimeout204Response{}, nil
}

func (a *API) RefreshSandbox(ctx context.Context, req e2bapi.RefreshSandboxRequestObject) (e2bapi.RefreshSandboxResponseObject, error) {
	if err := rejectNull(ctx, "duration"); err != nil {
		return nil, err
	}
	var d time.Duration
	if req.Body != nil && req.Body.Duration != nil {
		if *req.Body.Duration < 0 || *req.Body.Duration > 3600 {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "duration: want 0..3600 seconds")
		}
		d = time.Duration(*req.Body.Duration) * time.Second
	}
	if err := a.mgr.Refresh(ctx, req.SandboxID, d); err != nil {
		return nil, err
	}
	return e2bapi.RefreshSandbox204Response{}, nil
}

// rejectNull refuses a body whose field is JSON null: the generated
// decoder reads null as absent, but the spec has no nullable field, and an
// explicit null is more likely a client bug than a wish for the default.
func rejectNull(ctx context.Context, field string) error {
	var fields map[string]json.RawMessage
	if json.Unmarshal(httpx.RawBody(ctx), &fields) != nil {
		return nil // no body, or not an object: the decoder has answered
	}
	if v, ok := fields[field]; ok && string(v) == "null" {
		return errdefs.New(errdefs.ErrInvalidArgument, field+": must not be null")
	}
	return nil
}

func (a *API) UpdateSandboxNetwork(ctx context.Context, req e2bapi.UpdateSandboxNetworkRequestObject) (e2bapi.UpdateSandboxNetworkResponseObject, error) {
	var u sandbox.NetworkUpdate
	if b := req.Body; b != nil {
		if err := unsupportedNetwork(b.EgressProxy != nil, b.Rules, nil); err != nil {
			return nil, err
		}
		u = sandbox.NetworkUpdate{
			AllowInternet: b.AllowInternetAccess, AllowOut: httpx.Deref(b.AllowOut), DenyOut: httpx.Deref(b.DenyOut),
			DNSServers: httpx.Deref(b.DnsServers),
		}
	}
	if err := a.mgr.UpdateNetwork(ctx, req.SandboxID, u); err != nil {
		return nil, err
	}
	return e2bapi.UpdateSandboxNetwork204Response{}, nil
}

// unsupportedNetwork refuses, by name, the network settings sandboxd does
// not enforce: a security setting is never accepted and ignored.
func unsupportedNetwork(egressProxy bool, rules *map[string][]e2bapi.SandboxNetworkRule, httpsPorts *[]int32) error {
	switch {
	case egressProxy:
		return errdefs.New(errdefs.ErrNotImplemented, "network.egressProxy: egress through a SOCKS5 proxy is not supported by sandboxd")
	case rules != nil && len(*rules) > 0:
		return errdefs.New(errdefs.ErrNotImplemented, "network.rules: egress transform rules are not supported by sandboxd")
	case httpsPorts != nil && len(*httpsPorts) > 0:
		return errdefs.New(errdefs.ErrNotImplemented, "network.httpsPorts: the port proxy speaks plain HTTP to sandboxes; HTTPS upstreams are not supported by sandboxd")
	}
	return nil
}
