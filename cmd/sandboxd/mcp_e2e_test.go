package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPE2E: the real sandboxd serves its MCP tools at /mcp over
// streamable HTTP to the Go SDK's client with a JWT from `sandboxd token
// create`, and `sandboxd mcp` serves them over stdio.
func TestMCPE2E(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s := e.start()
	out, _ := e.sandboxdCLI(t, "token", "create", "--data-dir", e.dataDir, "--tenant", "alice")
	jwt := strings.TrimSpace(out)

	resp, err := http.Post(s.base+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /mcp without credentials: %d, want 401", resp.StatusCode)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := sdk.NewClient(&sdk.Implementation{Name: "e2e", Version: "1"}, nil)
	e2eMCPSandbox(ctx, t, e, e2eMCPSession(ctx, t, s, jwt), "over http")

	// stdio: sandboxd mcp, the token from SANDBOXD_TOKEN.
	cmd := exec.Command(filepath.Join(e2eBinDir, "sandboxd"), "mcp", "--url", s.base)
	cmd.Env = append(e2eSandboxdEnviron(), "SANDBOXD_TOKEN="+jwt)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdio, err := client.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("sandboxd mcp: %v\n%s", err, stderr.String())
	}
	e2eMCPSandbox(ctx, t, e, stdio, "over stdio")
	if err := stdio.Close(); err != nil {
		t.Errorf("sandboxd mcp did not exit cleanly when its stdin closed: %v\n%s", err, stderr.String())
	}
}

// e2eMCPSandbox lists the tools, then creates a sandbox, runs a command,
// writes and reads a file and kills it, through cs.
func e2eMCPSandbox(ctx context.Context, t *testing.T, e *e2eEnv, cs *sdk.ClientSession, how string) {
	t.Helper()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 12 {
		t.Fatalf("%s: tools/list: %v %v", how, tools, err)
	}
	callTool := func(name string, args map[string]any, out any) {
		t.Helper()
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %s: %v", how, name, err)
		}
		raw, _ := json.Marshal(res.StructuredContent)
		if res.IsError {
			t.Fatalf("%s: %s: tool error %+v", how, name, res.Content[0])
		}
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: %s: %s: %v", how, name, raw, err)
		}
	}
	var sb struct {
		ID string `json:"sandbox_id"`
	}
	callTool("sandbox_create", nil, &sb)
	e.track(sb.ID, e.keys["alice"])
	var x struct {
		Stdout   string
		ExitCode int `json:"exit_code"`
	}
	callTool("sandbox_exec", map[string]any{"sandbox_id": sb.ID, "command": "echo " + how + "; exit 4"}, &x)
	if x.Stdout != how+"\n" || x.ExitCode != 4 {
		t.Errorf("%s: sandbox_exec: %+v", how, x)
	}
	var w struct{ Path string }
	callTool("sandbox_write_file", map[string]any{"sandbox_id": sb.ID, "path": "f.txt", "content": how}, &w)
	var r struct{ Content, Encoding string }
	callTool("sandbox_read_file", map[string]any{"sandbox_id": sb.ID, "path": w.Path}, &r)
	if r.Content != how || r.Encoding != "text" {
		t.Errorf("%s: sandbox_read_file: %+v", how, r)
	}
	// The workspace tools: what it changed, as a patch, published.
	var ch struct {
		Changes []struct{ Path, Kind string }
	}
	callTool("sandbox_changes", map[string]any{"sandbox_id": sb.ID}, &ch)
	found := false
	for _, c := range ch.Changes {
		found = found || c.Path == w.Path && c.Kind == "added"
	}
	if !found {
		t.Errorf("%s: sandbox_changes lacks %s: %+v", how, w.Path, ch)
	}
	var d struct{ Patch string }
	callTool("sandbox_diff", map[string]any{"sandbox_id": sb.ID}, &d)
	if !strings.Contains(d.Patch, "+++ b"+w.Path+"\n@@ -0,0 +1 @@\n+"+how+"\n") {
		t.Errorf("%s: sandbox_diff: %q", how, d.Patch)
	}
	var v struct {
		Template string
		Version  int
	}
	name := "mcp-" + strings.ReplaceAll(how, " ", "-")
	callTool("sandbox_publish", map[string]any{"sandbox_id": sb.ID, "template": name}, &v)
	if v.Template != name || v.Version != 1 {
		t.Errorf("%s: sandbox_publish: %+v", how, v)
	}
	var k struct{ Killed bool }
	callTool("sandbox_kill", map[string]any{"sandbox_id": sb.ID}, &k)
	if !k.Killed {
		t.Errorf("%s: sandbox_kill: %+v", how, k)
	}
}

// e2eMCPSession connects the Go SDK's client to s's /mcp over streamable
// HTTP with token; the session ends with the test.
func e2eMCPSession(ctx context.Context, t *testing.T, s *e2eServer, token string) *sdk.ClientSession {
	t.Helper()
	client := sdk.NewClient(&sdk.Implementation{Name: "e2e", Version: "1"}, nil)
	hc := &http.Client{Transport: e2eBearer{token: token}}
	cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: s.base + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// e2eToolError calls tool name and returns its tool error's text; a
// transport error or a success fails the test.
func e2eToolError(ctx context.Context, t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v, want a tool error", name, err)
	}
	if !res.IsError || len(res.Content) == 0 {
		t.Fatalf("%s: %+v, want a tool error", name, res.StructuredContent)
	}
	text, _ := res.Content[0].(*sdk.TextContent)
	if text == nil {
		t.Fatalf("%s: tool error %+v, want text", name, res.Content[0])
	}
	return text.Text
}

// TestMCPQuotaE2E: MCP tool calls are held to the tenant's quotas and rate
// limits as its REST calls are: a sandbox_create over the sandbox quota is
// a tool error naming the quota and makes nothing, and MCP calls draw on
// the same rate-limit buckets as REST.
func TestMCPQuotaE2E(t *testing.T) {
	e := newE2EEnv(t, "a", "b")
	e.sandboxdCLI(t, "tenants", "set", "a", "--data-dir", e.dataDir, "--max-sandboxes", "1")
	e.sandboxdCLI(t, "tenants", "set", "b", "--data-dir", e.dataDir, "--lifecycle-rate", "0.001", "--lifecycle-burst", "2")
	s := e.start()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	jwt := func(tenant string) string {
		out, _ := e.sandboxdCLI(t, "token", "create", "--data-dir", e.dataDir, "--tenant", tenant)
		return strings.TrimSpace(out)
	}

	t.Run("sandbox quota", func(t *testing.T) {
		cs := e2eMCPSession(ctx, t, s, jwt("a"))
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "sandbox_create", Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Fatalf("the first sandbox_create: %v %+v", err, res)
		}
		var sb struct {
			ID string `json:"sandbox_id"`
		}
		raw, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(raw, &sb)
		e.track(sb.ID, e.keys["a"])
		msg := e2eToolError(ctx, t, cs, "sandbox_create", map[string]any{})
		if !strings.HasPrefix(msg, "resource_exhausted: sandbox quota reached: 1 of 1 live sandboxes") {
			t.Errorf("sandbox_create over the quota: %q, want the quota named", msg)
		}
		if l, _ := s.list(t, e.keys["a"], ""); !slices.Equal(e2eIDs(l), []string{sb.ID}) {
			t.Errorf("sandboxes after the refused create: %v, want %s alone", e2eIDs(l), sb.ID)
		}
	})

	t.Run("rate limit", func(t *testing.T) {
		cs := e2eMCPSession(ctx, t, s, jwt("b"))
		// One lifecycle call over REST, one over MCP: b's burst of two.
		wantStatus(t, "REST kill", s.api(t, http.MethodDelete, "/sandboxes/nosuchsandbox", e.keys["b"], nil), http.StatusNotFound)
		if msg := e2eToolError(ctx, t, cs, "sandbox_kill", map[string]any{"sandbox_id": "nosuchsandbox"}); !strings.HasPrefix(msg, "not_found:") {
			t.Errorf("the MCP kill within the burst: %q", msg)
		}
		msg := e2eToolError(ctx, t, cs, "sandbox_kill", map[string]any{"sandbox_id": "nosuchsandbox"})
		if !strings.HasPrefix(msg, "resource_exhausted: rate limit exceeded for lifecycle requests") {
			t.Errorf("the MCP kill past the burst: %q, want the rate limit", msg)
		}
		wantStatus(t, "REST kill past the burst", s.api(t, http.MethodDelete, "/sandboxes/nosuchsandbox", e.keys["b"], nil), http.StatusTooManyRequests)
		// Another class, and another tenant, have their own buckets.
		if _, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "sandbox_list", Arguments: map[string]any{}}); err != nil {
			t.Errorf("sandbox_list (read) after the lifecycle burst: %v", err)
		}
		if msg := e2eToolError(ctx, t, e2eMCPSession(ctx, t, s, jwt("a")), "sandbox_kill", map[string]any{"sandbox_id": "nosuchsandbox"}); !strings.HasPrefix(msg, "not_found:") {
			t.Errorf("a's kill: %q", msg)
		}
	})
}

// e2eBearer sends token as a bearer on every request.
type e2eBearer struct{ token string }

func (b e2eBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}
