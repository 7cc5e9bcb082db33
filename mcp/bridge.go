package mcp

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// BridgeConfig says which sandboxd the stdio bridge serves.
type BridgeConfig struct {
	// URL is sandboxd's base URL (http://127.0.0.1:3000); the bridge talks
	// to its /mcp.
	URL string
	// Token is a JWT (sandboxd token create) or an API key, sent as a
	// bearer.
	Token string
	// HTTPClient, if set, carries the requests (its transport gets the
	// token added).
	HTTPClient *http.Client
	Version    string
}

// Bridge serves, over t (stdio for `sandboxd mcp`), the tools of the
// sandboxd at cfg.URL until the client on t goes away or ctx ends.
//
// It is an SDK client of the server's /mcp and an SDK server on t that
// offers the remote tools as its own and forwards each call, with its
// progress notifications back and its cancellation forth: the server stays
// the only place tools, scopes and limits are defined. A bridge of raw
// JSON-RPC messages would be less code, but the SDK's streamable client
// keeps the session id and negotiated protocol version, which each request
// must carry, only for sessions its own Client drives.
func Bridge(ctx context.Context, cfg BridgeConfig, t sdk.Transport) error {
	hc := &http.Client{}
	if cfg.HTTPClient != nil {
		*hc = *cfg.HTTPClient
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc.Transport = bearer{token: cfg.Token, next: base}

	b := &bridge{calls: map[string]progressTarget{}}
	b.local = sdk.NewServer(&sdk.Implementation{Name: "sandboxd", Version: cfg.Version},
		&sdk.ServerOptions{Capabilities: &sdk.ServerCapabilities{}})
	client := sdk.NewClient(&sdk.Implementation{Name: "sandboxd-mcp-bridge", Version: cfg.Version}, &sdk.ClientOptions{
		// The server closes a session after sessionTimeout without a
		// request; a desktop agent may sit idle longer than that.
		KeepAlive:                   sessionTimeout / 6,
		ProgressNotificationHandler: b.progress,
		ToolListChangedHandler: func(ctx context.Context, _ *sdk.ToolListChangedRequest) {
			_ = b.syncTools(ctx) // a failure leaves the last list; calls still reach the server
		},
	})
	endpoint := strings.TrimSuffix(cfg.URL, "/") + "/mcp"
	remote, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", endpoint, err)
	}
	defer remote.Close()
	b.remote = remote
	if err := b.syncTools(ctx); err != nil {
		return err
	}
	return b.local.Run(ctx, t)
}

type bridge struct {
	local  *sdk.Server
	remote *sdk.ClientSession

	next  atomic.Int64
	mu    sync.Mutex
	calls map[string]progressTarget // the bridge's progress token -> the caller's
	tools map[string]bool           // names offered
}

// progressTarget is where a forwarded call's progress goes back to.
type progressTarget struct {
	session *sdk.ServerSession
	token   any
}

// syncTools offers the server's current tools, and no longer those it
// dropped.
func (b *bridge) syncTools(ctx context.Context) error {
	now := map[string]bool{}
	for tool, err := range b.remote.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("list the server's tools: %w", err)
		}
		b.local.AddTool(tool, b.forward) // replaces a tool of that name
		now[tool.Name] = true
	}
	b.mu.Lock()
	var gone []string
	for name := range b.tools {
		if !now[name] {
			gone = append(gone, name)
		}
	}
	b.tools = now
	b.mu.Unlock()
	b.local.RemoveTools(gone...)
	return nil
}

// forward makes one call on the server with the caller's arguments. The
// caller's progress token is replaced by one of the bridge's, so that
// tokens of calls in flight never clash on the server's session.
func (b *bridge) forward(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
	p := &sdk.CallToolParams{Name: req.Params.Name, Arguments: req.Params.Arguments}
	if tok := req.Params.GetProgressToken(); tok != nil {
		id := "bridge-" + strconv.FormatInt(b.next.Add(1), 10)
		b.mu.Lock()
		b.calls[id] = progressTarget{session: req.Session, token: tok}
		b.mu.Unlock()
		defer func() {
			b.mu.Lock()
			delete(b.calls, id)
			b.mu.Unlock()
		}()
		p.SetProgressToken(id)
	}
	// Cancelling ctx (the caller cancelled) makes the SDK client send the
	// server a cancellation, which kills a running command.
	return b.remote.CallTool(ctx, p)
}

// progress passes a server's progress notification back to the caller.
func (b *bridge) progress(ctx context.Context, req *sdk.ProgressNotificationClientRequest) {
	id, _ := req.Params.ProgressToken.(string)
	b.mu.Lock()
	to, ok := b.calls[id]
	b.mu.Unlock()
	if !ok {
		return
	}
	p := *req.Params
	p.ProgressToken = to.token
	_ = to.session.NotifyProgress(ctx, &p)
}

// bearer adds the token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
