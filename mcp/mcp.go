// Package mcp serves sandboxd's sandboxes to AI agents as Model Context
// Protocol tools, on the official Go SDK (github.com/modelcontextprotocol/go-sdk).
// It owns the tools (their input schemas, descriptions, scopes and
// rate-limit classes), the streamable HTTP handler that the server mounts
// at /mcp behind the native API's auth, and the stdio bridge of `sandboxd
// mcp`. Tools reach sandboxes only through the lifecycle manager, with the
// caller's tenant in the context, and through the envd connections the
// native API hands out: tenancy, quotas, idle TTLs and audit lines are
// those of the REST surfaces.
package mcp

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/native"
	"github.com/sandboxd/sandboxd/tenant"
)

// Sandboxes is the lifecycle as the tools use it (*sandbox.Manager): every
// call acts for the tenant in ctx, and another tenant's sandbox is not found.
type Sandboxes interface {
	CreateView(ctx context.Context, req sandbox.CreateRequest) (sandbox.View, error)
	ListViews(ctx context.Context, f sandbox.ListFilter) ([]sandbox.View, string, error)
	Kill(ctx context.Context, id string) error
}

// Envd connects to a running sandbox's envd as a user, for the tenant in
// ctx (*native.API); done ends the activity the connection counts as.
type Envd interface {
	Envd(ctx context.Context, id, user string) (c *envdconn.Client, done func(), err error)
}

// Limiter charges one call of class c to the tenant in ctx; an error (of
// kind errdefs.ErrRateLimited) refuses the call.
type Limiter func(ctx context.Context, c tenant.Class) error

// Config wires a Server.
type Config struct {
	Sandboxes Sandboxes
	Envd      Envd
	// Workspace serves the workspace tools; nil leaves them out.
	Workspace Workspace
	// Limit rate-limits tool calls by the class of each tool, and every
	// other request as a read; nil: no limits.
	Limit Limiter
	Log   *slog.Logger
	// IdleTTL is the idle TTL of the sandboxes sandbox_create makes, as
	// for the native API's creates (sandboxd serve --native-idle-ttl).
	IdleTTL time.Duration
	Version string
}

// Server is sandboxd's MCP server.
type Server struct {
	cfg Config
	srv *sdk.Server
}

const instructions = `Tools to run code in isolated Linux sandboxes (sandboxd). ` +
	`Create a sandbox with sandbox_create, run shell commands in it with sandbox_exec, move files with ` +
	`sandbox_write_file, sandbox_read_file and sandbox_list_files, and kill it with sandbox_kill when done ` +
	`(it is killed anyway when its timeout passes). sandbox_list finds the sandboxes you already have. ` +
	`sandbox_changes and sandbox_diff show what a sandbox changed against its template, sandbox_export hands ` +
	`all of it over as a patch or a tar, sandbox_publish makes those changes the next version of a template, ` +
	`and template_versions lists that template's versions.`

// New returns the MCP server with every tool registered.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg}
	s.srv = sdk.NewServer(&sdk.Implementation{Name: "sandboxd", Version: cfg.Version},
		&sdk.ServerOptions{Instructions: instructions, Capabilities: &sdk.ServerCapabilities{}})
	s.srv.AddReceivingMiddleware(s.identify)
	s.registerTools()
	return s
}

// registerTools adds every tool: one addTool call each, naming the scope
// the tool needs and the rate-limit class it is charged to. Scopes are the
// native API's for the same operation: reading a sandbox's files goes
// through its envd, which takes sandboxes:write there (a read-only token
// sees sandboxes, not their contents); its changes, their patch and its
// template's versions are sandboxes:read, and their export (which may
// finalize) sandboxes:write, as there.
func (s *Server) registerTools() {
	const read, write = jwtauth.ScopeRead, jwtauth.ScopeWrite
	addTool(s, createTool, write, tenant.Create, s.create)
	addTool(s, listTool, read, tenant.Read, s.list)
	addTool(s, killTool, write, tenant.Lifecycle, s.kill)
	addTool(s, execTool, write, tenant.Lifecycle, s.exec)
	addTool(s, writeFileTool, write, tenant.Lifecycle, s.writeFile)
	addTool(s, readFileTool, write, tenant.Read, s.readFile)
	addTool(s, listFilesTool, write, tenant.Read, s.listFiles)
	if s.cfg.Workspace != nil {
		addTool(s, changesTool, read, tenant.Read, s.changes)
		addTool(s, diffTool, read, tenant.Read, s.diff)
		addTool(s, exportTool, write, tenant.Read, s.export)
		addTool(s, publishTool, write, tenant.Lifecycle, s.publish)
		addTool(s, versionsTool, read, tenant.Read, s.versions)
	}
}

// MCP is the SDK server, for transports other than HTTP: the context a
// session is connected with must carry the tenant (tenant.WithContext) and
// the scopes (native.WithScopes) of its caller.
func (s *Server) MCP() *sdk.Server { return s.srv }

// sessionTimeout closes an HTTP session after this long without a request:
// an agent that went away leaves no session behind.
const sessionTimeout = 30 * time.Minute

// Handler serves MCP over streamable HTTP. It must run behind the native
// API's auth, which puts the caller's tenant and scopes in the request's
// context.
func (s *Server) Handler() http.Handler {
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s.srv }, &sdk.StreamableHTTPOptions{
		SessionTimeout: sessionTimeout,
		Logger:         s.cfg.Log,
		// The SDK refuses a loopback connection with another Host, against
		// DNS rebinding of unauthenticated local servers; every request
		// here needs a credential a rebinding page does not have, and a
		// reverse proxy on the same host connects over loopback.
		DisableLocalhostProtection: true,
	})
	return withTokenInfo(h)
}

// identify puts the caller's tenant and scopes into the context of each
// request of a session. Over HTTP they are those of the request itself
// (RequestExtra.TokenInfo, see withTokenInfo): a session's calls then act
// with the credential each one carries, not with the one that opened the
// session. Over other transports they are those of the context the session
// was connected with. Requests other than tool calls are charged as reads.
func (s *Server) identify(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		if ex := req.GetExtra(); ex != nil && ex.TokenInfo != nil {
			ctx = tenant.WithContext(ctx, tenant.ID(ex.TokenInfo.UserID))
			ctx = native.WithScopes(ctx, ex.TokenInfo.Scopes)
		}
		if _, ok := tenant.FromContext(ctx); !ok {
			return nil, errors.New("unauthenticated: no tenant")
		}
		if method != "tools/call" && !strings.HasPrefix(method, "notifications/") && s.cfg.Limit != nil {
			if err := s.cfg.Limit(ctx, tenant.Read); err != nil {
				return nil, err
			}
		}
		return next(ctx, method, req)
	}
}

// addTool registers a typed tool whose calls need scope and are charged to
// class. A refused call, and any failure of h, is a tool error (isError)
// whose text starts with the native API's error code
// ("permission_denied: missing scope sandboxes:write", "not_found: ...").
func addTool[In sandboxRef, Out any](s *Server, t *sdk.Tool, scope string, class tenant.Class,
	h func(context.Context, *sdk.CallToolRequest, In) (Out, error)) {
	sdk.AddTool(s.srv, t, func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, Out, error) {
		start := time.Now()
		var out Out
		err := s.admit(ctx, scope, class)
		if err == nil {
			out, err = h(ctx, req, in)
		}
		id := in.sandbox()
		if r, ok := any(out).(sandboxRef); ok && id == "" {
			id = r.sandbox()
		}
		t, _ := tenant.FromContext(ctx)
		attrs := []any{"tool", req.Params.Name, "tenant", string(t), "sandbox_id", id,
			"duration_ms", float64(time.Since(start).Microseconds()) / 1000}
		if err != nil {
			var zero Out
			return nil, zero, s.toolError(ctx, err, attrs)
		}
		s.cfg.Log.InfoContext(ctx, "mcp tool call", attrs...)
		return nil, out, nil
	})
}

// sandboxRef is a tool's input or output, which may name a sandbox (for
// the log line of the call).
type sandboxRef interface{ sandbox() string }

// admit checks the caller's scope, then its rate limit.
func (s *Server) admit(ctx context.Context, scope string, class tenant.Class) error {
	if !native.HasScope(ctx, scope) {
		return errPermission(scope)
	}
	if s.cfg.Limit != nil {
		return s.cfg.Limit(ctx, class)
	}
	return nil
}

// toolError is what the caller is told of err, as the native API tells it:
// the error code and the public message; a cause of a 5xx is logged, not
// shown.
func (s *Server) toolError(ctx context.Context, err error, attrs []any) error {
	status, code, msg, public := native.Describe(err)
	attrs = append(attrs, "status", status, "err", err)
	switch {
	case errors.Is(err, context.Canceled):
		s.cfg.Log.InfoContext(ctx, "mcp tool call cancelled", attrs...)
		return err
	case status >= 500 && !public:
		s.cfg.Log.ErrorContext(ctx, "mcp tool call failed", attrs...)
		msg += " (see sandboxd's log)"
	default:
		s.cfg.Log.InfoContext(ctx, "mcp tool call refused", attrs...)
	}
	return errors.New(code + ": " + msg)
}

// errPermission is the native API's refusal of a call without scope.
func errPermission(scope string) error {
	return errdefs.New(errdefs.ErrPermissionDenied, "missing scope "+scope)
}
