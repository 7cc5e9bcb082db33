package incus

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

// fakeIncus answers a few endpoints the way incusd 6.0 does (envelopes
// captured from the real daemon), so the client's decoding, operation
// waiting and error mapping run without Incus.
func fakeIncus(t *testing.T) (*Client, *atomic.Int32) {
	t.Helper()
	var waits atomic.Int32
	write := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	sync := func(w http.ResponseWriter, md any) {
		write(w, 200, map[string]any{"type": "sync", "status": "Success", "status_code": 200, "metadata": md})
	}
	fail := func(w http.ResponseWriter, code int, msg string) {
		write(w, code, map[string]any{"type": "error", "error_code": code, "error": msg, "metadata": nil})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /1.0", func(w http.ResponseWriter, r *http.Request) {
		sync(w, map[string]any{"api_extensions": []string{"instance_create_start"}, "api_version": "1.0"})
	})
	mux.HandleFunc("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		var req InstancesPost
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			fail(w, 400, err.Error())
			return
		}
		op := "ok"
		if req.Name == "dup" {
			op = "dup"
		}
		write(w, 202, map[string]any{"type": "async", "status": "Operation created", "status_code": 100,
			"operation": "/1.0/operations/" + op, "metadata": map[string]any{"id": op, "status_code": 103}})
	})
	mux.HandleFunc("GET /1.0/operations/{id}/wait", func(w http.ResponseWriter, r *http.Request) {
		switch r.PathValue("id") {
		case "ok":
			sync(w, map[string]any{"id": "ok", "status": "Success", "status_code": 200})
		case "dup":
			sync(w, map[string]any{"id": "dup", "status": "Failure", "status_code": 400, "description": "Creating instance",
				"err": `Failed creating instance record: Add instance info to the database: Failed to create "instances" entry: UNIQUE constraint failed: instances.project_id, instances.name`})
		case "slow":
			// The server's own wait timeout, then success.
			if waits.Add(1) < 3 {
				fail(w, 500, "context deadline exceeded")
				return
			}
			sync(w, map[string]any{"id": "slow", "status": "Success", "status_code": 200})
		case "running":
			if r.URL.Query().Get("timeout") == "" {
				t.Errorf("wait without timeout")
			}
			time.Sleep(20 * time.Millisecond)
			sync(w, map[string]any{"id": "running", "status": "Running", "status_code": 103})
		}
	})
	mux.HandleFunc("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "x" {
			fail(w, 404, `Failed to fetch instance "`+r.PathValue("name")+`" in project "default": Instance not found`)
			return
		}
		sync(w, map[string]any{"name": "x", "status": "Running", "config": map[string]string{"user.sandboxd.id": "x"}})
	})
	mux.HandleFunc("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("recursion") != "1" {
			t.Errorf("list without recursion=1")
		}
		sync(w, []map[string]any{
			{"name": "x", "status": "Running", "config": map[string]string{"user.sandboxd.id": "x"}},
			{"name": "other", "status": "Running", "config": map[string]string{}},
		})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return NewClientWith(srv.Client(), srv.URL), &waits
}

func TestClientEnvelopes(t *testing.T) {
	c, _ := fakeIncus(t)
	ctx := t.Context()
	s, err := c.Server(ctx)
	if err != nil || !s.HasExtension("instance_create_start") {
		t.Fatalf("Server() = %+v, %v", s, err)
	}
	in, err := c.Instance(ctx, "x")
	if err != nil || in.Name != "x" || in.Config["user.sandboxd.id"] != "x" {
		t.Fatalf("Instance(x) = %+v, %v", in, err)
	}
	_, err = c.Instance(ctx, "nope")
	var ie *Error
	if !errors.Is(err, runtime.ErrNotFound) || !errors.As(err, &ie) || ie.StatusCode != 404 {
		t.Errorf("Instance(nope) = %v; want a 404 *Error that is runtime.ErrNotFound", err)
	}
	l, err := c.Instances(ctx, "user.sandboxd.id")
	if err != nil || len(l) != 1 || l[0].Name != "x" {
		t.Errorf("Instances(filtered) = %v, %v", l, err)
	}
}

func TestClientOperations(t *testing.T) {
	c, waits := fakeIncus(t)
	ctx := t.Context()
	op, err := c.CreateInstance(ctx, InstancesPost{Name: "a", Type: "container"})
	if err != nil || op != "ok" {
		t.Fatalf("CreateInstance = %q, %v", op, err)
	}
	if _, err := c.Wait(ctx, op); err != nil {
		t.Errorf("Wait(ok) = %v", err)
	}
	op, err = c.CreateInstance(ctx, InstancesPost{Name: "dup", Type: "container"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, op); !errors.Is(err, runtime.ErrAlreadyExists) {
		t.Errorf("Wait(failed duplicate create) = %v; want ErrAlreadyExists", err)
	}
	if _, err := c.Wait(ctx, "slow"); err != nil || waits.Load() != 3 {
		t.Errorf("Wait(slow) = %v after %d waits; want success after the server's timeouts", err, waits.Load())
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.Wait(cctx, "running"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait(running) past the deadline = %v; want DeadlineExceeded", err)
	}
}

func TestErrorKind(t *testing.T) {
	for _, tc := range []struct {
		code int
		msg  string
		want error
	}{
		{404, "Instance not found", runtime.ErrNotFound},
		{409, "", runtime.ErrAlreadyExists},
		{400, `Failed to create "instances" entry: UNIQUE constraint failed: instances.project_id, instances.name`, runtime.ErrAlreadyExists},
		{400, "The container is already frozen", errAlreadyFrozen}, // incusd 6.0.4, freeze twice
		{400, "The container is already running", errNotFrozen},    // unfreeze of a running one
		{400, "The instance is already stopped", runtime.ErrNotRunning},
		{400, "Invalid config", runtime.ErrInvalidSpec},
		{403, "not authorized", runtime.ErrUnavailable},
		{500, "boom", runtime.ErrUnavailable},
	} {
		if got := errorKind(tc.code, tc.msg); got != tc.want {
			t.Errorf("errorKind(%d, %q) = %v; want %v", tc.code, tc.msg, got, tc.want)
		}
	}
	// A transport failure is ErrUnavailable.
	c := NewUnixClient("/nonexistent/incus.sock")
	if _, err := c.Server(t.Context()); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Server() on a missing socket = %v; want ErrUnavailable", err)
	}
	if e := newError("GET", "/1.0", 404, "x"); !strings.Contains(e.Error(), "404") {
		t.Errorf("Error() = %q", e.Error())
	}
}

func TestInstanceName(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{"abc", "rt-0a1b", "ABC", "a_b", "a--b", "9lives", strings.Repeat("x", 63), "x-"} {
		n := InstanceName("", id)
		if len(n) > 63 || strings.ContainsAny(n, "_ABCDEFGHIJKLMNOPQRSTUVWXYZ") || strings.HasSuffix(n, "-") {
			t.Errorf("InstanceName(%q) = %q: not a valid instance name", id, n)
		}
		if prev, dup := seen[n]; dup {
			t.Errorf("InstanceName(%q) = InstanceName(%q) = %q", id, prev, n)
		}
		seen[n] = id
	}
	if InstanceName("", "abc") != "sbx-abc" || InstanceName("ns", "abc") == "sbx-abc" {
		t.Errorf("InstanceName: readable name only without a namespace")
	}
}

// TestClientEndpoints: with a cluster's endpoints set, a GET that meets a
// dead one is retried on the next, which later requests keep using; a
// POST is not retried.
func TestClientEndpoints(t *testing.T) {
	var hits atomic.Int32
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, `{"type":"sync","status":"Success","status_code":200,"metadata":{"api_version":"1.0"}}`)
	}))
	t.Cleanup(live.Close)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	c := NewClientWith(live.Client(), deadURL)
	if _, err := c.Server(t.Context()); err == nil {
		t.Fatal("GET to a dead server without other endpoints succeeded")
	}
	toHTTPS := func(u string) string { return "https://" + strings.TrimPrefix(u, "http://") }
	c.SetEndpoints([]string{toHTTPS(deadURL), toHTTPS(live.URL)})
	// The test servers speak plain HTTP: keep the scheme of base.
	for i := range c.endpoints {
		c.endpoints[i] = "http://" + strings.TrimPrefix(c.endpoints[i], "https://")
	}
	if _, err := c.Server(t.Context()); err != nil {
		t.Fatalf("GET with a live second endpoint: %v", err)
	}
	if c.endpoint() != live.URL || hits.Load() != 1 {
		t.Fatalf("endpoint %s, %d hits; want %s, 1", c.endpoint(), hits.Load(), live.URL)
	}
	c.SetEndpoints([]string{toHTTPS(live.URL), toHTTPS(deadURL)})
	for i := range c.endpoints {
		c.endpoints[i] = "http://" + strings.TrimPrefix(c.endpoints[i], "https://")
	}
	if c.endpoint() != live.URL {
		t.Fatalf("SetEndpoints moved off the endpoint in use: %s", c.endpoint())
	}
	c.cur = 1 // the dead one
	if _, err := c.CreateInstance(t.Context(), InstancesPost{Name: "x"}); err == nil || !errors.Is(err, runtime.ErrUnavailable) {
		t.Fatalf("POST to a dead endpoint: %v; want ErrUnavailable, not retried", err)
	}
	if hits.Load() != 1 {
		t.Fatalf("the POST was retried on the live endpoint")
	}
	if c.endpoint() != live.URL {
		t.Fatalf("after the failed POST the client stays on %s", c.endpoint())
	}
}

func TestTrimOperation(t *testing.T) {
	for in, want := range map[string]string{
		"/1.0/operations/3b17d780":                 "3b17d780",
		"/1.0/operations/3b17d780?project=default": "3b17d780", // a forwarding cluster member's
		"3b17d780": "3b17d780",
	} {
		if got := trimOperation(in); got != want {
			t.Errorf("trimOperation(%q) = %q; want %q", in, got, want)
		}
	}
}
