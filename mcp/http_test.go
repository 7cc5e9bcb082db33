package mcp_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/mcp"
	"github.com/sandboxd/sandboxd/ratelimit"
	"github.com/sandboxd/sandboxd/tenant"
)

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`

func post(t *testing.T, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(initBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestHTTP: /mcp authenticates like the native API (JWT scopes, API keys
// with every scope, 401 without), and a session is its tenant's.
func TestHTTP(t *testing.T) {
	e := newEnv(t, nil)
	url := e.http.URL + "/mcp"
	for name, hdr := range map[string]map[string]string{
		"no credentials": nil,
		"bad token":      {"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.e30.x"},
		"bad key":        {"Authorization": "Bearer e2b_0000000000000000000000000000000000000000"},
	} {
		if resp := post(t, url, hdr); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, resp.StatusCode)
		}
	}
	// An API key as X-API-KEY opens a session too.
	if resp := post(t, url, map[string]string{"X-API-KEY": e.keys["acme"]}); resp.StatusCode != http.StatusOK {
		t.Errorf("X-API-KEY: %d", resp.StatusCode)
	}

	// A read-only JWT lists but does not create.
	ro := e.httpSession(e.token("acme", jwtauth.ScopeRead), nil)
	if msg := call(t, ro, "sandbox_create", nil, nil); msg != "permission_denied: missing scope sandboxes:write" {
		t.Errorf("sandbox_create with a read-only JWT: %q", msg)
	}
	mustCall(t, ro, "sandbox_list", nil, nil)

	// An API key as bearer has every scope: a sandbox's whole life.
	pl := newProgressLog()
	cs := e.httpSession(e.keys["acme"], pl)
	sb := e.create(cs, nil)
	var x execOut
	mustCall(t, cs, "sandbox_exec", map[string]any{"sandbox_id": sb.ID, "command": "echo over http"}, &x)
	if x.Stdout != "over http\n" {
		t.Errorf("sandbox_exec over HTTP: %+v", x)
	}
	execCancelKills(t, cs, pl, sb.ID) // progress and cancellation over streamable HTTP

	// Another tenant's credential on acme's session is refused: the
	// session is bound to the tenant that opened it.
	hdr := map[string]string{"Authorization": "Bearer " + e.keys["other"], "Mcp-Session-Id": cs.ID(),
		"Mcp-Protocol-Version": cs.InitializeResult().ProtocolVersion}
	if resp := post(t, url, hdr); resp.StatusCode != http.StatusForbidden {
		t.Errorf("another tenant on acme's session: %d, want 403", resp.StatusCode)
	}
	// And through its own session, acme's sandbox does not exist.
	oc := e.httpSession(e.token("other", jwtauth.ScopeRead, jwtauth.ScopeWrite), nil)
	if msg := call(t, oc, "sandbox_kill", map[string]any{"sandbox_id": sb.ID}, nil); !strings.HasPrefix(msg, "not_found:") {
		t.Errorf("other kills acme's sandbox: %q", msg)
	}
	mustCall(t, cs, "sandbox_kill", map[string]any{"sandbox_id": sb.ID}, nil)
}

// TestHTTPScopesPerRequest: over HTTP a call acts with the credential it
// carries, not with the one that opened the session.
func TestHTTPScopesPerRequest(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.token("acme", jwtauth.ScopeRead, jwtauth.ScopeWrite)
	cs := connectClient(t, &sdk.StreamableClientTransport{Endpoint: e.http.URL + "/mcp",
		HTTPClient: &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+tok)
			return http.DefaultTransport.RoundTrip(r)
		})}}, nil)
	mustCall(t, cs, "sandbox_list", nil, nil)
	tok = e.token("acme", jwtauth.ScopeRead) // the agent's next token is read-only
	if msg := call(t, cs, "sandbox_kill", map[string]any{"sandbox_id": "whatever"}, nil); msg != "permission_denied: missing scope sandboxes:write" {
		t.Errorf("sandbox_kill with a read-only token on a session opened with write: %q", msg)
	}
}

// TestRateLimit: tool calls are charged to their tool's class, and a
// refusal is a tool error with the REST surfaces' message.
func TestRateLimit(t *testing.T) {
	lim := &ratelimit.Tenants{Limiter: ratelimit.New(0, nil), Policy: ratelimit.Policy{Defaults: map[tenant.Class]ratelimit.Limit{
		tenant.Lifecycle: {Rate: 0.001, Burst: 2},
		tenant.Read:      {Rate: 0.001, Burst: 10},
	}}}
	e := newEnv(t, lim)
	cs := e.httpSession(e.keys["acme"], nil)
	for i := range 2 {
		if msg := call(t, cs, "sandbox_kill", map[string]any{"sandbox_id": "nosuchsandbox"}, nil); !strings.HasPrefix(msg, "not_found:") {
			t.Fatalf("kill %d: %q", i, msg)
		}
	}
	msg := call(t, cs, "sandbox_kill", map[string]any{"sandbox_id": "nosuchsandbox"}, nil)
	if !strings.HasPrefix(msg, "resource_exhausted: rate limit exceeded for lifecycle requests") {
		t.Errorf("third kill: %q", msg)
	}
	mustCall(t, cs, "sandbox_list", nil, nil) // reads are another class
	refused := ""
	for i := 0; i < 10 && refused == ""; i++ {
		refused = call(t, cs, "sandbox_list", nil, nil)
	}
	if !strings.HasPrefix(refused, "resource_exhausted: rate limit exceeded for read requests") {
		t.Errorf("past the read burst: %q", refused)
	}
	// Requests other than tool calls are reads too.
	if _, err := cs.ListTools(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "rate limit exceeded for read requests") {
		t.Errorf("tools/list past the read limit: %v", err)
	}
	// Another tenant has its own buckets.
	if msg := call(t, e.httpSession(e.keys["other"], nil), "sandbox_kill", map[string]any{"sandbox_id": "x"}, nil); !strings.HasPrefix(msg, "not_found:") {
		t.Errorf("another tenant's kill: %q", msg)
	}
}

// TestBridge: the stdio bridge offers the server's tools and forwards
// calls, progress and cancellation.
func TestBridge(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	st, ct := sdk.NewInMemoryTransports()
	done := make(chan error, 1)
	go func() {
		done <- mcp.Bridge(ctx, mcp.BridgeConfig{URL: e.http.URL, Token: e.token("acme", jwtauth.ScopeRead, jwtauth.ScopeWrite)}, st)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the bridge did not end")
		}
	})
	pl := newProgressLog()
	cs := connectClient(t, ct, pl)
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 12 {
		t.Fatalf("tools through the bridge: %v %v", tools, err)
	}
	sb := e.create(cs, nil)
	var x execOut
	mustCall(t, cs, "sandbox_exec", map[string]any{"sandbox_id": sb.ID, "command": "echo bridged"}, &x)
	if x.Stdout != "bridged\n" {
		t.Errorf("sandbox_exec through the bridge: %+v", x)
	}
	execCancelKills(t, cs, pl, sb.ID)
	mustCall(t, cs, "sandbox_kill", map[string]any{"sandbox_id": sb.ID}, nil)

	// A bad token fails at start, saying why.
	st2, _ := sdk.NewInMemoryTransports()
	err = mcp.Bridge(ctx, mcp.BridgeConfig{URL: e.http.URL, Token: "e2b_nope"}, st2)
	if err == nil || !strings.Contains(err.Error(), "401") && !strings.Contains(strings.ToLower(err.Error()), "unauthorized") {
		t.Errorf("bridge with a bad token: %v", err)
	}
}
