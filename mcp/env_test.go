package mcp_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/mcp"
	"github.com/sandboxd/sandboxd/ratelimit"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/local/localtest"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server"
	"github.com/sandboxd/sandboxd/server/native"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/store/storetest"
	"github.com/sandboxd/sandboxd/template"
	"github.com/sandboxd/sandboxd/tenant"
	"github.com/sandboxd/sandboxd/workspace"
)

// The tools run against a real sandbox.Manager on the real local backend
// (root, cgroups, an envd built here), over the SDK's in-memory transport
// or over HTTP through the real server.

var (
	envdBin    string
	skipReason string // why sandboxes cannot be created here
)

func TestMain(m *testing.M) {
	local.Init() // libcontainer re-executes the test binary as container init
	os.Exit(localtest.Main(m, &envdBin, &skipReason))
}

var testSecret = []byte("mcp-test-secret-0123456789abcdef-0123")

// env is a store, a Manager on the local backend, the MCP server on it,
// and the whole HTTP server (native auth, /mcp) on loopback.
type env struct {
	t    *testing.T
	st   *store.Store
	mgr  *sandbox.Manager
	mcp  *mcp.Server
	be   *local.Backend
	http *httptest.Server
	keys map[string]string // tenant -> API key
}

// newEnv starts an env; limits, if not nil, rate-limits the HTTP server's
// tenants.
func newEnv(t *testing.T, limits *ratelimit.Tenants) *env {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	st, keys := storetest.Open(t, "acme", "other")
	// Writers tracked: sandbox_changes names them (TestWorkspaceWriters).
	be := localtest.New(t, "sandboxd-mcptest", envdBin, netip.MustParsePrefix("10.173.0.0/16"), log,
		func(o *local.Options) { o.TrackWriters = true })
	// Templates keeps the versions sandbox_publish makes, and starts
	// sandboxes of them; the backend's own template is "base".
	builds, err := template.New(template.Config{Store: st, Backend: be, Layered: be, Dir: t.TempDir(), Log: log,
		Builtin: func(name string) bool { return name == "base" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(builds.Close)
	mgr := sandbox.New(sandbox.Config{Store: st, Log: log, Backend: be, BackendName: "local", EnvdVersion: "0.6.13",
		Templates: builds})
	ws := workspace.New(workspace.Config{Manager: mgr, Differ: be, Templates: builds, Log: log})
	nat := native.New(native.Config{Manager: mgr, Workspace: ws, Log: log})
	e := &env{t: t, st: st, mgr: mgr, keys: keys, be: be,
		mcp: mcp.New(mcp.Config{Sandboxes: mgr, Envd: nat, Workspace: ws, Log: log, Version: "test"})}
	e.http = httptest.NewServer(server.New(server.Config{Manager: mgr, Store: st, Log: log, EnvdVersion: "0.6.13",
		JWT: jwtauth.NewVerifier(testSecret, nil), Limits: limits, Builds: builds, Differ: be}))
	t.Cleanup(e.http.Close)
	return e
}

func (e *env) token(tn string, scopes ...string) string {
	e.t.Helper()
	tok, err := jwtauth.Issue(testSecret, tn, scopes, time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// progressLog collects the progress notifications a client receives.
type progressLog struct {
	mu   sync.Mutex
	got  []*sdk.ProgressNotificationParams
	seen chan struct{} // gets a value per notification (non-blocking)
}

func newProgressLog() *progressLog { return &progressLog{seen: make(chan struct{}, 1000)} }

func (p *progressLog) handler(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
	p.mu.Lock()
	p.got = append(p.got, req.Params)
	p.mu.Unlock()
	select {
	case p.seen <- struct{}{}:
	default:
	}
}

func (p *progressLog) all() []*sdk.ProgressNotificationParams {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*sdk.ProgressNotificationParams(nil), p.got...)
}

// session connects an SDK client to the MCP server over an in-memory
// transport, as tenant tn with scopes.
func (e *env) session(tn string, progress *progressLog, scopes ...string) *sdk.ClientSession {
	e.t.Helper()
	ctx := tenant.WithContext(context.Background(), tenant.ID(tn))
	ctx = native.WithScopes(ctx, scopes)
	st, ct := sdk.NewInMemoryTransports()
	ss, err := e.mcp.MCP().Connect(ctx, st, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { ss.Close() })
	return connectClient(e.t, ct, progress)
}

func connectClient(t *testing.T, tr sdk.Transport, progress *progressLog) *sdk.ClientSession {
	t.Helper()
	opts := &sdk.ClientOptions{}
	if progress != nil {
		opts.ProgressNotificationHandler = progress.handler
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, opts).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// httpSession connects an SDK client to the HTTP server's /mcp with token
// as bearer.
func (e *env) httpSession(token string, progress *progressLog) *sdk.ClientSession {
	e.t.Helper()
	return connectClient(e.t, &sdk.StreamableClientTransport{Endpoint: e.http.URL + "/mcp",
		HTTPClient: bearerClient(token)}, progress)
}

// call calls a tool and decodes its structured output into out (may be
// nil); it returns the result's text when the call is a tool error, and ""
// otherwise.
func call(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, out any) (toolErr string) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return decode(t, name, res, out)
}

func decode(t *testing.T, name string, res *sdk.CallToolResult, out any) string {
	t.Helper()
	if res.IsError {
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*sdk.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return b.String()
	}
	if out != nil {
		raw, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: decode %s: %v", name, raw, err)
		}
	}
	return ""
}

// mustCall is call that fails the test on a tool error.
func mustCall(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, out any) {
	t.Helper()
	if msg := call(t, cs, name, args, out); msg != "" {
		t.Fatalf("%s(%v): tool error %q", name, args, msg)
	}
}

type sandboxOut struct {
	ID       string            `json:"sandbox_id"`
	State    string            `json:"state"`
	Template string            `json:"template"`
	Metadata map[string]string `json:"metadata"`
}

type execOut struct {
	Stdout      string `json:"stdout"`
	Stderr      string `json:"stderr"`
	ExitCode    int    `json:"exit_code"`
	Signal      string `json:"signal"`
	TimedOut    bool   `json:"timed_out"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
}

// create makes a sandbox through the tool and kills it at cleanup.
func (e *env) create(cs *sdk.ClientSession, args map[string]any) sandboxOut {
	e.t.Helper()
	var sb sandboxOut
	mustCall(e.t, cs, "sandbox_create", args, &sb)
	if sb.ID == "" || sb.State != "running" {
		e.t.Fatalf("sandbox_create: %+v", sb)
	}
	e.t.Cleanup(func() {
		ctx := tenant.WithContext(context.Background(), tenant.ID("acme"))
		_ = e.mgr.Kill(ctx, sb.ID) // gone already is fine
	})
	return sb
}

var full = []string{jwtauth.ScopeRead, jwtauth.ScopeWrite}
