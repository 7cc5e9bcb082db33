package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	goruntime "runtime"
	"time"
)

// Go's profiles on a listener of their own (--debug-addr), for an operator
// who asks where sandboxd's time goes under load: CPU, heap, goroutines,
// the execution trace, and mutex and blocking profiles. They are off by
// default and never on the API's listener: a profile shows internals and a
// trace costs CPU while it runs.

// Sampling of the contention profiles while --debug-addr is set: one in
// debugMutexFraction contended unlocks, and blocking events at a rate of
// one sample per debugBlockRateNs blocked. Both cost little at these
// rates, and are zero (the runtime's default) without the flag.
const (
	debugMutexFraction = 10
	debugBlockRateNs   = 100_000
)

// debugListen checks that addr is on loopback and listens there: a remote
// caller has no business with a process's profiles, and one that must
// reach them can tunnel.
func debugListen(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--debug-addr %q: %w", addr, err)
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("--debug-addr %q: must be a loopback address (127.0.0.1, [::1] or localhost)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--debug-addr: %w", err)
	}
	return ln, nil
}

// debugMux serves net/http/pprof's handlers under /debug/pprof/.
func debugMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// serveDebug serves the profiles on addr until the returned stop is
// called, and returns the address it listens on (addr's port may be 0);
// "" serves nothing. It turns on the contention profiles, and stop turns
// them off again.
func serveDebug(addr string, log *slog.Logger) (bound string, stop func(), err error) {
	if addr == "" {
		return "", func() {}, nil
	}
	ln, err := debugListen(addr)
	if err != nil {
		return "", nil, err
	}
	goruntime.SetMutexProfileFraction(debugMutexFraction)
	goruntime.SetBlockProfileRate(debugBlockRateNs)
	// No write timeout: a CPU profile or a trace answers after its
	// ?seconds.
	hs := &http.Server{Handler: debugMux(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("debug listener", "err", err)
		}
	}()
	bound = ln.Addr().String()
	log.Info("profiles served", "debug_addr", bound, "path", "/debug/pprof/")
	return bound, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			_ = hs.Close() // a profile still running is cut short
		}
		<-done
		goruntime.SetMutexProfileFraction(0)
		goruntime.SetBlockProfileRate(0)
	}, nil
}
