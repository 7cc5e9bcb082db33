package envd

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/api/process/processconnect"
	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
)

// testServer is where a test reaches envd: an in-process Server behind an
// httptest server, or, with ENVD_TEST_BINARY set, an agent binary (package
// agenttest) configured the same way.
type testServer struct {
	URL   string
	agent *agenttest.Agent // against a binary only
}

// newTestServer returns the in-process Server (nil against a binary) and
// where to reach it.
func newTestServer(t *testing.T) (*Server, *testServer) {
	t.Helper()
	if agenttest.Enabled() {
		a := agenttest.Start(t, agenttest.Options{DefaultUser: "root", Disk: t.TempDir()})
		return nil, &testServer{URL: a.URL, agent: a}
	}
	s := New(Config{Log: slog.New(slog.DiscardHandler), DefaultUser: "root", DiskPath: t.TempDir()})
	t.Cleanup(s.Close)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, &testServer{URL: ts.URL}
}

// defaults are the default user and workdir: read from the in-process
// Server, or, against a binary, seen by a command started with neither
// (its user and working directory), through the process API.
func defaults(t *testing.T, s *Server, ts *testServer) (user, workdir string) {
	t.Helper()
	if s != nil {
		return s.defaults.User(), s.defaults.Workdir()
	}
	client := processconnect.NewProcessClient(http.DefaultClient, ts.URL, connect.WithProtoJSON())
	stream, err := client.Start(t.Context(), connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "id -un; pwd"}},
	}))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		out.Write(stream.Msg().GetEvent().GetData().GetStdout())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("Start stream: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("id -un; pwd printed %q", out.String())
	}
	return lines[0], lines[1]
}

func do(t *testing.T, method, url, body string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// errorBody checks the E2B error shape: JSON whose code equals the status.
func errorBody(t *testing.T, resp *http.Response, body string) string {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != resp.StatusCode || e.Message == "" {
		t.Fatalf("error body %q for status %d: want {code:%d, message}", body, resp.StatusCode, resp.StatusCode)
	}
	return e.Message
}

func TestAccessToken(t *testing.T) {
	_, ts := newTestServer(t)
	const listRPC = "/process.Process/List"
	rpc := map[string]string{"Content-Type": "application/json"}

	// Before /init sets a token, nothing needs one.
	if resp, body := do(t, "POST", ts.URL+listRPC, "{}", rpc); resp.StatusCode != 200 {
		t.Fatalf("List before init: %d %s", resp.StatusCode, body)
	}
	if resp, _ := do(t, "POST", ts.URL+"/init", `{"accessToken":"tok","envVars":{"A":"1"}}`, nil); resp.StatusCode != 204 {
		t.Fatalf("init: %d", resp.StatusCode)
	}

	tests := []struct {
		name         string
		method, path string
		body         string
		header       map[string]string
		want         int
	}{
		{"health is open", "GET", "/health", "", nil, 204},
		{"rpc without token", "POST", listRPC, "{}", rpc, 401},
		{"rpc with wrong token", "POST", listRPC, "{}", map[string]string{"Content-Type": "application/json", "X-Access-Token": "nope"}, 401},
		{"rpc with token", "POST", listRPC, "{}", map[string]string{"Content-Type": "application/json", "X-Access-Token": "tok"}, 200},
		{"envs without token", "GET", "/envs", "", nil, 401},
		{"metrics without token", "GET", "/metrics", "", nil, 401},
		{"logs without token", "GET", "/logs", "", nil, 401},
		{"logs with wrong token", "GET", "/logs", "", map[string]string{"X-Access-Token": "nope"}, 401},
		{"logs with token", "GET", "/logs", "", map[string]string{"X-Access-Token": "tok"}, 200},
		{"re-init without token", "POST", "/init", `{"accessToken":"evil"}`, nil, 401},
		{"re-init with header", "POST", "/init", `{"envVars":{"B":"2"}}`, map[string]string{"X-Access-Token": "tok"}, 204},
		{"re-init with same body token", "POST", "/init", `{"accessToken":"tok"}`, nil, 204},
		{"tunnel without token", "CONNECT", "/", "", nil, 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(t, tt.method, ts.URL+tt.path, tt.body, tt.header)
			if resp.StatusCode != tt.want {
				t.Fatalf("%s %s = %d (%s); want %d", tt.method, tt.path, resp.StatusCode, body, tt.want)
			}
			if tt.want == 401 {
				errorBody(t, resp, body)
			}
		})
	}

	resp, body := do(t, "GET", ts.URL+"/envs", "", map[string]string{"X-Access-Token": "tok"})
	var envs map[string]string
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &envs) != nil || envs["A"] != "1" || envs["B"] != "2" {
		t.Fatalf("envs = %d %s; want A=1 B=2", resp.StatusCode, body)
	}
}

func TestInitValidation(t *testing.T) {
	s, ts := newTestServer(t)
	tests := []struct {
		name, body string
		want       int
	}{
		{"not json", "{", 400},
		{"unknown default user", `{"defaultUser":"no-such-user-sandboxd"}`, 400},
		{"empty body", "", 204},
		{"another known user", `{"defaultUser":"nobody"}`, 204}, // looked up
		{"defaults", `{"defaultUser":"root","defaultWorkdir":"/tmp","timestamp":"2026-01-01T00:00:00Z","hyperloopIP":"ignored"}`, 204},
	}
	for _, tt := range tests {
		resp, body := do(t, "POST", ts.URL+"/init", tt.body, nil)
		if resp.StatusCode != tt.want {
			t.Errorf("%s: init = %d %s; want %d", tt.name, resp.StatusCode, body, tt.want)
		} else if tt.want >= 400 {
			errorBody(t, resp, body)
		}
	}
	if user, workdir := defaults(t, s, ts); user != "root" || workdir != "/tmp" {
		t.Errorf("defaults = %q, %q; want root, /tmp", user, workdir)
	}
	big := `{"envVars":{"k":"` + strings.Repeat("x", maxInitBody) + `"}}`
	if resp, _ := do(t, "POST", ts.URL+"/init", big, nil); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized init = %d; want 413", resp.StatusCode)
	}
}

func TestMetrics(t *testing.T) {
	_, ts := newTestServer(t)
	resp, body := do(t, "GET", ts.URL+"/metrics", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("metrics = %d", resp.StatusCode)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache", "mem_total_mib", "mem_used_mib", "disk_used", "disk_total"} {
		if _, ok := m[k]; !ok {
			t.Errorf("metrics lacks %q: %s", k, body)
		}
	}
	if m["mem_total"].(float64) <= 0 || m["disk_total"].(float64) <= 0 || m["cpu_count"].(float64) < 1 {
		t.Errorf("implausible metrics: %s", body)
	}
	if used, total := m["mem_used"].(float64), m["mem_total"].(float64); used > total {
		t.Errorf("mem_used %v > mem_total %v", used, total)
	}
}

func TestCORSPreflight(t *testing.T) {
	_, ts := newTestServer(t)
	resp, _ := do(t, "OPTIONS", ts.URL+"/process.Process/Start", "", map[string]string{
		"Origin":                         "https://app.example",
		"Access-Control-Request-Method":  "POST",
		"Access-Control-Request-Headers": "connect-protocol-version,x-access-token,e2b-sandbox-id",
	})
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "x-access-token") ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "POST") {
		t.Fatalf("preflight = %d %v", resp.StatusCode, resp.Header)
	}
}

func TestUnknownRoute(t *testing.T) {
	_, ts := newTestServer(t)
	if resp, _ := do(t, "POST", ts.URL+"/freeze", "", nil); resp.StatusCode != 404 {
		t.Errorf("/freeze = %d; want 404 (orchestrator-only routes are not served)", resp.StatusCode)
	}
}

// TestAfterFirstAnswer: the start-up work that no first request needs waits
// for the first answer, and a Connect request that comes first builds its
// service's handler itself. Without any request it starts at warmBackstop.
func TestAfterFirstAnswer(t *testing.T) {
	agenttest.InProcessOnly(t, "observes the AfterFirstAnswer hook of Config, which a binary does not expose")
	t.Run("no request", func(t *testing.T) {
		ran := make(chan struct{})
		started := time.Now()
		s := New(Config{Log: slog.New(slog.DiscardHandler), DefaultUser: "root", DiskPath: t.TempDir(),
			AfterFirstAnswer: func() { close(ran) }})
		t.Cleanup(s.Close)
		select {
		case <-ran:
			if d := time.Since(started); d < warmBackstop {
				t.Fatalf("AfterFirstAnswer ran after %v without a request; want %v", d, warmBackstop)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("AfterFirstAnswer never ran without a request")
		}
	})
	for _, first := range []struct{ method, path, body string }{
		{"GET", "/health", ""},
		{"POST", "/process.Process/List", "{}"},
		{"POST", "/filesystem.Filesystem/Stat", `{"path":"/"}`},
	} {
		t.Run(first.path, func(t *testing.T) {
			ran := make(chan struct{})
			s := New(Config{Log: slog.New(slog.DiscardHandler), DefaultUser: "root", DiskPath: t.TempDir(),
				AfterFirstAnswer: func() { close(ran) }})
			t.Cleanup(s.Close)
			ts := httptest.NewServer(s.Handler())
			t.Cleanup(ts.Close)

			select {
			case <-ran:
				t.Fatal("AfterFirstAnswer ran before any request")
			case <-time.After(50 * time.Millisecond):
			}
			resp, body := do(t, first.method, ts.URL+first.path, first.body, map[string]string{"Content-Type": "application/json"})
			if resp.StatusCode/100 != 2 {
				t.Fatalf("%s %s: %d %s", first.method, first.path, resp.StatusCode, body)
			}
			select {
			case <-ran:
			case <-time.After(10 * time.Second):
				t.Fatal("AfterFirstAnswer did not run after the first answer")
			}
			// Both services answer once built in the background.
			for _, rpc := range []struct{ path, body string }{
				{"/process.Process/List", "{}"}, {"/filesystem.Filesystem/Stat", `{"path":"/"}`},
			} {
				if resp, body := do(t, "POST", ts.URL+rpc.path, rpc.body, map[string]string{"Content-Type": "application/json"}); resp.StatusCode != 200 {
					t.Fatalf("%s: %d %s", rpc.path, resp.StatusCode, body)
				}
			}
		})
	}
}
