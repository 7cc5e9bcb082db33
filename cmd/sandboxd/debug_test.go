package main

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

func TestDebugListenLoopbackOnly(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:0", true},
		{"[::1]:0", true},
		{"localhost:0", true},
		{"0.0.0.0:0", false},
		{":0", false},
		{"[::]:0", false},
		{"192.0.2.1:6060", false},
		{"example.invalid:6060", false},
		{"127.0.0.1", false}, // no port
	} {
		t.Run(tc.addr, func(t *testing.T) {
			ln, err := debugListen(tc.addr)
			if ln != nil {
				ln.Close()
			}
			if (err == nil) != tc.ok {
				t.Fatalf("debugListen(%q) = %v, want ok %v", tc.addr, err, tc.ok)
			}
		})
	}
}

func TestServeDebugProfiles(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	addr, stop, err := serveDebug("", log)
	if err != nil || addr != "" {
		t.Fatalf(`serveDebug(""): %q, %v; want nothing served`, addr, err)
	}
	stop() // "" serves nothing and stops at once

	addr, stop, err = serveDebug("127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	for path, want := range map[string]string{
		"/debug/pprof/":                   "goroutine",
		"/debug/pprof/mutex?debug=1":      "--- mutex:",
		"/debug/pprof/block?debug=1":      "--- contention:",
		"/debug/pprof/goroutine?debug=1":  "goroutine profile:",
		"/debug/pprof/cmdline":            "",
		"/debug/pprof/trace?seconds=0.05": "go 1.",
		"/debug/pprof/profile?seconds=1":  "",
	} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) == 0 || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %.80q, want 200 with %q", path, resp.StatusCode, body, want)
		}
	}
}
