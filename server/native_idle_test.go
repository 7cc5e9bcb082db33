package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/sandboxtest"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/store/storetest"
	"github.com/sandboxd/sandboxd/tenant"
)

// fakeEnv is a server on sandboxtest's fake backend, with an API key for
// tenant acme.
type fakeEnv struct {
	srv *httptest.Server
	st  *store.Store
	mgr *sandbox.Manager
	key string
}

func newFakeEnv(t *testing.T, mod func(*Config)) *fakeEnv {
	return newFakeEnvManager(t, mod, nil)
}

func newFakeEnvManager(t *testing.T, mod func(*Config), modMgr func(*sandbox.Config)) *fakeEnv {
	t.Helper()
	ctx := context.Background()
	st, _ := storetest.Open(t)
	be := sandboxtest.New()
	t.Cleanup(be.Close)
	log := slog.New(slog.DiscardHandler)
	mcfg := sandbox.Config{Store: st, Backend: be, BackendName: "fake", Log: log, EnvdVersion: "0.6.13"}
	if modMgr != nil {
		modMgr(&mcfg)
	}
	mgr := sandbox.New(mcfg)
	cfg := Config{Manager: mgr, Store: st, Log: log, EnvdVersion: "0.6.13"}
	if mod != nil {
		mod(&cfg)
	}
	srv := httptest.NewServer(New(cfg))
	t.Cleanup(srv.Close)
	if _, err := st.EnsureTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	key, _, err := st.CreateKey(ctx, tenant.ID("acme"))
	if err != nil {
		t.Fatal(err)
	}
	return &fakeEnv{srv: srv, st: st, mgr: mgr, key: key}
}

func (e *fakeEnv) do(t *testing.T, method, path, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	req.Header.Set("X-API-KEY", e.key)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := r.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return r, []byte(b.String())
}

// TestNativeCreateIdleTTL: a native create gets the server's idle TTL unless
// it names one; both are stored and returned. An E2B create has none.
func TestNativeCreateIdleTTL(t *testing.T) {
	e := newFakeEnv(t, func(c *Config) { c.NativeIdleTTL = 5 * time.Minute })
	for _, tc := range []struct {
		body string
		want int
	}{
		{`{}`, 300},
		{`{"idle_ttl": 0}`, 300},
		{`{"idle_ttl": 42}`, 42},
	} {
		r, b := e.do(t, http.MethodPost, "/v1/sandboxes", tc.body, nil)
		var sb nativeapi.Sandbox
		if r.StatusCode != 201 || json.Unmarshal(b, &sb) != nil {
			t.Fatalf("create %s = %d %s", tc.body, r.StatusCode, b)
		}
		if sb.IdleTtl == nil || *sb.IdleTtl != tc.want || sb.LastActiveAt == nil {
			t.Errorf("create %s = %s; want idle_ttl %d and last_active_at", tc.body, b, tc.want)
		}
		stored, err := e.st.GetSandboxAny(context.Background(), sb.Id)
		if err != nil || stored.IdleTTL != time.Duration(tc.want)*time.Second || stored.LastActiveAt.IsZero() {
			t.Errorf("stored %s: idle TTL %v, last active %v, %v; want %ds", sb.Id, stored.IdleTTL, stored.LastActiveAt, err, tc.want)
		}
		r, b = e.do(t, http.MethodGet, "/v1/sandboxes/"+sb.Id, "", nil)
		if r.StatusCode != 200 || !strings.Contains(string(b), `"idle_ttl":`) {
			t.Errorf("get = %d %s; want idle_ttl", r.StatusCode, b)
		}
	}
	if r, b := e.do(t, http.MethodPost, "/v1/sandboxes", `{"idle_ttl": -5}`, nil); r.StatusCode != 400 {
		t.Errorf("create idle_ttl -5 = %d %s; want 400", r.StatusCode, b)
	}

	// E2B: no idle TTL, even with the native default on.
	r, b := e.do(t, http.MethodPost, "/sandboxes", `{"templateID": "base"}`, nil)
	var e2b struct {
		SandboxID string `json:"sandboxID"`
	}
	if r.StatusCode != 201 || json.Unmarshal(b, &e2b) != nil {
		t.Fatalf("E2B create = %d %s", r.StatusCode, b)
	}
	if stored, err := e.st.GetSandboxAny(context.Background(), e2b.SandboxID); err != nil || stored.IdleTTL != 0 {
		t.Errorf("E2B sandbox: idle TTL %v, %v; want none", stored.IdleTTL, err)
	}

	// Server default off: no idle TTL unless asked.
	off := newFakeEnv(t, nil)
	r, b = off.do(t, http.MethodPost, "/v1/sandboxes", `{}`, nil)
	if r.StatusCode != 201 || strings.Contains(string(b), "idle_ttl") {
		t.Errorf("create with idle TTLs off = %d %s; want 201 without idle_ttl", r.StatusCode, b)
	}
}

// TestProxyTouchesIdleSandbox: a data-plane request through the proxy is
// activity: it moves the sandbox's last_active_at.
func TestProxyTouchesIdleSandbox(t *testing.T) {
	e := newFakeEnvManager(t, func(c *Config) { c.NativeIdleTTL = time.Minute },
		func(c *sandbox.Config) { c.TouchInterval = time.Nanosecond })
	r, b := e.do(t, http.MethodPost, "/v1/sandboxes", `{}`, nil)
	var sb nativeapi.Sandbox
	if r.StatusCode != 201 || json.Unmarshal(b, &sb) != nil {
		t.Fatalf("create = %d %s", r.StatusCode, b)
	}
	before, _ := e.st.GetSandboxAny(context.Background(), sb.Id)
	r, b = e.do(t, http.MethodGet, "/health", "", map[string]string{
		"E2b-Sandbox-Id": sb.Id, "E2b-Sandbox-Port": "49983", "X-Access-Token": httpx.Deref(sb.EnvdAccessToken)})
	if r.StatusCode != 204 {
		t.Fatalf("proxied /health = %d %s", r.StatusCode, b)
	}
	after, _ := e.st.GetSandboxAny(context.Background(), sb.Id)
	if !after.LastActiveAt.After(before.LastActiveAt) || after.Generation != before.Generation {
		t.Errorf("last active %v -> %v, generation %d -> %d; want later, unchanged",
			before.LastActiveAt, after.LastActiveAt, before.Generation, after.Generation)
	}
}
