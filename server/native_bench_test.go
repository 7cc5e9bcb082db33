package server

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/server/nativews"
)

// Exec round trips on the local backend, with p50/p99 reported:
//
//	go test -tags seccomp -run '^$' -bench NativeExec -benchtime 500x ./server/
//
// REST: one POST /exec of `true`. WS: a new websocket per `true` (dial,
// start, exit). WS-echo: one line through an open `cat` session (stdin
// frame to stdout frame).

func benchPercentiles(b *testing.B, d []time.Duration) {
	b.Helper()
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(d[min(len(d)-1, len(d)*99/100)].Microseconds())/1000, "p99-ms")
	b.ReportMetric(0, "ns/op") // the percentiles say more than the mean
}

func BenchmarkNativeExecREST(b *testing.B) {
	e := newNativeEnv(b, true)
	tok := e.full()
	sb := e.create(tok, nil)
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		r := e.do(http.MethodPost, "/v1/sandboxes/"+sb.Id+"/exec", tok, map[string]any{"argv": []string{"true"}})
		d = append(d, time.Since(t0))
		if r.status != 200 {
			b.Fatalf("exec = %s", r)
		}
	}
	benchPercentiles(b, d)
}

func BenchmarkNativeExecWS(b *testing.B) {
	e := newNativeEnv(b, true)
	tok := e.full()
	sb := e.create(tok, nil)
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		c, _, err := e.dialWS(sb.Id, tok)
		if err != nil {
			b.Fatal(err)
		}
		c.start(nativews.Frame{Argv: []string{"true"}})
		if end, _ := c.until("exit"); exitCode(end) != 0 {
			b.Fatalf("exit %+v", end)
		}
		d = append(d, time.Since(t0))
		c.conn.Close()
	}
	benchPercentiles(b, d)
}

func BenchmarkNativeExecWSEcho(b *testing.B) {
	e := newNativeEnv(b, true)
	tok := e.full()
	sb := e.create(tok, nil)
	c, _, err := e.dialWS(sb.Id, tok)
	if err != nil {
		b.Fatal(err)
	}
	c.start(nativews.Frame{Argv: []string{"cat"}})
	line := []byte("ping\n")
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		c.send(nativews.Frame{Type: "stdin", Data: line})
		if f := c.recv(); f.Type != "stdout" || string(f.Data) != "ping\n" {
			b.Fatalf("echo: %+v", f)
		}
		d = append(d, time.Since(t0))
	}
	benchPercentiles(b, d)
}
