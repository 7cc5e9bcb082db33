package server

import (
	"net/http"
	"sync/atomic"

	"github.com/sandboxd/sandboxd/server/httpx"
)

// Front is the listener's handler for the whole life of the process: it
// answers 503 while sandboxd is not yet serving (a standby waiting for the
// lease, or one still starting), then hands every request to the server
// set by Serve. A load balancer in front of an active and a standby
// sandboxd routes by /health, which says which this one is.
type Front struct {
	metrics *Metrics
	state   atomic.Pointer[string]
	next    atomic.Pointer[http.Handler]
}

// NewFront returns a Front answering "starting" until told otherwise.
func NewFront(m *Metrics) *Front {
	f := &Front{metrics: m}
	f.Wait("starting")
	return f
}

// Wait makes every request but /metrics answer 503 with why, the message
// of the E2B error body and of /health.
func (f *Front) Wait(why string) { f.state.Store(&why) }

// Serve hands every request to h from now on.
func (f *Front) Serve(h http.Handler) { f.next.Store(&h) }

func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := f.next.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/metrics" && r.Method == http.MethodGet {
		f.metrics.Handler().ServeHTTP(w, r)
		return
	}
	// The SDKs and load balancers retry a 503; Retry-After paces them.
	w.Header().Set("Retry-After", "1")
	httpx.WriteErrorStatus(w, http.StatusServiceUnavailable, *f.state.Load())
}
