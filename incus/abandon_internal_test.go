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
// runs) has its Incus operation cancelled, or waited for where Incus
// refuses to cancel it (a copy between members), and its half-made
// instance deleted, within a bounded time, instead of leaving both behind.
func TestMakeStoppedAbandoned(t *testing.T) {
	for _, tc := range []struct {
		name string
		// cancellable: DELETE of the operation ends it (and the copy's
		// instance with it); otherwise Incus answers 400 and the copy
		// runs on for copyLeft, its instance busy until then.
		cancellable bool
		copyLeft    time.Duration
	}{
		{name: "cancelled", cancellable: true},
		{name: "cannot be cancelled", copyLeft: 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var calls []string
			ended := make(chan struct{})
			var endOnce sync.Once
			end := func() { endOnce.Do(func() { close(ended) }) }
			isEnded := func() bool {
				select {
				case <-ended:
					return true
				default:
					return false
				}
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				call := r.Method + " " + r.URL.Path
				w.Header().Set("Content-Type", "application/json")
				switch {
				case r.Method == http.MethodPost && r.URL.Path == "/1.0/instances":
					w.WriteHeader(http.StatusAccepted)
					_, _ = io.WriteString(w, `{"type":"async","status_code":100,"operation":"/1.0/operations/op-copy","metadata":{}}`)
				case r.URL.Path == "/1.0/operations/op-copy/wait":
					select { // the copy runs until cancelled or done
					case <-ended:
						if tc.cancellable {
							_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{"id":"op-copy","status_code":401,"err":"cancelled"}}`)
						} else {
							_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{"id":"op-copy","status_code":200}}`)
						}
					case <-r.Context().Done():
					}
				case r.Method == http.MethodDelete && r.URL.Path == "/1.0/operations/op-copy":
					if !tc.cancellable {
						time.AfterFunc(tc.copyLeft, end)
						w.WriteHeader(http.StatusBadRequest)
						_, _ = io.WriteString(w, `{"type":"error","error":"This operation can't be cancelled","error_code":400}`)
						break
					}
					end()
					_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{}}`)
				case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/1.0/instances/"):
					switch {
					case tc.cancellable:
						w.WriteHeader(http.StatusNotFound) // gone with the cancelled copy
						_, _ = io.WriteString(w, `{"type":"error","error":"Instance not found","error_code":404}`)
					case !isEnded():
						call += " (busy)"
						w.WriteHeader(http.StatusInternalServerError)
						_, _ = io.WriteString(w, `{"type":"error","error":"Failed to create instance delete operation: Instance is busy running a \"create\" operation","error_code":500}`)
					default:
						call += " (deleted)"
						_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{}}`)
					}
				default:
					w.WriteHeader(http.StatusInternalServerError)
					_, _ = io.WriteString(w, `{"type":"error","error":"unexpected","error_code":500}`)
				}
				mu.Lock()
				calls = append(calls, call)
				mu.Unlock()
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
			deleted := func(c string) bool {
				return strings.HasPrefix(c, "DELETE /1.0/instances/"+layerTempPrefix) && (tc.cancellable || strings.HasSuffix(c, "(deleted)"))
			}
			if !slices.ContainsFunc(calls, deleted) {
				t.Errorf("the half-made instance was not deleted: %v", calls)
			}
		})
	}
}
