package server

import (
	"context"
	"net/http"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/mcp"
	"github.com/sandboxd/sandboxd/ratelimit"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/server/native"
	"github.com/sandboxd/sandboxd/tenant"
)

// MCPPath is where sandboxd serves MCP over streamable HTTP.
const MCPPath = "/mcp"

// newMCP returns the MCP endpoint: the native API's auth (a JWT's scopes,
// or an API key with every scope; 401 without), then the MCP server, which
// checks each tool's scope and charges each call to its tenant's rate-limit
// class. It shares the native API's envd connections.
func newMCP(cfg Config, lm *limitMetrics, nat *native.API, ws mcp.Workspace) http.Handler {
	m := mcp.New(mcp.Config{Sandboxes: cfg.Manager, Envd: nat, Workspace: ws, Limit: mcpLimit(cfg.Limits, lm),
		Log: cfg.Log, IdleTTL: cfg.NativeIdleTTL, Version: cfg.Version})
	return nativeAuthenticate(cfg.Store, cfg.JWT, cfg.Log)(m.Handler())
}

// mcpLimit is limitTenants for MCP, where one HTTP request is any call: it
// charges a call to the class the MCP server names (a tool's, or read) and
// refuses it with the REST surfaces' message.
func mcpLimit(l *ratelimit.Tenants, lm *limitMetrics) mcp.Limiter {
	if l == nil {
		return nil
	}
	return func(ctx context.Context, c tenant.Class) error {
		t, _ := tenant.FromContext(ctx)
		d := l.Allow(t, c)
		if d.Limit.Unlimited() || d.Allowed {
			return nil
		}
		lm.rejected(string(t), string(c))
		return errdefs.New(errdefs.ErrRateLimited, httpx.LimitMessage(d, string(c), httpx.RetryAfter(d)))
	}
}
