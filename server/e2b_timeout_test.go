package server

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// TestE2BSetTimeoutNow: as in E2B, POST /sandboxes/{id}/timeout with 0 (a
// negative value is 0) answers 204 and the sandbox's on-timeout action runs
// at once: a kill, or a pause for a sandbox created with autoPause (what
// the SDKs' tests do to force an auto-pause). The sweeper's tick is an hour
// here: only the wake-up can act in time.
func TestE2BSetTimeoutNow(t *testing.T) {
	for _, tc := range []struct {
		name, create, timeout string
		wantStatus            int // GET /sandboxes/{id} afterwards
		wantState             string
	}{
		{"zero kills", `{"templateID":"base"}`, `{"timeout":0}`, http.StatusNotFound, ""},
		{"negative kills", `{"templateID":"base"}`, `{"timeout":-3}`, http.StatusNotFound, ""},
		{"zero auto-pauses", `{"templateID":"base","autoPause":true}`, `{"timeout":0}`, http.StatusOK, "paused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t, nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); e.mgr.Run(ctx, time.Hour) }()
			t.Cleanup(func() { cancel(); <-done })
			hdr := map[string]string{"Content-Type": "application/json"}
			r, b := e.do(t, http.MethodPost, "/sandboxes", tc.create, hdr)
			if r.StatusCode != http.StatusCreated {
				t.Fatalf("create = %d %s", r.StatusCode, b)
			}
			id := sandboxID(t, b)
			if r, b := e.do(t, http.MethodPost, "/sandboxes/"+id+"/timeout", tc.timeout, hdr); r.StatusCode != http.StatusNoContent {
				t.Fatalf("timeout %s = %d %s; want 204", tc.timeout, r.StatusCode, b)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				r, b := e.do(t, http.MethodGet, "/sandboxes/"+id, "", nil)
				if r.StatusCode == tc.wantStatus && (tc.wantState == "" || stateOf(t, b) == tc.wantState) {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("GET /sandboxes/%s = %d %s 5s after timeout %s; want %d %s", id, r.StatusCode, b, tc.timeout, tc.wantStatus, tc.wantState)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func sandboxID(t *testing.T, body []byte) string {
	t.Helper()
	var v struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.SandboxID == "" {
		t.Fatalf("no sandboxID in %s: %v", body, err)
	}
	return v.SandboxID
}

func stateOf(t *testing.T, body []byte) string {
	t.Helper()
	var v struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return v.State
}
