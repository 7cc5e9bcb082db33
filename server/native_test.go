package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/local/localtest"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/native"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/store/storetest"
	"github.com/sandboxd/sandboxd/tenant"
)

// The native API's tests run against the real router. Those that need
// sandboxes use the real local backend (root, cgroups, and an envd built
// here); the others need only a store.

var (
	nativeEnvdBin  string
	nativeSkipReal string // why sandboxes cannot be created here
)

func TestMain(m *testing.M) {
	local.Init() // libcontainer re-executes the test binary as container init
	os.Exit(runServerTests(m))
}

func runServerTests(m *testing.M) int {
	return localtest.Main(m, &nativeEnvdBin, &nativeSkipReal)
}

var testSecret = []byte("native-api-test-secret-0123456789abcdef")

// nativeEnv is a sandboxd HTTP server on loopback: the real router, a real
// store, a real Manager (on the local backend when real is set).
type nativeEnv struct {
	t      testing.TB
	srv    *httptest.Server
	st     *store.Store
	mgr    *sandbox.Manager
	keys   map[string]string // tenant -> API key
	client *http.Client
}

func newNativeEnv(t testing.TB, real bool) *nativeEnv {
	t.Helper()
	return newNativeEnvWith(t, real, nil, nil)
}

// newNativeEnvWith is newNativeEnv with the real backend wrapped by wrap
// (nil: as is), to observe what the server asks of it, and the server's
// Config changed by conf (nil: none).
func newNativeEnvWith(t testing.TB, real bool, wrap func(runtime.Backend) runtime.Backend, conf func(*Config)) *nativeEnv {
	t.Helper()
	if real && nativeSkipReal != "" {
		t.Skip(nativeSkipReal)
	}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	st, keys := storetest.Open(t, "acme", "other")
	cfg := sandbox.Config{Store: st, Log: log, BackendName: "local", EnvdVersion: "0.6.13"}
	var be *local.Backend
	if real {
		be = localtest.New(t, "sandboxd-servertest", nativeEnvdBin, netip.MustParsePrefix("10.135.0.0/16"), log)
		cfg.Backend = be
		if wrap != nil {
			cfg.Backend = wrap(be)
		}
	}
	mgr := sandbox.New(cfg)
	scfg := Config{Manager: mgr, Store: st, Log: log, EnvdVersion: "0.6.13",
		JWT: jwtauth.NewVerifier(testSecret, nil)}
	if conf != nil {
		conf(&scfg)
	}
	h := New(scfg)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &nativeEnv{t: t, srv: srv, st: st, mgr: mgr, keys: keys, client: &http.Client{}}
}

func (e *nativeEnv) token(tenant string, scopes ...string) string {
	e.t.Helper()
	tok, err := jwtauth.Issue(testSecret, tenant, scopes, time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// full is a token with both scopes for tenant acme.
func (e *nativeEnv) full() string { return e.token("acme", jwtauth.ScopeRead, jwtauth.ScopeWrite) }

type resp struct {
	status int
	body   []byte
	header http.Header
}

func (r resp) String() string { return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body)) }

func (r resp) errCode() string {
	var b nativeapi.Error
	_ = json.Unmarshal(r.body, &b)
	return b.Error.Code
}

func (e *nativeEnv) do(method, path, tok string, body any) resp {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd = b
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != nil {
		if _, raw := body.([]byte); raw {
			req.Header.Set("Content-Type", "application/octet-stream")
		} else {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	r, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{status: r.StatusCode, body: b, header: r.Header}
}

// create makes a small sandbox for the token's tenant.
func (e *nativeEnv) create(tok string, extra map[string]any) nativeapi.Sandbox {
	e.t.Helper()
	body := map[string]any{"allow_internet": false, "memory_mb": 256, "disk_mb": 256, "timeout": 600}
	for k, v := range extra {
		body[k] = v
	}
	r := e.do(http.MethodPost, "/v1/sandboxes", tok, body)
	if r.status != http.StatusCreated {
		e.t.Fatalf("create = %s; want 201", r)
	}
	var sb nativeapi.Sandbox
	if err := json.Unmarshal(r.body, &sb); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx := tenant.WithContext(context.Background(), tenant.ID("acme"))
		_ = e.mgr.Kill(ctx, sb.Id)
	})
	return sb
}

func (e *nativeEnv) exec(id, tok string, body map[string]any) nativeapi.ExecResult {
	e.t.Helper()
	r := e.do(http.MethodPost, "/v1/sandboxes/"+id+"/exec", tok, body)
	if r.status != http.StatusOK {
		e.t.Fatalf("exec = %s; want 200", r)
	}
	var res nativeapi.ExecResult
	if err := json.Unmarshal(r.body, &res); err != nil {
		e.t.Fatal(err)
	}
	return res
}

// TestNativeRouteTable: every route names a scope, and the table and
// openapi/native.yaml list the same operations.
func TestNativeRouteTable(t *testing.T) {
	routes := native.Routes(&nativeapi.ServerInterfaceWrapper{})
	inTable := map[string]string{}
	for _, rt := range routes {
		if rt.Scope != jwtauth.ScopeRead && rt.Scope != jwtauth.ScopeWrite {
			t.Errorf("route %s %s has scope %q; want %s or %s", rt.Method, rt.Pattern, rt.Scope, jwtauth.ScopeRead, jwtauth.ScopeWrite)
		}
		if rt.Handler == nil {
			t.Errorf("route %s %s has no handler", rt.Method, rt.Pattern)
		}
		p := strings.TrimSuffix(NativePrefix+rt.Pattern, "/")
		inTable[rt.Method+" "+p] = rt.Operation
	}
	spec := loadNativeSpec(t)
	inSpec := map[string]string{}
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			inSpec[method+" "+path] = op.OperationID
		}
	}
	for k, op := range inSpec {
		if got := inTable[k]; got != op {
			t.Errorf("route table has %q for %s; want %q (from the spec)", got, k, op)
		}
	}
	for k := range inTable {
		if _, ok := inSpec[k]; !ok {
			t.Errorf("route table has %s, which the spec does not", k)
		}
	}
}

// TestNativeAuth runs every route with every credential kind and checks
// the 401/403 decisions (the sandbox does not exist: an authorised request
// ends in 404 or 400, never 401 or 403).
func TestNativeAuth(t *testing.T) {
	e := newNativeEnv(t, false)
	oldTok := issueAt(t, time.Now().Add(-2*time.Hour), time.Hour)
	full := e.full()
	tampered := full[:len(full)-4] + "AAAA"
	otherSecret, _ := jwtauth.Issue([]byte("some-other-secret-some-other-secret"), "acme", []string{jwtauth.ScopeRead, jwtauth.ScopeWrite}, time.Hour)

	creds := []struct {
		name         string
		header       string
		value        string
		read, write  bool
		unauthorized bool
	}{
		{"none", "", "", false, false, true},
		{"garbage bearer", "Authorization", "Bearer nope", false, false, true},
		{"expired jwt", "Authorization", "Bearer " + oldTok, false, false, true},
		{"tampered jwt", "Authorization", "Bearer " + tampered, false, false, true},
		{"jwt of another secret", "Authorization", "Bearer " + otherSecret, false, false, true},
		{"jwt no scope", "Authorization", "Bearer " + e.token("acme"), false, false, false},
		{"jwt read", "Authorization", "Bearer " + e.token("acme", jwtauth.ScopeRead), true, false, false},
		{"jwt write", "Authorization", "Bearer " + e.token("acme", jwtauth.ScopeWrite), false, true, false},
		{"jwt read+write", "Authorization", "Bearer " + full, true, true, false},
		{"api key bearer", "Authorization", "Bearer " + e.keys["acme"], true, true, false},
		{"api key header", "X-API-KEY", e.keys["acme"], true, true, false},
		{"revoked-like api key", "X-API-KEY", "e2b_" + strings.Repeat("0", 40), false, false, true},
	}
	routes := native.Routes(&nativeapi.ServerInterfaceWrapper{})
	for _, c := range creds {
		for _, rt := range routes {
			path := NativePrefix + strings.ReplaceAll(rt.Pattern, "{id}", "nosuchsandbox0000000")
			path = strings.TrimSuffix(path, "/")
			if strings.Contains(path, "/files") {
				path += "?path=/tmp/x"
			}
			t.Run(c.name+"/"+rt.Operation, func(t *testing.T) {
				var body io.Reader
				switch rt.Operation {
				case "CreateSandbox":
					body = strings.NewReader(`{"idle_ttl": -1}`) // 400 before any backend call
				case "Exec":
					body = strings.NewReader(`{"cmd": "true"}`)
				}
				req, _ := http.NewRequest(rt.Method, e.srv.URL+path, body)
				if c.header != "" {
					req.Header.Set(c.header, c.value)
				}
				r, err := e.client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(r.Body)
				r.Body.Close()
				got := resp{status: r.StatusCode, body: b}
				allowed := (rt.Scope == jwtauth.ScopeRead && c.read) || (rt.Scope == jwtauth.ScopeWrite && c.write)
				switch {
				case c.unauthorized:
					if got.status != http.StatusUnauthorized || got.errCode() != "unauthenticated" {
						t.Errorf("%s %s = %s; want 401 unauthenticated", rt.Method, path, got)
					}
				case !allowed:
					if got.status != http.StatusForbidden || got.errCode() != "permission_denied" {
						t.Errorf("%s %s = %s; want 403 permission_denied", rt.Method, path, got)
					}
				default:
					if got.status == http.StatusUnauthorized || got.status == http.StatusForbidden {
						t.Errorf("%s %s = %s; want it past auth", rt.Method, path, got)
					}
				}
			})
		}
	}
}

func issueAt(t *testing.T, iat time.Time, ttl time.Duration) string {
	t.Helper()
	tok, err := jwtauth.IssueAt(testSecret, "acme", []string{jwtauth.ScopeRead, jwtauth.ScopeWrite}, iat, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestNativeJWTNewTenant: a valid token of a tenant the store has never
// seen creates it (identity-provider deployments); a bad name is 401.
func TestNativeJWTNewTenant(t *testing.T) {
	e := newNativeEnv(t, false)
	if r := e.do(http.MethodGet, "/v1/sandboxes", e.token("fresh-tenant", jwtauth.ScopeRead), nil); r.status != 200 {
		t.Errorf("list as a new tenant = %s; want 200", r)
	}
	if _, err := e.st.GetTenant(context.Background(), "fresh-tenant"); err != nil {
		t.Errorf("tenant after first request: %v; want it created", err)
	}
	if r := e.do(http.MethodGet, "/v1/sandboxes", e.token("bad name/..", jwtauth.ScopeRead), nil); r.status != 401 {
		t.Errorf("list with an invalid tenant name = %s; want 401", r)
	}
}

// TestNativeAndE2BCoexist: /v1/sandboxes is the native API, while
// /v1/sandboxes/e2b/... and the root alias stay E2B's.
func TestNativeAndE2BCoexist(t *testing.T) {
	e := newNativeEnv(t, false)
	key := e.keys["acme"]
	for _, tc := range []struct {
		path   string
		status int
		native bool
	}{
		{"/v1/sandboxes", 200, true},
		{"/v1/sandboxes/", 200, true},
		{"/v1/sandboxes/e2b/sandboxes", 200, false},
		{"/v1/sandboxes/e2b/v2/sandboxes", 200, false},
		{"/sandboxes", 200, false},
		{"/v2/sandboxes", 200, false},
		{"/v1/sandboxes/nosuchsandbox0000000", 404, true},
		{"/v1/sandboxes/e2b/sandboxes/nosuchsandbox0000000", 404, false},
	} {
		r := e.do(http.MethodGet, tc.path, key, nil)
		if r.status != tc.status {
			t.Errorf("GET %s = %s; want %d", tc.path, r, tc.status)
			continue
		}
		var probe map[string]json.RawMessage
		isObject := json.Unmarshal(r.body, &probe) == nil
		// Native answers {"sandboxes": [...]} or {"error": {...}}; E2B a
		// bare array or {"code", "message"}.
		_, hasSandboxes := probe["sandboxes"]
		_, hasError := probe["error"]
		gotNative := isObject && (hasSandboxes || hasError)
		if gotNative != tc.native {
			t.Errorf("GET %s answered %s; want native=%v", tc.path, r, tc.native)
		}
	}
}

// TestNativeSandboxes: create, get, list, delete on the local backend; the
// E2B surface sees the same sandbox; another tenant sees nothing.
func TestNativeSandboxes(t *testing.T) {
	e := newNativeEnv(t, true)
	tok := e.full()
	sb := e.create(tok, map[string]any{"metadata": map[string]string{"owner": "ci"}, "env": map[string]string{"GREETING": "hi"}})
	if sb.State != "running" || sb.Template != "base" || sb.MemoryMb != 256 {
		t.Errorf("created %+v; want running base with 256 MiB", sb)
	}
	if r := e.do(http.MethodGet, "/v1/sandboxes/"+sb.Id, tok, nil); r.status != 200 || !bytes.Contains(r.body, []byte(`"owner":"ci"`)) {
		t.Errorf("get = %s; want 200 with the metadata", r)
	}
	for _, q := range []string{"", "?metadata=owner%3Dci", "?state=running&limit=5"} {
		r := e.do(http.MethodGet, "/v1/sandboxes"+q, tok, nil)
		if r.status != 200 || !bytes.Contains(r.body, []byte(sb.Id)) {
			t.Errorf("list%s = %s; want it to contain %s", q, r, sb.Id)
		}
	}
	if r := e.do(http.MethodGet, "/v1/sandboxes?metadata=owner%3Dnobody", tok, nil); r.status != 200 || bytes.Contains(r.body, []byte(sb.Id)) {
		t.Errorf("list filtered out = %s; want no %s", r, sb.Id)
	}
	if r := e.do(http.MethodGet, "/v1/sandboxes?state=bogus", tok, nil); r.status != 400 {
		t.Errorf("list bad state = %s; want 400", r)
	}
	// Only a caller who may exec sees the envd access token.
	if r := e.do(http.MethodGet, "/v1/sandboxes/"+sb.Id, tok, nil); !bytes.Contains(r.body, []byte("envd_access_token")) {
		t.Errorf("get with write scope = %s; want the envd access token", r)
	}
	ro := e.token("acme", jwtauth.ScopeRead)
	for _, p := range []string{"/v1/sandboxes/" + sb.Id, "/v1/sandboxes"} {
		if r := e.do(http.MethodGet, p, ro, nil); r.status != 200 || bytes.Contains(r.body, []byte("envd_access_token")) {
			t.Errorf("GET %s read-only = %s; want 200 without the envd access token", p, r)
		}
	}
	// The E2B surface sees the same sandbox.
	if r := e.do(http.MethodGet, "/v1/sandboxes/e2b/sandboxes/"+sb.Id, e.keys["acme"], nil); r.status != 200 {
		t.Errorf("E2B get = %s; want 200", r)
	}
	// The env reaches processes.
	if res := e.exec(sb.Id, tok, map[string]any{"cmd": "echo $GREETING"}); res.Stdout != "hi\n" {
		t.Errorf("exec echo $GREETING = %q; want \"hi\\n\"", res.Stdout)
	}

	// Another tenant: every route is 404.
	foreign := e.token("other", jwtauth.ScopeRead, jwtauth.ScopeWrite)
	for _, rt := range native.Routes(&nativeapi.ServerInterfaceWrapper{}) {
		if !strings.Contains(rt.Pattern, "{id}") {
			continue
		}
		path := NativePrefix + strings.ReplaceAll(rt.Pattern, "{id}", sb.Id)
		if strings.Contains(path, "/files") {
			path += "?path=/etc/hostname"
		}
		var body any
		if rt.Operation == "Exec" {
			body = map[string]any{"cmd": "true"}
		}
		if rt.Operation == "PutSandboxNetwork" {
			body = map[string]any{"deny_out": []string{"0.0.0.0/0"}}
		}
		if rt.Operation == "UploadFile" {
			body = []byte("x")
		}
		if r := e.do(rt.Method, path, foreign, body); r.status != 404 || r.errCode() != "not_found" {
			t.Errorf("foreign %s %s = %s; want 404 not_found", rt.Method, path, r)
		}
	}
	if r := e.do(http.MethodGet, "/v1/sandboxes", foreign, nil); bytes.Contains(r.body, []byte(sb.Id)) {
		t.Errorf("foreign list = %s; want no %s", r, sb.Id)
	}

	if r := e.do(http.MethodDelete, "/v1/sandboxes/"+sb.Id, tok, nil); r.status != 204 {
		t.Fatalf("delete = %s; want 204", r)
	}
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		if r := e.do(m, "/v1/sandboxes/"+sb.Id, tok, nil); r.status != 404 {
			t.Errorf("%s after delete = %s; want 404", m, r)
		}
	}
	// Bad create bodies.
	for _, body := range []string{`{"timeout": -1}`, `{"bogus": 1}`, `not json`, ``} {
		if r := e.do(http.MethodPost, "/v1/sandboxes", tok, []byte(body)); r.status != 400 {
			t.Errorf("create %q = %s; want 400", body, r)
		}
	}
	if r := e.do(http.MethodPost, "/v1/sandboxes", tok, map[string]any{"idle_ttl": -1}); r.status != 400 {
		t.Errorf("create idle_ttl -1 = %s; want 400", r)
	}
	r := e.do(http.MethodPost, "/v1/sandboxes", tok, map[string]any{"idle_ttl": 60})
	var idle nativeapi.Sandbox
	if r.status != 201 || json.Unmarshal(r.body, &idle) != nil || idle.IdleTtl == nil || *idle.IdleTtl != 60 {
		t.Errorf("create idle_ttl 60 = %s; want 201 with idle_ttl 60", r)
	} else if r := e.do(http.MethodDelete, "/v1/sandboxes/"+idle.Id, tok, nil); r.status != 204 {
		t.Errorf("delete = %s; want 204", r)
	}
}

// TestNativeNetwork: the egress policy on create and through PUT
// .../network, as the sandbox reports it; a bad rule is a 400 naming it.
// (Enforcement: runtime/egress and cmd/sandboxd's network E2E tests.)
func TestNativeNetwork(t *testing.T) {
	e := newNativeEnv(t, true)
	tok := e.full()
	sb := e.create(tok, map[string]any{"allow_internet": true, "network": map[string]any{"deny_out": []string{"0.0.0.0/0"}}})
	if sb.Network == nil || sb.Network.DenyOut == nil || strings.Join(*sb.Network.DenyOut, ",") != "0.0.0.0/0" || sb.AllowInternet == nil || !*sb.AllowInternet {
		t.Errorf("created %+v; want deny_out [0.0.0.0/0] with internet", sb)
	}
	put := func(body any) resp {
		return e.do(http.MethodPut, "/v1/sandboxes/"+sb.Id+"/network", tok, body)
	}
	if r := put(map[string]any{"allow_out": []string{"1.1.1.1:53"}, "deny_out": []string{"0.0.0.0/0"}}); r.status != 200 || !bytes.Contains(r.body, []byte(`"allow_out":["1.1.1.1:53"]`)) {
		t.Errorf("PUT network = %s; want 200 with the new policy", r)
	}
	if r := put(map[string]any{"deny_out": []string{"example.com"}}); r.status != 400 || !bytes.Contains(r.body, []byte("network.denyOut[0]")) {
		t.Errorf("PUT a domain in deny_out = %s; want 400 naming it", r)
	}
	if r := put(map[string]any{}); r.status != 200 || bytes.Contains(r.body, []byte(`"network"`)) {
		t.Errorf("PUT {} = %s; want 200 and no policy", r)
	}
}
