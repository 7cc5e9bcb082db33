package main

// End-to-end tests of the control plane: a real sandboxd (built from this
// tree) on the local backend, driven over loopback HTTP exactly as E2B's
// SDKs drive it. The harness is in testutil_test.go.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// TestLifecycle drives one tenant's sandboxes through every state of E2B's
// REST API: create (v2 and v1), detail, list (metadata filter, state filter,
// paging), pause, connect (resume), resume, timeout, kill.
func TestLifecycle(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s := e.start()
	key := e.keys["alice"]

	// Metadata with every character the SDKs' triple encoding must carry.
	md := map[string]string{"suite": "lifecycle", "odd key/é": "a&b=c %/é+?#~!'()*"}

	// --- create ---------------------------------------------------------
	var sbs []e2eSandbox
	for _, c := range []struct {
		name, path string
		body       map[string]any
		wantToken  bool
	}{
		{"v2", "/v2/sandboxes", map[string]any{"timeout": 120, "metadata": md}, true},
		// Above --max-timeout (24h by default): clamped.
		{"v1 secure", "/sandboxes", map[string]any{"timeout": 90000, "secure": true, "metadata": map[string]string{"suite": "lifecycle"}}, true},
		// 0 is what the Python SDK sends for "no timeout given": the default, 300s.
		{"v1 not secure", "/sandboxes", map[string]any{"timeout": 0, "secure": false}, false},
	} {
		sb, r := e.create(t, c.path, key, c.body)
		if sb.TemplateID != "base" {
			t.Errorf("create %s: templateID %q, want base", c.name, sb.TemplateID)
		}
		if got := sb.EnvdAccessToken != nil && *sb.EnvdAccessToken != ""; got != c.wantToken {
			t.Errorf("create %s: envdAccessToken present=%v, want %v (%s)", c.name, got, c.wantToken, r.body)
		}
		if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("create %s: Content-Type %q", c.name, ct)
		}
		sbs = append(sbs, sb)
	}
	a, b, c := sbs[0], sbs[1], sbs[2]
	if a.SandboxID == b.SandboxID || b.SandboxID == c.SandboxID || a.SandboxID == c.SandboxID {
		t.Fatalf("sandbox ids are not unique: %s %s %s", a.SandboxID, b.SandboxID, c.SandboxID)
	}

	// --- detail -----------------------------------------------------------
	d := s.get(t, key, a.SandboxID)
	if d.State != "running" || d.SandboxID != a.SandboxID || d.TemplateID != "base" {
		t.Errorf("detail of %s: %+v", a.SandboxID, d)
	}
	if got := d.EndAt.Sub(d.StartedAt); got != 120*time.Second {
		t.Errorf("detail: endAt-startedAt = %v, want the requested timeout 120s", got)
	}
	if !maps.Equal(d.Metadata, md) {
		t.Errorf("detail: metadata %v, want %v", d.Metadata, md)
	}
	for _, x := range []struct {
		id   string
		want time.Duration
	}{{b.SandboxID, 24 * time.Hour}, {c.SandboxID, 300 * time.Second}} {
		if d := s.get(t, key, x.id); d.EndAt.Sub(d.StartedAt) != x.want {
			t.Errorf("detail of %s: endAt-startedAt = %v, want %v", x.id, d.EndAt.Sub(d.StartedAt), x.want)
		}
	}
	if d.EnvdAccessToken == nil || *d.EnvdAccessToken != *a.EnvdAccessToken {
		t.Errorf("detail: envdAccessToken %v, want the one create returned (SDKs 2.0-2.5 read it here)", d.EnvdAccessToken)
	}

	// --- list -------------------------------------------------------------
	all, _ := s.list(t, key, "")
	if got, want := e2eSortedIDs(all), e2eSorted(a.SandboxID, b.SandboxID, c.SandboxID); !slices.Equal(got, want) {
		t.Fatalf("list: %v, want %v", got, want)
	}
	for i := 1; i < len(all); i++ {
		if all[i].StartedAt.After(all[i-1].StartedAt) {
			t.Errorf("list: not in the default descending startedAt order: %v", e2eIDs(all))
		}
	}
	for _, f := range []struct {
		name string
		md   map[string]string
		want []string
	}{
		{"both keys", md, []string{a.SandboxID}},
		{"odd pair only", map[string]string{"odd key/é": "a&b=c %/é+?#~!'()*"}, []string{a.SandboxID}},
		{"shared pair", map[string]string{"suite": "lifecycle"}, e2eSorted(a.SandboxID, b.SandboxID)},
		{"value differs", map[string]string{"suite": "lifecycle", "odd key/é": "a&b=c"}, nil},
		{"unknown key", map[string]string{"nope": "lifecycle"}, nil},
	} {
		got, _ := s.list(t, key, e2eMetadataQuery(f.md))
		if !slices.Equal(e2eSortedIDs(got), f.want) {
			t.Errorf("list with metadata filter %s (%s): %v, want %v", f.name, e2eMetadataQuery(f.md), e2eIDs(got), f.want)
		}
	}
	// Paging: limit=2 gives two pages, linked by X-Next-Token.
	page1, r1 := s.list(t, key, "limit=2")
	tok := r1.header.Get("X-Next-Token")
	if len(page1) != 2 || tok == "" {
		t.Fatalf("list limit=2, page 1: %d items, X-Next-Token %q; want 2 and a token", len(page1), tok)
	}
	page2, r2 := s.list(t, key, "limit=2&nextToken="+url.QueryEscape(tok))
	if len(page2) != 1 || r2.header.Get("X-Next-Token") != "" {
		t.Fatalf("list limit=2, page 2: %d items, X-Next-Token %q; want 1 and none", len(page2), r2.header.Get("X-Next-Token"))
	}
	if got := append(e2eIDs(page1), e2eIDs(page2)...); !slices.Equal(got, e2eIDs(all)) {
		t.Errorf("pages %v, want the full listing %v in order", got, e2eIDs(all))
	}
	asc1, ra := s.list(t, key, "order=asc&limit=2")
	asc2, _ := s.list(t, key, "order=asc&limit=2&nextToken="+url.QueryEscape(ra.header.Get("X-Next-Token")))
	want := e2eIDs(all)
	slices.Reverse(want)
	if got := append(e2eIDs(asc1), e2eIDs(asc2)...); !slices.Equal(got, want) {
		t.Errorf("order=asc pages %v, want the reverse of %v", got, e2eIDs(all))
	}
	wantError(t, "a next token of the other order", s.api(t, http.MethodGet, "/v2/sandboxes?order=asc&limit=2&nextToken="+url.QueryEscape(tok), key, nil), http.StatusBadRequest)
	// startedAfter as JS (toISOString, ms, Z) and Python (isoformat, µs,
	// +00:00) send it. a was created (and its create returned) before b's
	// began, so 1ms after a's start is before b's.
	after := d.StartedAt.Truncate(time.Millisecond).Add(time.Millisecond)
	for _, f := range []string{"2006-01-02T15:04:05.000Z", "2006-01-02T15:04:05.000000-07:00"} {
		v := after.UTC().Format(f) // "-07:00" gives +00:00 for UTC, as Python writes it
		got, _ := s.list(t, key, "startedAfter="+url.QueryEscape(v))
		if want := e2eSorted(b.SandboxID, c.SandboxID); !slices.Equal(e2eSortedIDs(got), want) {
			t.Errorf("list startedAfter=%s: %v, want %v", v, e2eIDs(got), want)
		}
	}

	// --- pause ------------------------------------------------------------
	wantStatus(t, "pause", s.api(t, http.MethodPost, "/sandboxes/"+a.SandboxID+"/pause", key, map[string]any{}), http.StatusNoContent)
	wantError(t, "pause again", s.api(t, http.MethodPost, "/sandboxes/"+a.SandboxID+"/pause", key, map[string]any{}), http.StatusConflict)
	if got := s.get(t, key, a.SandboxID).State; got != "paused" {
		t.Errorf("state after pause: %q, want paused", got)
	}
	paused, _ := s.list(t, key, "state=paused")
	if !slices.Equal(e2eIDs(paused), []string{a.SandboxID}) {
		t.Errorf("list state=paused: %v, want [%s]", e2eIDs(paused), a.SandboxID)
	}
	running, _ := s.list(t, key, "state=running")
	if got, want := e2eSortedIDs(running), e2eSorted(b.SandboxID, c.SandboxID); !slices.Equal(got, want) {
		t.Errorf("list state=running: %v, want %v", got, want)
	}
	both, _ := s.list(t, key, "state="+url.QueryEscape("running,paused")) // JS joins arrays with commas
	if len(both) != 3 {
		t.Errorf("list state=running,paused: %v, want all three", e2eIDs(both))
	}
	var v1 []json.RawMessage
	r := s.api(t, http.MethodGet, "/sandboxes", key, nil)
	wantStatus(t, "GET /sandboxes", r, http.StatusOK)
	e2eDecode(t, "GET /sandboxes", r, &v1)
	if len(v1) != 2 {
		t.Errorf("GET /sandboxes (v1, running only): %s, want b and c", r.body)
	}

	// --- connect: 201 when it resumed, 200 when it was running ------------
	for _, route := range []struct {
		name, path string
		sb         e2eSandbox
	}{
		{"v2 connect", "/v2/sandboxes/%s/connect", a},
		{"v1 connect", "/sandboxes/%s/connect", b},
	} {
		id := route.sb.SandboxID
		if route.sb.SandboxID != a.SandboxID { // a is paused already
			wantStatus(t, "pause "+id, s.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, nil), http.StatusNoContent)
		}
		path := fmt.Sprintf(route.path, id)
		r := s.api(t, http.MethodPost, path, key, map[string]any{"timeout": 60})
		wantStatus(t, route.name+" of a paused sandbox", r, http.StatusCreated)
		if got := wantSandboxBody(t, route.name, r.body); got.SandboxID != id || got.EnvdAccessToken == nil || *got.EnvdAccessToken != *route.sb.EnvdAccessToken {
			t.Errorf("%s: %s, want sandbox %s with its access token", route.name, r.body, id)
		}
		r = s.api(t, http.MethodPost, path, key, map[string]any{"timeout": 60})
		wantStatus(t, route.name+" of a running sandbox", r, http.StatusOK)
		wantSandboxBody(t, route.name, r.body)
		if got := s.get(t, key, id).State; got != "running" {
			t.Errorf("%s: state %q after connect, want running", route.name, got)
		}
	}
	// connect only ever extends the timeout: a's end stays ~now+120s.
	before := s.get(t, key, a.SandboxID).EndAt
	wantStatus(t, "connect with a shorter timeout", s.api(t, http.MethodPost, "/v2/sandboxes/"+a.SandboxID+"/connect", key, map[string]any{"timeout": 5}), http.StatusOK)
	if after := s.get(t, key, a.SandboxID).EndAt; after.Before(before) {
		t.Errorf("connect with timeout 5 moved endAt back from %v to %v; it must only extend", before, after)
	}

	// Legacy resume (SDK 2.0-2.5): 409 while running, 201 once paused.
	wantError(t, "resume of a running sandbox", s.api(t, http.MethodPost, "/sandboxes/"+c.SandboxID+"/resume", key, map[string]any{"timeout": 60}), http.StatusConflict)
	wantStatus(t, "pause c", s.api(t, http.MethodPost, "/sandboxes/"+c.SandboxID+"/pause", key, nil), http.StatusNoContent)
	r = s.api(t, http.MethodPost, "/sandboxes/"+c.SandboxID+"/resume", key, map[string]any{"timeout": 60})
	wantStatus(t, "resume of a paused sandbox", r, http.StatusCreated)
	wantSandboxBody(t, "resume", r.body)

	// --- timeout: overwrites the end time from now, shorter or longer ------
	before = s.get(t, key, a.SandboxID).EndAt
	wantStatus(t, "set timeout", s.api(t, http.MethodPost, "/sandboxes/"+a.SandboxID+"/timeout", key, map[string]any{"timeout": 30}), http.StatusNoContent)
	if after := s.get(t, key, a.SandboxID).EndAt; !after.Before(before) {
		t.Errorf("timeout 30: endAt %v, want it moved before %v (now+120s)", after, before)
	}
	wantStatus(t, "refresh", s.api(t, http.MethodPost, "/sandboxes/"+a.SandboxID+"/refreshes", key, map[string]any{"duration": 60}), http.StatusNoContent)

	// --- the other sandbox routes answer their success statuses -----------
	r = s.api(t, http.MethodGet, "/sandboxes/"+a.SandboxID+"/metrics", key, nil)
	wantStatus(t, "metrics", r, http.StatusOK)
	var metrics []json.RawMessage
	e2eDecode(t, "metrics", r, &metrics)
	if len(metrics) == 0 {
		t.Errorf("metrics of a running sandbox: %s, want its history, or at least the current sample", r.body)
	}
	for _, m := range metrics {
		wantKeys(t, "metric", m, "timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache", "diskUsed", "diskTotal")
	}
	wantStatus(t, "logs", s.api(t, http.MethodGet, "/sandboxes/"+a.SandboxID+"/logs", key, nil), http.StatusOK)
	wantStatus(t, "logs v2", s.api(t, http.MethodGet, "/v2/sandboxes/"+a.SandboxID+"/logs", key, nil), http.StatusOK)
	wantStatus(t, "network no-op", s.api(t, http.MethodPut, "/sandboxes/"+a.SandboxID+"/network", key, map[string]any{}), http.StatusNoContent)
	// Egress rules are enforced (TestNetworkPolicyE2E); what cannot be is
	// refused by name, never accepted silently. This sandbox has no
	// internet access, so no device to apply rules to.
	if r := s.api(t, http.MethodPut, "/sandboxes/"+a.SandboxID+"/network", key,
		map[string]any{"allowOut": []string{"1.1.1.1"}, "denyOut": []string{"0.0.0.0/0"}}); r.status != http.StatusNotImplemented || !strings.Contains(string(r.body), "allow_internet_access false") {
		t.Errorf("network rules for a sandbox without internet: %d %s, want 501 saying why", r.status, r.body)
	}
	for name, body := range map[string]map[string]any{
		"a domain denied":     {"denyOut": []string{"example.com"}},
		"a domain, no deny":   {"allowOut": []string{"example.com"}},
		"a CIDR out of range": {"allowOut": []string{"1.2.3.4/40"}},
	} {
		if r := s.api(t, http.MethodPut, "/sandboxes/"+a.SandboxID+"/network", key, body); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "network.") {
			t.Errorf("network %s: %d %s, want 400 naming the field", name, r.status, r.body)
		}
	}
	for name, body := range map[string]map[string]any{
		"transform rules": {"rules": map[string]any{"api.example.com": []map[string]any{{}}}},
		"egress proxy":    {"egressProxy": map[string]any{"address": "127.0.0.1:1080"}},
	} {
		if r := s.api(t, http.MethodPut, "/sandboxes/"+a.SandboxID+"/network", key, body); r.status != http.StatusNotImplemented || !strings.Contains(string(r.body), "network.") {
			t.Errorf("network %s: %d %s, want 501 naming the field", name, r.status, r.body)
		}
	}
	wantStatus(t, "network cleared", s.api(t, http.MethodPut, "/sandboxes/"+a.SandboxID+"/network", key, map[string]any{}), http.StatusNoContent)

	// --- kill -------------------------------------------------------------
	wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+a.SandboxID, key, nil), http.StatusNoContent)
	wantError(t, "kill again", s.api(t, http.MethodDelete, "/sandboxes/"+a.SandboxID, key, nil), http.StatusNotFound)
	wantError(t, "GET after kill", s.api(t, http.MethodGet, "/sandboxes/"+a.SandboxID, key, nil), http.StatusNotFound)
	wantError(t, "connect after kill", s.api(t, http.MethodPost, "/sandboxes/"+a.SandboxID+"/connect", key, map[string]any{"timeout": 10}), http.StatusNotFound)
	wantError(t, "pause after kill", s.api(t, http.MethodPost, "/sandboxes/"+a.SandboxID+"/pause", key, nil), http.StatusNotFound)
	left, _ := s.list(t, key, "")
	if slices.Contains(e2eIDs(left), a.SandboxID) {
		t.Errorf("list after kill still has %s: %v", a.SandboxID, e2eIDs(left))
	}
	if e2eExists(filepath.Join(e.runDir, "sandboxes", a.SandboxID)) {
		t.Errorf("kill left the state dir of %s", a.SandboxID)
	}

	// The API is also served at the root (E2B_API_URL=http://HOST:PORT).
	r = s.do(t, http.MethodGet, "/sandboxes/"+b.SandboxID, key, nil)
	wantStatus(t, "GET at the root alias", r, http.StatusOK)
	wantDetailBody(t, "GET at the root alias", r.body)

	// Prometheus metrics answer and count sandboxes.
	r = s.do(t, http.MethodGet, "/metrics", "", nil)
	wantStatus(t, "GET /metrics", r, http.StatusOK)
	for _, name := range []string{"sandboxd_http_requests_total", "sandboxd_sandbox_create_seconds"} {
		if !strings.Contains(string(r.body), name) {
			t.Errorf("GET /metrics lacks %s", name)
		}
	}
	// b and c run; a is killed.
	if want := `sandboxd_sandboxes{state="running",tenant="alice"} 2` + "\n"; !strings.Contains(string(r.body), want) {
		t.Errorf("GET /metrics lacks %q", want)
	}
}

// TestErrors checks the error answers of the REST API: 401 without a valid
// key on every route, 400 for a body that is not JSON and for negative
// timeouts, 501 for routes sandboxd does not serve; always E2B's
// {code, message} with code equal to the status.
func TestErrors(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s := e.start()
	key := e.keys["alice"]
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 300})
	id := sb.SandboxID

	type route struct{ method, path, body string }
	sandboxRoutes := []route{
		{"GET", "/sandboxes/%s", ""},
		{"DELETE", "/sandboxes/%s", ""},
		{"POST", "/sandboxes/%s/connect", `{"timeout":10}`},
		{"POST", "/v2/sandboxes/%s/connect", `{"timeout":10}`},
		{"POST", "/sandboxes/%s/pause", `{}`},
		{"POST", "/sandboxes/%s/resume", `{"timeout":10}`},
		{"POST", "/sandboxes/%s/timeout", `{"timeout":10}`},
		{"POST", "/sandboxes/%s/refreshes", `{"duration":10}`},
		{"GET", "/sandboxes/%s/metrics", ""},
		{"GET", "/sandboxes/%s/logs", ""},
		{"GET", "/v2/sandboxes/%s/logs", ""},
		{"PUT", "/sandboxes/%s/network", `{}`},
		{"POST", "/sandboxes/%s/fork", `{}`},
		{"POST", "/sandboxes/%s/snapshots", `{}`},
	}
	otherRoutes := []route{
		{"POST", "/sandboxes", `{"templateID":"base","allow_internet_access":false}`},
		{"POST", "/v2/sandboxes", `{"templateID":"base","allow_internet_access":false}`},
		{"GET", "/sandboxes", ""},
		{"GET", "/v2/sandboxes", ""},
		{"GET", "/sandboxes/metrics?sandbox_ids=" + id, ""},
		{"GET", "/templates", ""},
		{"GET", "/templates/base", ""},
		{"GET", "/templates/aliases/base", ""},
		{"GET", "/snapshots", ""},
		{"POST", "/v3/templates", `{"name":"x"}`},
		{"GET", "/no/such/route", ""},
	}
	var all []route
	for _, r := range sandboxRoutes {
		all = append(all, route{r.method, fmt.Sprintf(r.path, id), r.body})
	}
	all = append(all, otherRoutes...)

	t.Run("401", func(t *testing.T) {
		creds := []struct {
			name string
			hdr  http.Header
		}{
			{"no key", nil},
			{"unknown key of the right format", http.Header{"X-Api-Key": {"e2b_" + strings.Repeat("0", 40)}}},
			{"malformed key", http.Header{"X-Api-Key": {"not-a-key"}}},
			{"unknown bearer token", http.Header{"Authorization": {"Bearer e2b_" + strings.Repeat("1", 40)}}},
			{"empty bearer token", http.Header{"Authorization": {"Bearer "}}},
		}
		for _, prefix := range []string{e2eAPIPrefix, ""} {
			for _, rt := range all {
				for _, c := range creds {
					what := fmt.Sprintf("%s %s%s with %s", rt.method, prefix, rt.path, c.name)
					var body any
					if rt.body != "" {
						body = rt.body
					}
					r, err := s.tryDo(rt.method, prefix+rt.path, "", body, c.hdr)
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					wantError(t, what, r, http.StatusUnauthorized)
				}
			}
		}
		// Nothing was done on the sandbox's behalf.
		if d := s.get(t, key, id); d.State != "running" {
			t.Errorf("sandbox is %s after the unauthenticated calls, want running", d.State)
		}
		// The same key as a bearer token works (users add it through apiHeaders).
		r, err := s.tryDo(http.MethodGet, e2eAPIPrefix+"/sandboxes/"+id, "", nil, http.Header{"Authorization": {"Bearer " + key}})
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, "GET with a valid bearer token", r, http.StatusOK)
	})

	t.Run("400 bad JSON", func(t *testing.T) {
		for _, rt := range []route{
			{"POST", "/sandboxes", ""},
			{"POST", "/v2/sandboxes", ""},
			{"POST", "/sandboxes/" + id + "/connect", ""},
			{"POST", "/v2/sandboxes/" + id + "/connect", ""},
			{"POST", "/sandboxes/" + id + "/resume", ""},
			{"POST", "/sandboxes/" + id + "/pause", ""},
			{"POST", "/sandboxes/" + id + "/timeout", ""},
			{"POST", "/sandboxes/" + id + "/refreshes", ""},
			{"PUT", "/sandboxes/" + id + "/network", ""},
		} {
			for _, body := range []string{`{bad`, `[1,2]`, `"str"`} {
				wantError(t, fmt.Sprintf("%s %s with body %s", rt.method, rt.path, body),
					s.api(t, rt.method, rt.path, key, body), http.StatusBadRequest)
			}
		}
	})

	t.Run("400 negative timeout", func(t *testing.T) {
		for _, rt := range []route{
			{"POST", "/sandboxes", `{"templateID":"base","timeout":-1,"allow_internet_access":false}`},
			{"POST", "/v2/sandboxes", `{"templateID":"base","timeout":-1,"allow_internet_access":false}`},
			{"POST", "/sandboxes/" + id + "/connect", `{"timeout":-1}`},
			{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":-1}`},
			{"POST", "/sandboxes/" + id + "/resume", `{"timeout":-1}`},
			{"POST", "/sandboxes/" + id + "/refreshes", `{"duration":-1}`},
		} {
			wantError(t, rt.method+" "+rt.path+" "+rt.body, s.api(t, rt.method, rt.path, key, rt.body), http.StatusBadRequest)
		}
		if got := s.get(t, key, id); got.State != "running" {
			t.Errorf("state %s after rejected calls, want running", got.State)
		}
	})

	t.Run("400 unknown template", func(t *testing.T) {
		before := e2eStateDirs(e)
		for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
			wantError(t, "create from an unknown template", s.api(t, http.MethodPost, path, key,
				map[string]any{"templateID": "no-such-template", "allow_internet_access": false}), http.StatusBadRequest)
		}
		// The failed creates left nothing: no row, no sandbox.
		if got, _ := s.list(t, key, ""); !slices.Equal(e2eIDs(got), []string{id}) {
			t.Errorf("list after failed creates: %v, want [%s]", e2eIDs(got), id)
		}
		if after := e2eStateDirs(e); !slices.Equal(after, before) {
			t.Errorf("sandbox state dirs %v after the failed creates, %v before", after, before)
		}
	})

	t.Run("revoked key", func(t *testing.T) {
		// `sandboxd keys` works on the data dir of a running sandboxd.
		key2, keyID := e.createKeyWithID("alice")
		wantStatus(t, "GET with a new key", s.api(t, http.MethodGet, "/sandboxes/"+id, key2, nil), http.StatusOK)
		e.sandboxdCLI(t, "keys", "revoke", "--data-dir", e.dataDir, keyID)
		wantError(t, "GET with a revoked key", s.api(t, http.MethodGet, "/sandboxes/"+id, key2, nil), http.StatusUnauthorized)
		wantStatus(t, "GET with the other key", s.api(t, http.MethodGet, "/sandboxes/"+id, key, nil), http.StatusOK)
	})

	t.Run("400 bad list parameters", func(t *testing.T) {
		for _, q := range []string{"limit=0", "limit=101", "limit=x", "state=bogus", "order=up", "nextToken=garbage", "startedAfter=yesterday"} {
			wantError(t, "GET /v2/sandboxes?"+q, s.api(t, http.MethodGet, "/v2/sandboxes?"+q, key, nil), http.StatusBadRequest)
		}
	})

	t.Run("501", func(t *testing.T) {
		for _, prefix := range []string{e2eAPIPrefix, ""} {
			for _, rt := range []route{
				{"GET", "/no/such/route", ""},
				{"POST", "/v9/sandboxes", `{}`},
				{"GET", "/sandboxes/" + id + "/nope", ""},
				{"GET", "/teams", ""},
				{"GET", "/api-keys", ""},
			} {
				var body any
				if rt.body != "" {
					body = rt.body
				}
				wantError(t, rt.method+" "+prefix+rt.path, s.do(t, rt.method, prefix+rt.path, key, body), http.StatusNotImplemented)
			}
			// A method the path does not serve is 405, not 501.
			wantError(t, "PATCH "+prefix+"/sandboxes/"+id, s.do(t, http.MethodPatch, prefix+"/sandboxes/"+id, key, `{}`), http.StatusMethodNotAllowed)
		}
	})
}

// TestCrossTenant checks that another tenant's sandbox is, on every sandbox
// route, answered exactly like a sandbox that does not exist, is not listed,
// and is left untouched.
func TestCrossTenant(t *testing.T) {
	e := newE2EEnv(t, "alice", "bob")
	s := e.start()
	keyA, keyB := e.keys["alice"], e.keys["bob"]
	md := map[string]string{"owner": "alice"}
	running, _ := e.create(t, "/v2/sandboxes", keyA, map[string]any{"timeout": 300, "metadata": md})
	paused, _ := e.create(t, "/sandboxes", keyA, map[string]any{"timeout": 300, "metadata": md})
	wantStatus(t, "pause", s.api(t, http.MethodPost, "/sandboxes/"+paused.SandboxID+"/pause", keyA, nil), http.StatusNoContent)
	beforeRunning := s.get(t, keyA, running.SandboxID)
	beforePaused := s.get(t, keyA, paused.SandboxID)

	routes := []struct{ method, path, body string }{
		{"GET", "/sandboxes/%s", ""},
		{"POST", "/sandboxes/%s/connect", `{"timeout":600}`},
		{"POST", "/v2/sandboxes/%s/connect", `{"timeout":600}`},
		{"POST", "/sandboxes/%s/pause", `{}`},
		{"POST", "/sandboxes/%s/resume", `{"timeout":600}`},
		{"POST", "/sandboxes/%s/timeout", `{"timeout":1}`},
		{"POST", "/sandboxes/%s/refreshes", `{"duration":600}`},
		{"GET", "/sandboxes/%s/metrics", ""},
		{"GET", "/sandboxes/%s/logs", ""},
		{"GET", "/v2/sandboxes/%s/logs", ""},
		{"PUT", "/sandboxes/%s/network", `{"allowOut":["1.1.1.1"]}`},
		{"DELETE", "/sandboxes/%s", ""}, // last: were it to succeed, the rest would test nothing
	}
	for _, target := range []struct {
		state string
		id    string
	}{{"running", running.SandboxID}, {"paused", paused.SandboxID}} {
		for _, rt := range routes {
			missing := e2eMissingID()
			var body any
			if rt.body != "" {
				body = rt.body
			}
			foreign := s.api(t, rt.method, fmt.Sprintf(rt.path, target.id), keyB, body)
			absent := s.api(t, rt.method, fmt.Sprintf(rt.path, missing), keyB, body)
			what := fmt.Sprintf("%s %s of a %s foreign sandbox", rt.method, rt.path, target.state)
			wantError(t, what, foreign, http.StatusNotFound)
			// Same status and body, once each id is replaced by a placeholder
			// (the message may name the id the caller gave).
			norm := func(r e2eResponse, id string) string { return strings.ReplaceAll(string(r.body), id, "<ID>") }
			if foreign.status != absent.status || norm(foreign, target.id) != norm(absent, missing) {
				t.Errorf("%s: answered %s, but a missing id gets %s", what, foreign, absent)
			}
			if foreign.header.Get("Content-Type") != absent.header.Get("Content-Type") {
				t.Errorf("%s: Content-Type %q vs %q for a missing id", what, foreign.header.Get("Content-Type"), absent.header.Get("Content-Type"))
			}
		}
	}
	// The batch metrics route leaves foreign ids out, like missing ones.
	r := s.api(t, http.MethodGet, "/sandboxes/metrics?sandbox_ids="+running.SandboxID+","+paused.SandboxID, keyB, nil)
	wantStatus(t, "GET /sandboxes/metrics as bob", r, http.StatusOK)
	if strings.Contains(string(r.body), running.SandboxID) || strings.Contains(string(r.body), paused.SandboxID) {
		t.Errorf("GET /sandboxes/metrics as bob shows alice's sandboxes: %s", r.body)
	}

	// Bob lists nothing, with or without alice's metadata as a filter.
	for _, q := range []string{"", e2eMetadataQuery(md), "state=paused", "state=running"} {
		if got, _ := s.list(t, keyB, q); len(got) != 0 {
			t.Errorf("bob's list ?%s shows %v", q, e2eIDs(got))
		}
	}
	r = s.api(t, http.MethodGet, "/sandboxes", keyB, nil)
	wantStatus(t, "GET /sandboxes as bob", r, http.StatusOK)
	if strings.TrimSpace(string(r.body)) != "[]" {
		t.Errorf("bob's v1 list: %s, want []", r.body)
	}

	// Alice's sandboxes are as they were: states, end times, network.
	for _, c := range []struct {
		before e2eDetail
		state  string
	}{{beforeRunning, "running"}, {beforePaused, "paused"}} {
		after := s.get(t, keyA, c.before.SandboxID)
		if after.State != c.state {
			t.Errorf("alice's %s sandbox is %s after bob's calls", c.state, after.State)
		}
		if !after.EndAt.Equal(c.before.EndAt) {
			t.Errorf("alice's %s sandbox: endAt changed from %v to %v by bob's calls", c.state, c.before.EndAt, after.EndAt)
		}
		r := s.api(t, http.MethodGet, "/sandboxes/"+c.before.SandboxID, keyA, nil)
		if strings.Contains(string(r.body), "1.1.1.1") {
			t.Errorf("bob's network update reached alice's sandbox: %s", r.body)
		}
	}
	aliceList, _ := s.list(t, keyA, "")
	if got, want := e2eSortedIDs(aliceList), e2eSorted(running.SandboxID, paused.SandboxID); !slices.Equal(got, want) {
		t.Errorf("alice's list: %v, want %v", got, want)
	}
	s.mustRun(t, running.SandboxID, *running.EnvdAccessToken, "true")
}

// TestDataPlane runs commands and moves files through sandboxd's proxy with
// the routing headers, and checks the proxy's answers for missing
// credentials, unknown, paused and dead sandboxes.
func TestDataPlane(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s := e.start()
	key := e.keys["alice"]
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 300, "envVars": map[string]string{"E2E_VAR": "set at create"}})
	id, token := sb.SandboxID, *sb.EnvdAccessToken

	t.Run("commands", func(t *testing.T) {
		for _, c := range []struct {
			script, stdout, stderr string
			exit                   int32
		}{
			{"echo hi", "hi\n", "", 0},
			{"echo out; echo err >&2; exit 3", "out\n", "err\n", 3},
			{"id -un; pwd", "user\n/home/user\n", "", 0},
			{`printf %s "$E2E_VAR"`, "set at create", "", 0}, // envVars reach envd through /init
		} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			res, err := s.run(ctx, id, token, c.script)
			cancel()
			if err != nil {
				t.Fatalf("run %q: %v", c.script, err)
			}
			if !res.ended || res.exitCode != c.exit || res.stdout != c.stdout || res.stderr != c.stderr {
				t.Errorf("run %q: ended=%v exit=%d stdout=%q stderr=%q; want exit=%d stdout=%q stderr=%q",
					c.script, res.ended, res.exitCode, res.stdout, res.stderr, c.exit, c.stdout, c.stderr)
			}
		}
	})

	t.Run("envd health and files", func(t *testing.T) {
		wantStatus(t, "GET /health through the proxy", s.envd(t, id, token, http.MethodGet, "/health", nil, ""), http.StatusNoContent)
		content := []byte("written through the proxy " + e2eRandHex(8) + "\n")
		s.writeFile(t, id, token, "/tmp/e2e/data.txt", content)
		if got := s.readFile(t, id, token, "/tmp/e2e/data.txt"); string(got) != string(content) {
			t.Errorf("read back %q, want %q", got, content)
		}
		if res := s.mustRun(t, id, token, "cat /tmp/e2e/data.txt"); res.stdout != string(content) {
			t.Errorf("cat: %q, want %q", res.stdout, content)
		}
		// 8 MiB both ways: the proxy streams bodies without mangling them.
		big := make([]byte, 8<<20)
		_, _ = rand.Read(big)
		s.writeFile(t, id, token, "/tmp/e2e/big.bin", big)
		if got := s.readFile(t, id, token, "/tmp/e2e/big.bin"); !bytes.Equal(got, big) {
			t.Errorf("8 MiB read back: %d bytes, equal=%v", len(got), bytes.Equal(got, big))
		}
		sum := sha256.Sum256(big)
		if res := s.mustRun(t, id, token, "sha256sum /tmp/e2e/big.bin"); !strings.HasPrefix(res.stdout, hex.EncodeToString(sum[:])+" ") {
			t.Errorf("sha256sum in the sandbox: %q, want %x", res.stdout, sum)
		}
	})

	t.Run("access token", func(t *testing.T) {
		for _, tok := range []struct{ name, value string }{{"no token", ""}, {"wrong token", token + "x"}} {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, err := s.run(ctx, id, tok.value, "echo hi")
			cancel()
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("process.Start with %s: %v, want unauthenticated", tok.name, err)
			}
			// The same call at the HTTP level: 401.
			r := s.envd(t, id, tok.value, http.MethodPost, "/process.Process/Start",
				[]byte(`{"process":{"cmd":"/bin/sh","args":["-c","echo hi"]}}`), "application/json")
			wantStatus(t, "POST /process.Process/Start with "+tok.name, r, http.StatusUnauthorized)
			r = s.envd(t, id, tok.value, http.MethodGet, "/files?path=/tmp/e2e/data.txt", nil, "")
			wantStatus(t, "GET /files with "+tok.name, r, http.StatusUnauthorized)
		}
	})

	t.Run("envd internal routes are not exposed", func(t *testing.T) {
		for _, p := range []string{"/init", "/init/", "//init", "/x/../init"} {
			r := s.envd(t, id, token, http.MethodPost, p, []byte(`{"accessToken":"stolen"}`), "application/json")
			if r.status != http.StatusNotFound {
				t.Errorf("POST %s through the proxy: %s, want 404", p, r)
			}
		}
		// The token was not replaced.
		s.mustRun(t, id, token, "true")
	})

	t.Run("bad routing headers", func(t *testing.T) {
		for _, c := range []struct {
			name string
			hdr  http.Header
		}{
			{"id without port", http.Header{"E2b-Sandbox-Id": {id}}},
			{"port without id", http.Header{"E2b-Sandbox-Port": {e2eEnvdPort}}},
			{"port not a number", http.Header{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"envd"}}},
			{"port out of range", http.Header{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"70000"}}},
			{"id not [a-z0-9]", http.Header{"E2b-Sandbox-Id": {"Bad-ID"}, "E2b-Sandbox-Port": {e2eEnvdPort}}},
		} {
			c.hdr.Set("X-Access-Token", token)
			r, err := s.tryDo(http.MethodGet, "/health", "", nil, c.hdr)
			if err != nil {
				t.Fatal(err)
			}
			if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"code":400`) {
				t.Errorf("%s: %s, want 400 with a JSON body", c.name, r)
			}
		}
	})

	t.Run("unknown sandbox", func(t *testing.T) {
		missing := e2eMissingID()
		for _, p := range []string{"/health", "/files?path=/etc/hostname", "/process.Process/Start"} {
			r := s.envd(t, missing, token, http.MethodGet, p, nil, "")
			wantProxyNotFound(t, "GET "+p+" of an unknown sandbox", r, missing)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := s.run(ctx, missing, token, "echo hi"); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Errorf("process.Start in an unknown sandbox: %v, want unavailable (Connect's code for 502)", err)
		}
	})

	t.Run("paused sandbox", func(t *testing.T) {
		// Warm the proxy's connection pool first: a pooled connection into
		// a frozen sandbox must not make the next request hang.
		s.mustRun(t, id, token, "true")
		wantStatus(t, "pause", s.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, nil), http.StatusNoContent)
		wantProxyNotFound(t, "GET /health of a paused sandbox without auto-resume", s.envd(t, id, token, http.MethodGet, "/health", nil, ""), id)
		wantStatus(t, "connect", s.api(t, http.MethodPost, "/v2/sandboxes/"+id+"/connect", key, map[string]any{"timeout": 300}), http.StatusCreated)
		if res := s.mustRun(t, id, token, "echo back"); res.stdout != "back\n" {
			t.Errorf("after resume: stdout %q", res.stdout)
		}
	})

	t.Run("auto-resume", func(t *testing.T) {
		sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 300, "autoPause": true, "autoResume": map[string]any{"enabled": true}})
		s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "true")
		wantStatus(t, "pause", s.api(t, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", key, nil), http.StatusNoContent)
		// Traffic to a paused sandbox with auto-resume resumes it, then is served.
		wantStatus(t, "GET /health of a paused sandbox with auto-resume", s.envd(t, sb.SandboxID, *sb.EnvdAccessToken, http.MethodGet, "/health", nil, ""), http.StatusNoContent)
		if got := s.get(t, key, sb.SandboxID).State; got != "running" {
			t.Errorf("state after traffic resumed it: %s, want running", got)
		}
		if e2eAuditLine(s, "auto_resume", sb.SandboxID) == nil {
			t.Errorf("no audit line for the auto-resume of %s", sb.SandboxID)
		}
		if res := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "echo resumed"); res.stdout != "resumed\n" {
			t.Errorf("after auto-resume: %q", res.stdout)
		}
		wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, key, nil), http.StatusNoContent)
	})

	t.Run("sandbox without access token", func(t *testing.T) {
		sb, _ := e.create(t, "/sandboxes", key, map[string]any{"timeout": 300, "secure": false})
		if res := s.mustRun(t, sb.SandboxID, "", "echo open"); res.stdout != "open\n" {
			t.Errorf("run without a token in a sandbox created with secure=false: %q", res.stdout)
		}
		s.writeFile(t, sb.SandboxID, "", "/tmp/open.txt", []byte("open"))
		if got := s.readFile(t, sb.SandboxID, "", "/tmp/open.txt"); string(got) != "open" {
			t.Errorf("read back %q", got)
		}
		wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, key, nil), http.StatusNoContent)
	})

	t.Run("killed sandbox", func(t *testing.T) {
		wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
		for _, p := range []string{"/health", "/files?path=/tmp/e2e/data.txt"} {
			wantProxyNotFound(t, "GET "+p+" after kill", s.envd(t, id, token, http.MethodGet, p, nil, ""), id)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := s.run(ctx, id, token, "echo hi"); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Errorf("process.Start after kill: %v, want unavailable (Connect's code for 502)", err)
		}
	})
}

// TestRestart SIGKILLs sandboxd with a running and two paused sandboxes,
// starts a new sandboxd on the same data and run dirs, and checks that they
// are back with their state, files and processes, that the new sandboxd
// can pause, resume and kill what it adopted, and that a sandbox that
// expired meanwhile is swept.
func TestRestart(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s1 := e.start()
	key := e.keys["alice"]
	run, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 600, "metadata": map[string]string{"role": "running"}})
	pau, _ := e.create(t, "/sandboxes", key, map[string]any{"timeout": 600, "metadata": map[string]string{"role": "paused"}})
	// Stays paused across the restart and is killed while paused.
	frozen, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 600, "metadata": map[string]string{"role": "frozen"}})
	runTok, pauTok := *run.EnvdAccessToken, *pau.EnvdAccessToken

	runFile := []byte("survives a restart " + e2eRandHex(8))
	pauFile := []byte("survives a pause and a restart " + e2eRandHex(8))
	s1.writeFile(t, run.SandboxID, runTok, "/home/user/restart.txt", runFile)
	s1.writeFile(t, pau.SandboxID, pauTok, "/tmp/paused.txt", pauFile)
	// A process that runs across the restart.
	s1.mustRun(t, run.SandboxID, runTok, "sleep 3600 >/dev/null 2>&1 </dev/null & echo $! >/tmp/sleep.pid")
	for _, id := range []string{pau.SandboxID, frozen.SandboxID} {
		wantStatus(t, "pause", s1.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, nil), http.StatusNoContent)
	}
	before := map[string]e2eDetail{}
	for _, id := range []string{run.SandboxID, pau.SandboxID, frozen.SandboxID} {
		before[id] = s1.get(t, key, id)
	}
	wantState := map[string]string{run.SandboxID: "running", pau.SandboxID: "paused", frozen.SandboxID: "paused"}

	// One more whose end time passes while no sandboxd runs: the next one
	// must sweep it. The sweeper looks once a second, so SIGKILL, a few
	// milliseconds after the create, comes well before it could act; if it
	// ever did, that part of the test is skipped below, not failed.
	exp, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 3})

	if err := s1.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for id := range before {
		if !e2eExists(filepath.Join(e.runDir, "sandboxes", id)) {
			t.Fatalf("sandbox %s did not outlive sandboxd", id)
		}
	}
	expSweptByS1 := e2eAuditLine(s1, "timeout_kill", exp.SandboxID) != nil

	s2 := e.start()
	if expSweptByS1 {
		t.Logf("the first sandboxd swept %s before its SIGKILL; not checking the sweep after restart", exp.SandboxID)
	} else {
		e2eEventually(t, "the restarted sandboxd sweeps the sandbox that expired while none ran", 15*time.Second, 100*time.Millisecond,
			func() (bool, string) {
				r := s2.api(t, http.MethodGet, "/sandboxes/"+exp.SandboxID, key, nil)
				return r.status == http.StatusNotFound && e2eAuditLine(s2, "timeout_kill", exp.SandboxID) != nil, r.String()
			})
		if e2eExists(filepath.Join(e.runDir, "sandboxes", exp.SandboxID)) {
			t.Errorf("the sweep after restart left the state dir of %s", exp.SandboxID)
		}
	}
	listed, _ := s2.list(t, key, "")
	if got, want := e2eSortedIDs(listed), e2eSorted(run.SandboxID, pau.SandboxID, frozen.SandboxID); !slices.Equal(got, want) {
		t.Fatalf("list after restart: %v, want %v", got, want)
	}
	for _, d := range listed {
		if want := wantState[d.SandboxID]; d.State != want {
			t.Errorf("after restart %s is %s, want %s", d.SandboxID, d.State, want)
		}
		b := before[d.SandboxID]
		if !d.StartedAt.Equal(b.StartedAt) || !d.EndAt.Equal(b.EndAt) || !maps.Equal(d.Metadata, b.Metadata) {
			t.Errorf("after restart %s: startedAt %v endAt %v metadata %v; before %v %v %v",
				d.SandboxID, d.StartedAt, d.EndAt, d.Metadata, b.StartedAt, b.EndAt, b.Metadata)
		}
	}
	for id, want := range wantState {
		if got := s2.get(t, key, id).State; got != want {
			t.Errorf("GET %s after restart: state %s, want %s", id, got, want)
		}
	}

	// The running one: file, process, access token.
	if got := s2.readFile(t, run.SandboxID, runTok, "/home/user/restart.txt"); string(got) != string(runFile) {
		t.Errorf("file after restart: %q, want %q", got, runFile)
	}
	if res := s2.mustRun(t, run.SandboxID, runTok, `kill -0 "$(cat /tmp/sleep.pid)" && echo alive`); res.stdout != "alive\n" {
		t.Errorf("the background process did not survive the restart: %q %q", res.stdout, res.stderr)
	}
	r := s2.envd(t, run.SandboxID, "", http.MethodGet, "/files?path=/home/user/restart.txt", nil, "")
	wantStatus(t, "GET /files without the token after restart", r, http.StatusUnauthorized)
	// The new sandboxd drives the adopted sandbox: metrics, pause, resume.
	r = s2.api(t, http.MethodGet, "/sandboxes/"+run.SandboxID+"/metrics", key, nil)
	wantStatus(t, "metrics of an adopted sandbox", r, http.StatusOK)
	var ms []struct {
		MemTotal int64 `json:"memTotal"`
	}
	e2eDecode(t, "metrics", r, &ms)
	if len(ms) != 1 || ms[0].MemTotal <= 0 {
		t.Errorf("metrics of an adopted sandbox: %s, want one sample with memTotal > 0", r.body)
	}
	wantStatus(t, "pause the adopted sandbox", s2.api(t, http.MethodPost, "/sandboxes/"+run.SandboxID+"/pause", key, nil), http.StatusNoContent)
	wantProxyNotFound(t, "GET /health of the adopted sandbox once paused", s2.envd(t, run.SandboxID, runTok, http.MethodGet, "/health", nil, ""), run.SandboxID)
	wantStatus(t, "resume the adopted sandbox", s2.api(t, http.MethodPost, "/v2/sandboxes/"+run.SandboxID+"/connect", key, map[string]any{"timeout": 600}), http.StatusCreated)
	if res := s2.mustRun(t, run.SandboxID, runTok, `kill -0 "$(cat /tmp/sleep.pid)" && echo alive`); res.stdout != "alive\n" {
		t.Errorf("the background process did not survive pause and resume: %q %q", res.stdout, res.stderr)
	}

	// The paused one: unreachable until connect resumes it.
	wantProxyNotFound(t, "GET /health of the paused sandbox", s2.envd(t, pau.SandboxID, pauTok, http.MethodGet, "/health", nil, ""), pau.SandboxID)
	r = s2.api(t, http.MethodPost, "/sandboxes/"+pau.SandboxID+"/connect", key, map[string]any{"timeout": 600})
	wantStatus(t, "connect the paused sandbox after restart", r, http.StatusCreated)
	if got := wantSandboxBody(t, "connect", r.body); got.EnvdAccessToken == nil || *got.EnvdAccessToken != pauTok {
		t.Errorf("connect after restart: %s, want the same access token", r.body)
	}
	if res := s2.mustRun(t, pau.SandboxID, pauTok, "cat /tmp/paused.txt"); res.stdout != string(pauFile) {
		t.Errorf("file of the resumed sandbox: %q, want %q", res.stdout, pauFile)
	}

	// frozen is killed while still paused (the kill must thaw it first).
	for _, id := range []string{frozen.SandboxID, run.SandboxID, pau.SandboxID} {
		wantStatus(t, "kill "+id, s2.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
		if e2eExists(filepath.Join(e.runDir, "sandboxes", id)) {
			t.Errorf("kill after restart left the state dir of %s", id)
		}
		if cg := e2eSandboxCgroups(id); len(cg) != 0 {
			t.Errorf("kill after restart left cgroups %v", cg)
		}
	}
	if got, _ := s2.list(t, key, ""); len(got) != 0 {
		t.Errorf("list after killing them all: %v", e2eIDs(got))
	}
	// The env's cleanup checks the run dir, mounts and cgroups once more.
}

// TestPauseToDisk: pause with memory=false ends every process of the
// sandbox and keeps its files off its memory; it survives a restart of
// sandboxd, and connect starts it afresh with its env vars, access token and
// default user applied again. Killing it while paused removes its files.
func TestPauseToDisk(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s1 := e.start()
	key := e.keys["alice"]
	id, tok := e.createKept(t, key)
	content := []byte("survives a pause to disk " + e2eRandHex(8))
	s1.writeFile(t, id, tok, "/home/user/disk.txt", content)
	s1.mustRun(t, id, tok, "sleep 3600 >/dev/null 2>&1 </dev/null & echo $! >/tmp/sleep.pid")
	wantEnv := s1.mustRun(t, id, tok, `echo "$SBX_KEPT $(id -un)"`).stdout
	if !strings.HasPrefix(wantEnv, "kept ") {
		t.Fatalf("env var before the pause: %q", wantEnv)
	}

	wantStatus(t, "pause memory=false", s1.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, map[string]any{"memory": false}), http.StatusNoContent)
	wantError(t, "pause again", s1.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, map[string]any{"memory": false}), http.StatusConflict)
	if cg := e2eSandboxCgroups(id); len(cg) != 0 {
		t.Errorf("cgroups of a sandbox paused to disk: %v", cg)
	}
	if ms := e2eMountsUnder(filepath.Join(e.runDir, "sandboxes", id)); len(ms) != 0 {
		t.Errorf("mounts of a sandbox paused to disk: %v", ms)
	}
	saved := filepath.Join(e.dataDir, "paused", id)
	if !e2eExists(filepath.Join(saved, "upper", "home", "user", "disk.txt")) {
		t.Errorf("no saved layer with the file under %s", saved)
	}
	wantProxyNotFound(t, "GET /health while paused to disk", s1.envd(t, id, tok, http.MethodGet, "/health", nil, ""), id)

	if err := s1.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s2 := e.start()
	if got := s2.get(t, key, id).State; got != "paused" {
		t.Fatalf("after restart: %s, want paused", got)
	}
	r := s2.api(t, http.MethodPost, "/sandboxes/"+id+"/connect", key, map[string]any{"timeout": 600})
	wantStatus(t, "connect after a pause to disk", r, http.StatusCreated)
	if got := s2.readFile(t, id, tok, "/home/user/disk.txt"); string(got) != string(content) {
		t.Errorf("file after resume: %q, want %q", got, content)
	}
	if res := s2.mustRun(t, id, tok, `echo "$SBX_KEPT $(id -un)"`); res.stdout != wantEnv {
		t.Errorf("env var and default user after resume: %q, want %q", res.stdout, wantEnv)
	}
	if res := s2.mustRun(t, id, tok, `test -s /tmp/sleep.pid && ! grep -qsx sleep /proc/[0-9]*/comm && echo restarted`); res.stdout != "restarted\n" {
		t.Errorf("after resume: %q %q; want /tmp kept and the old process gone (pids start over, so by name)", res.stdout, res.stderr)
	}
	wantStatus(t, "GET /files without the token after resume", s2.envd(t, id, "", http.MethodGet, "/files?path=/home/user/disk.txt", nil, ""), http.StatusUnauthorized)
	if e2eExists(saved) {
		t.Errorf("resume left the saved layer %s", saved)
	}

	// Killed while paused to disk: the saved layer goes too.
	wantStatus(t, "pause to disk again", s2.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, map[string]any{"memory": false}), http.StatusNoContent)
	wantStatus(t, "kill while paused to disk", s2.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
	for _, p := range []string{saved, filepath.Join(e.runDir, "sandboxes", id)} {
		if e2eExists(p) {
			t.Errorf("kill of a sandbox paused to disk left %s", p)
		}
	}
}

// TestTemplateResources: a template's declared resources apply to creates
// that name none (E2B's create body cannot), the sandbox gets them as
// limits, and the templates listing reports them.
func TestTemplateResources(t *testing.T) {
	e := newE2EEnv(t, "alice")
	e.serveArgs = []string{"--template", "base=,cpu=1,memory=300,disk=200"}
	s := e.start()
	key := e.keys["alice"]
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 600})
	d := s.get(t, key, sb.SandboxID)
	if d.CPUCount != 1 || d.MemoryMB != 300 || d.DiskSizeMB != 200 {
		t.Errorf("sandbox of base: cpuCount=%d memoryMB=%d diskSizeMB=%d; want 1 300 200", d.CPUCount, d.MemoryMB, d.DiskSizeMB)
	}
	r := s.api(t, http.MethodGet, "/sandboxes/"+sb.SandboxID+"/metrics", key, nil)
	wantStatus(t, "metrics", r, http.StatusOK)
	var ms []struct {
		MemTotal  int64 `json:"memTotal"`
		DiskTotal int64 `json:"diskTotal"`
	}
	e2eDecode(t, "metrics", r, &ms)
	if len(ms) != 1 || ms[0].MemTotal != 300<<20 || ms[0].DiskTotal != 200<<20 {
		t.Errorf("metrics: %s; want memTotal %d and diskTotal %d", r.body, 300<<20, 200<<20)
	}
	r = s.api(t, http.MethodGet, "/templates", key, nil)
	wantStatus(t, "GET /templates", r, http.StatusOK)
	type template struct {
		TemplateID string `json:"templateID"`
		CPUCount   int    `json:"cpuCount"`
		MemoryMB   int    `json:"memoryMB"`
		DiskSizeMB int    `json:"diskSizeMB"`
	}
	var tpls []template
	e2eDecode(t, "templates", r, &tpls)
	// The backend's templates: base and the host view, host.
	i := slices.IndexFunc(tpls, func(t template) bool { return t.TemplateID == "base" })
	if len(tpls) != 2 || i < 0 || tpls[i].CPUCount != 1 || tpls[i].MemoryMB != 300 || tpls[i].DiskSizeMB != 200 {
		t.Errorf("GET /templates = %s; want base with 1 CPU, 300 MiB, 200 MiB disk, and host", r.body)
	}
}

// TestSweeper lets the sweeper enforce end times: kill by default, pause
// with autoPause; each writes its audit line.
func TestSweeper(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s := e.start()
	key := e.keys["alice"]

	for _, c := range []struct {
		name      string
		autoPause bool
		toDisk    bool // autoPauseMemory: false
		action    string
	}{
		{"kill", false, false, "timeout_kill"},
		{"pause", true, false, "timeout_pause"},
		{"pause to disk", true, true, "timeout_pause"},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := map[string]any{"timeout": 2, "autoPause": c.autoPause}
			if c.toDisk {
				body["autoPauseMemory"] = false
			}
			sb, _ := e.create(t, "/v2/sandboxes", key, body)
			id := sb.SandboxID
			e2eEventually(t, "the sweeper acts on "+id, 15*time.Second, 100*time.Millisecond, func() (bool, string) {
				r := s.api(t, http.MethodGet, "/sandboxes/"+id, key, nil)
				if c.autoPause {
					var d e2eDetail
					_ = json.Unmarshal(r.body, &d)
					return r.status == http.StatusOK && d.State == "paused", r.String()
				}
				return r.status == http.StatusNotFound, r.String()
			})
			e2eEventually(t, "audit line "+c.action, 5*time.Second, 50*time.Millisecond, func() (bool, string) {
				l := e2eAuditLine(s, c.action, id)
				if l == nil {
					return false, "no line with \"action\":\"" + c.action + "\" for " + id + " in sandboxd's stderr"
				}
				if l["audit"] != true || l["result"] != "ok" || l["tenant"] != "alice" {
					return false, fmt.Sprintf("audit line %v: want audit=true result=ok tenant=alice", l)
				}
				if want := map[bool]string{false: "memory", true: "disk"}[c.toDisk]; c.autoPause && l["kind"] != want {
					return false, fmt.Sprintf("audit line %v: want kind=%s", l, want)
				}
				return true, ""
			})
			if !strings.Contains(string(s.logs()), `"action":"`+c.action+`"`) {
				t.Errorf("stderr lacks the literal %q", `"action":"`+c.action+`"`)
			}
			if c.autoPause {
				wantProxyNotFound(t, "proxy to the auto-paused sandbox", s.envd(t, id, *sb.EnvdAccessToken, http.MethodGet, "/health", nil, ""), id)
				wantStatus(t, "connect", s.api(t, http.MethodPost, "/v2/sandboxes/"+id+"/connect", key, map[string]any{"timeout": 300}), http.StatusCreated)
				s.mustRun(t, id, *sb.EnvdAccessToken, "true")
				wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
				return
			}
			wantProxyNotFound(t, "proxy to the swept sandbox", s.envd(t, id, *sb.EnvdAccessToken, http.MethodGet, "/health", nil, ""), id)
			wantError(t, "kill after the sweep", s.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNotFound)
			if e2eExists(filepath.Join(e.runDir, "sandboxes", id)) {
				t.Errorf("the sweep left the state dir of %s", id)
			}
			if cg := e2eSandboxCgroups(id); len(cg) != 0 {
				t.Errorf("the sweep left cgroups %v", cg)
			}
		})
	}
}

// TestConcurrentSandboxes creates, uses, pauses and kills ten sandboxes of
// one tenant at once.
func TestConcurrentSandboxes(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s := e.start()
	key := e.keys["alice"]
	const n = 10
	sbs := make([]e2eSandbox, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := s.tryDo(http.MethodPost, e2eAPIPrefix+"/v2/sandboxes", key, map[string]any{
				"templateID": "base", "allow_internet_access": false, "timeout": 300,
				"metadata": map[string]string{"i": strconv.Itoa(i)},
			}, nil)
			if err != nil {
				t.Errorf("create %d: %v", i, err)
				return
			}
			if json.Unmarshal(r.body, &sbs[i]) == nil && sbs[i].SandboxID != "" {
				e.track(sbs[i].SandboxID, key)
			}
			if r.status != http.StatusCreated {
				t.Errorf("create %d: %s", i, r)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	seen := map[string]bool{}
	for _, sb := range sbs {
		if seen[sb.SandboxID] || sb.EnvdAccessToken == nil {
			t.Fatalf("sandboxes %+v: ids not unique or a token missing", sbs)
		}
		seen[sb.SandboxID] = true
	}

	for i, sb := range sbs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := s.run(ctx, sb.SandboxID, *sb.EnvdAccessToken, "echo "+strconv.Itoa(i))
			if err != nil || res.exitCode != 0 || res.stdout != strconv.Itoa(i)+"\n" {
				t.Errorf("run in sandbox %d (%s): %+v %v", i, sb.SandboxID, res, err)
			}
		})
	}
	wg.Wait()
	for i, sb := range sbs {
		got, _ := s.list(t, key, e2eMetadataQuery(map[string]string{"i": strconv.Itoa(i)}))
		if !slices.Equal(e2eIDs(got), []string{sb.SandboxID}) {
			t.Errorf("list metadata i=%d: %v, want [%s]", i, e2eIDs(got), sb.SandboxID)
		}
	}

	var odd []string
	for i, sb := range sbs {
		if i%2 == 1 {
			odd = append(odd, sb.SandboxID)
			wg.Go(func() {
				r, err := s.tryDo(http.MethodPost, e2eAPIPrefix+"/sandboxes/"+sb.SandboxID+"/pause", key, nil, nil)
				if err != nil || r.status != http.StatusNoContent {
					t.Errorf("pause %s: %v %v", sb.SandboxID, r, err)
				}
			})
		}
	}
	wg.Wait()
	paused, _ := s.list(t, key, "state=paused")
	if got := e2eSortedIDs(paused); !slices.Equal(got, e2eSorted(odd...)) {
		t.Errorf("list state=paused: %v, want %v", got, e2eSorted(odd...))
	}

	for _, sb := range sbs {
		wg.Go(func() {
			r, err := s.tryDo(http.MethodDelete, e2eAPIPrefix+"/sandboxes/"+sb.SandboxID, key, nil, nil)
			if err != nil || r.status != http.StatusNoContent {
				t.Errorf("kill %s: %v %v", sb.SandboxID, r, err)
			}
		})
	}
	wg.Wait()
	if got, _ := s.list(t, key, ""); len(got) != 0 {
		t.Errorf("list after killing all: %v", e2eIDs(got))
	}
	servedFrom := map[string]int{}
	for _, l := range s.logLines() {
		if l["action"] == "create" && l["result"] == "ok" {
			servedFrom[fmt.Sprint(l["served_from"])]++
		}
	}
	t.Logf("creates by where they were served from: %v", servedFrom)
}

// TestCreateFailureLeavesNothing makes creates fail after the backend has
// started the sandbox (envd refuses /init) or while it starts it (envd
// cannot even be executed), with env vars only the client chose: each must
// answer a 4xx with E2B's error body and leave no sandbox, row or host state.
func TestCreateFailureLeavesNothing(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s := e.start()
	key := e.keys["alice"]
	// Under the API's 1 MiB body limit, which answers 413 before any of this.
	eightOf110KiB := map[string]string{}
	for i := range 8 {
		eightOf110KiB["BIG"+strconv.Itoa(i)] = strings.Repeat("x", 110<<10)
	}
	for _, c := range []struct {
		name string
		env  map[string]string
	}{
		// Each value fits the kernel's 128 KiB limit for one exec string,
		// but together they exceed what envd's /init body may carry.
		{"env vars above 768 KiB in all", eightOf110KiB},
		// One value above 128 KiB: envd cannot be executed at all.
		{"one env var above 128 KiB", map[string]string{"BIG": strings.Repeat("x", 200<<10)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := e2eStateDirs(e)
			r := s.api(t, http.MethodPost, "/v2/sandboxes", key, map[string]any{
				"templateID": "base", "allow_internet_access": false, "envVars": c.env,
			})
			for _, id := range e2eStateDirs(e) {
				if !slices.Contains(before, id) {
					e.track(id, key) // for the cleanup, whatever happens below
					t.Errorf("the failed create left sandbox %s on the host", id)
					if g := s.api(t, http.MethodGet, "/sandboxes/"+id, key, nil); g.status != http.StatusNotFound {
						t.Errorf("GET of the failed create's sandbox %s: %s, want 404", id, g)
					}
				}
			}
			if r.status == http.StatusCreated {
				t.Fatalf("create with these env vars succeeded: %s", r)
			}
			for _, l := range s.logLines() {
				if _, named := l["sandbox_id"]; l["action"] == "create" && l["result"] == "error" && !named {
					t.Errorf("the audit line of the failed create names no sandbox: %v", l)
				}
			}
			wantError(t, "create with oversized env vars", r, http.StatusBadRequest)
		})
	}
}

// e2eStateDirs lists the sandbox state directories in the env's run dir.
func e2eStateDirs(e *e2eEnv) []string {
	ents, _ := os.ReadDir(filepath.Join(e.runDir, "sandboxes"))
	var out []string
	for _, ent := range ents {
		out = append(out, ent.Name())
	}
	return out
}

// TestTwoServersOnOneHost runs two sandboxd with their own data and run
// dirs on one host, as two users (or a test next to `make run`) would.
func TestTwoServersOnOneHost(t *testing.T) {
	e1 := newE2EEnv(t, "alice")
	s1 := e1.start()
	sb, _ := e1.create(t, "/v2/sandboxes", e1.keys["alice"], map[string]any{"timeout": 300})

	e2 := newE2EEnv(t, "bob")
	s2 := e2.start()
	sb2, _ := e2.create(t, "/v2/sandboxes", e2.keys["bob"], map[string]any{"timeout": 300})
	s2.mustRun(t, sb2.SandboxID, *sb2.EnvdAccessToken, "true")
	s1.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "true")
	// A restart of either must not touch the other's sandboxes.
	if err := s2.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s2 = e2.start()
	if err := s1.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s1 = e1.start()
	for _, c := range []struct {
		s  *e2eServer
		sb e2eSandbox
	}{{s1, sb}, {s2, sb2}} {
		c.s.mustRun(t, c.sb.SandboxID, *c.sb.EnvdAccessToken, "true")
		if len(e2eSandboxCgroups(c.sb.SandboxID)) == 0 {
			t.Errorf("sandbox %s lost its cgroups to the other sandboxd's start", c.sb.SandboxID)
		}
	}
}

// e2eAuditLine returns sandboxd's audit line for action on sandbox id, or nil.
func e2eAuditLine(s *e2eServer, action, id string) map[string]any {
	for _, l := range s.logLines() {
		if l["action"] == action && l["sandbox_id"] == id {
			return l
		}
	}
	return nil
}

func e2eSorted(s ...string) []string {
	return slices.Sorted(slices.Values(s))
}

func e2eSortedIDs(ds []e2eDetail) []string {
	return e2eSorted(e2eIDs(ds)...)
}

// TestPauseToDiskReboot: a sandbox paused to disk outlives a reboot of the
// host. The reboot is played by SIGKILLing sandboxd, unmounting what is
// under its run dir and removing it (the run dir is on /run, a tmpfs);
// the data dir, with the store and --pause-dir, is kept.
func TestPauseToDiskReboot(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s1 := e.start()
	key := e.keys["alice"]
	id, tok := e.createKept(t, key)
	content := []byte("survives a reboot " + e2eRandHex(8))
	s1.writeFile(t, id, tok, "/home/user/reboot.txt", content)
	wantEnv := s1.mustRun(t, id, tok, `echo "$SBX_KEPT"`).stdout
	wantStatus(t, "pause memory=false", s1.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, map[string]any{"memory": false}), http.StatusNoContent)
	if err := s1.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	mounts := e2eMountsUnder(e.runDir)
	for i := len(mounts) - 1; i >= 0; i-- { // innermost first
		if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil {
			t.Fatalf("unmount %s: %v", mounts[i], err)
		}
	}
	if err := os.RemoveAll(e.runDir); err != nil {
		t.Fatal(err)
	}

	s2 := e.start()
	if got := s2.get(t, key, id).State; got != "paused" {
		t.Fatalf("after the reboot: %s, want paused", got)
	}
	wantStatus(t, "connect after the reboot", s2.api(t, http.MethodPost, "/sandboxes/"+id+"/connect", key, map[string]any{"timeout": 600}), http.StatusCreated)
	if got := s2.readFile(t, id, tok, "/home/user/reboot.txt"); string(got) != string(content) {
		t.Errorf("file after the reboot: %q, want %q", got, content)
	}
	if res := s2.mustRun(t, id, tok, `echo "$SBX_KEPT"`); res.stdout != wantEnv {
		t.Errorf("env var after the reboot: %q, want %q", res.stdout, wantEnv)
	}
	wantStatus(t, "kill", s2.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
	if saved := filepath.Join(e.dataDir, "paused", id); e2eExists(saved) {
		t.Errorf("kill left the saved layer %s", saved)
	}
}
