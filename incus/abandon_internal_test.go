package incus

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMakeStoppedAbandoned: a copy given up (the backend closing while it
// runs) has its Incus operation cancelled and its half-made instance
// deleted, within a bounded time, instead of leaving both behind.
func TestMakeStoppedAbandoned(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	cancelled := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/1.0/instances":
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, `{"type":"async","status_code":100,"operation":"/1.0/operations/op-copy","metadata":{}}`)
		case r.URL.Path == "/1.0/operations/op-copy/wait":
			select { // the copy runs until cancelled
			case <-cancelled:
				_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{"id":"op-copy","status_code":401,"err":"cancelled"}}`)
			case <-r.Context().Done():
			}
		case r.Method == http.MethodDelete && r.URL.Path == "/1.0/operations/op-copy":
			close(cancelled)
			_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{}}`)
		case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/1.0/instances/"):
			w.WriteHeader(http.StatusNotFound) // gone with the cancelled copy
			_, _ = io.WriteString(w, `{"type":"error","error":"Instance not found","error_code":404}`)
		default:
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"type":"error","error":"unexpected","error_code":500}`)
		}
	}))
	t.Cleanup(srv.Close)
	b := &Backend{c: NewClientWith(srv.Client(), srv.URL), log: slog.New(slog.DiscardHandler), owner: "test"}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel) // the backend closes
	done := make(chan error, 1)
	go func() {
		done <- b.makeStopped(ctx, InstanceSource{Type: "copy", Source: "sbl-x"}, "x86_64", "m2", map[string]string{}, "sbr-x", false, "test", func() bool { return false })
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("makeStopped given up returned nil")
		}
	case <-time.After(3 * abandonWait):
		t.Fatal("makeStopped given up did not return within its bounds")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(calls, "DELETE /1.0/operations/op-copy") {
		t.Errorf("the copy's operation was not cancelled: %v", calls)
	}
	if !slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "DELETE /1.0/instances/"+layerTempPrefix) }) {
		t.Errorf("the half-made instance was not deleted: %v", calls)
	}
}
