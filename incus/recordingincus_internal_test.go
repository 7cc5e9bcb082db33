package incus

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
)

// recordingIncus is an Incus API of a test's own answers (serve) that records
// the calls made to it, as "METHOD /path".
type recordingIncus struct {
	mu    sync.Mutex
	calls []string
}

// newRecordingIncus serves serve's answers, JSON, and returns a client of them.
func newRecordingIncus(t *testing.T, serve http.HandlerFunc) (*recordingIncus, *Client) {
	f := &recordingIncus{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.calls = append(f.calls, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		serve(w, r)
	}))
	t.Cleanup(srv.Close)
	return f, NewClientWith(srv.Client(), srv.URL)
}

// called reports whether call ("METHOD /path") was made, and all calls.
func (f *recordingIncus) called(call string) (bool, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.calls, call), slices.Clone(f.calls)
}
