package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	rtrace "runtime/trace"
	"testing"

	"github.com/sandboxd/sandboxd/tenant"
)

// TestAccessLogTenantAndTraceTask checks that the access log names the
// tenant the auth middleware found, and that while an execution trace runs
// the request is a task carrying its route and tenant (what --debug-addr's
// trace is read by).
func TestAccessLogTenantAndTraceTask(t *testing.T) {
	var logs, tr bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	h := accessLog(log)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reportTenant(r.Context(), tenant.ID("tenant-traced"))
		w.WriteHeader(http.StatusCreated)
	}))
	if err := rtrace.Start(&tr); err != nil {
		t.Skipf("a trace runs already (go test -trace?): %v", err)
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/sandboxes", nil))
	rtrace.Stop()
	// Untraced, the same request is logged the same way.
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/sandboxes", nil))

	for _, want := range []string{"http request", "POST /sandboxes", "tenant", "tenant-traced"} {
		if !bytes.Contains(tr.Bytes(), []byte(want)) {
			t.Errorf("execution trace: no %q", want)
		}
	}
	dec := json.NewDecoder(&logs)
	for i := range 2 {
		var line struct {
			Msg, Path, Tenant string
			Status            int
		}
		if err := dec.Decode(&line); err != nil {
			t.Fatalf("access log line %d: %v", i, err)
		}
		if line.Msg != "http request" || line.Path != "/sandboxes" || line.Tenant != "tenant-traced" || line.Status != http.StatusCreated {
			t.Errorf("access log line %d: %+v", i, line)
		}
	}
}
