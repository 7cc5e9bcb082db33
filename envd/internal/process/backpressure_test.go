package process

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

// pipeSlack is at least what the child's stdout pipe holds: 64 KiB by
// default, at most fs.pipe-max-size (1 MiB by default) if it grew the pipe.
const pipeSlack = 1 << 20

// stalledBound is the most a process can write while the client that
// started it reads nothing: a full subscriber buffer, the chunk the pump
// holds while it waits, and the pipe.
const stalledBound = (subscriberBuffer+1)*chunkSize + pipeSlack

// waitPumpBlocked waits until an output pump waits in publish for a reader
// that is a full buffer behind.
func waitPumpBlocked(t *testing.T) {
	t.Helper()
	eventually(t, "the output pump to wait for the reader", func() bool {
		for _, g := range packageGoroutines() {
			if strings.Contains(g, "[select") && strings.Contains(g, ").publish(") {
				return true
			}
		}
		return false
	})
}

// written is how many bytes pid has written so far (all its fds).
func written(t *testing.T, pid uint32) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/io")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "wchar: "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no wchar in /proc/%d/io", pid)
	return 0
}

// waitDone waits for p's end; the bound is only there so that a deadlock
// fails the test instead of hanging it.
func waitDone(t *testing.T, p *process) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("process %d did not end", p.pid)
	}
}

// The client that started a process sets its pace: while that client reads
// nothing, the process makes only as much progress as the buffers hold, and
// once it reads again it gets every byte, in order.
func TestStartingClientAppliesBackpressure(t *testing.T) {
	e := newTestEnv(t)
	svc := e.service(t, "drives Service.start and stream directly and watches the output pump's goroutine")
	const n = "12000000"
	want, err := exec.Command("seq", "1", n).Output()
	if err != nil {
		t.Fatal(err)
	}
	if len(want) < 2*stalledBound {
		t.Fatalf("output of %d bytes is too small to tell a stalled process from one that ran on", len(want))
	}
	p, sub, err := svc.start(&rpc.StartRequest{Process: cmd("seq", "1", n), Stdin: ptr(false)}, http.Header{})
	if err != nil {
		t.Fatal(err)
	}

	waitPumpBlocked(t)
	// Give a process that does not wait for its reader every chance to run on.
	for range 5 {
		if w := written(t, p.pid); w > stalledBound {
			t.Fatalf("process wrote %d bytes while its reader was stalled; want at most %d", w, stalledBound)
		}
		if p.finished() {
			t.Fatalf("process ended (%v) while its reader was stalled", p.end)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var out bytes.Buffer
	var kinds []string
	err = svc.stream(t.Context(), http.Header{}, p, sub, func(ev *rpc.ProcessEvent) error {
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			if d.GetStderr() != nil {
				t.Errorf("unexpected stderr %q", d.GetStderr())
			}
			return nil
		}
		kinds = append(kinds, ev.String())
		return nil
	})
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("got %d bytes of output, want %d, in order (equal: false)", out.Len(), len(want))
	}
	if len(kinds) != 2 || !strings.Contains(kinds[0], "start") || !strings.Contains(kinds[1], "end") {
		t.Errorf("non-data events = %v; want start, end", kinds)
	}
	if p.end.GetExitCode() != 0 {
		t.Errorf("end = %v", p.end)
	}
}

// A starting client that goes away while it is behind no longer holds the
// process up: it runs to its end unthrottled, as a background process.
func TestStartingClientDisconnectReleasesProcess(t *testing.T) {
	for _, proto := range []string{"h2c", "http1"} {
		t.Run(proto, func(t *testing.T) {
			e := newTestEnvOver(t, proto)
			svc := e.service(t, "watches the output pump's goroutine and looks the process up in the Service")
			ctx, cancel := contextWithCancel(t)
			// Far more than the subscriber buffer and the transport's
			// buffers can take while the client reads nothing.
			ev := e.start(t, ctx, &rpc.StartRequest{Process: cmd("head", "-c", "268435456", "/dev/zero"), Stdin: ptr(false)}, nil)
			pid := ev.started()
			waitPumpBlocked(t)
			p, err := svc.lookup(byPid(pid))
			if err != nil {
				t.Fatal(err)
			}
			if p.finished() {
				t.Fatalf("process ended (%v) while its client read nothing", p.end)
			}

			cancel()
			waitDone(t, p)
			if p.end.GetExitCode() != 0 {
				t.Fatalf("end = %v; want a normal exit", p.end)
			}
		})
	}
}

// Close does not wait for a starting client that reads nothing.
func TestCloseWithStalledStartingClient(t *testing.T) {
	e := newTestEnv(t)
	svc := e.service(t, "drives Service.start and stream directly and watches the output pump's goroutine")
	p, sub, err := svc.start(&rpc.StartRequest{Process: cmd("yes"), Stdin: ptr(false)}, http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	waitPumpBlocked(t)

	closed := make(chan struct{})
	go func() {
		svc.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close hangs on a stalled reader")
	}
	if p.end.GetStatus() != "signal: killed" {
		t.Errorf("end = %v; want killed", p.end)
	}
	// The reader was a full buffer behind when it was let go.
	err = svc.stream(t.Context(), http.Header{}, p, sub, func(*rpc.ProcessEvent) error { return nil })
	codeIs(t, "stalled reader after Close", err, connect.CodeResourceExhausted)
	eventually(t, "service goroutines to exit", func() bool { return len(packageGoroutines()) == 0 })
}

// A starting client that reads nothing cannot keep a process that was told
// to stop (its lifetime ran out, or it was killed) from ending.
func TestStalledStartingClientCannotHoldAStoppedProcess(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    http.Header
		stop func(e *testEnv, p *process)
	}{
		// Long enough for yes to fill the buffer first on a loaded box
		// (300 ms was not, under the race detector at load 10).
		{"timeout", http.Header{timeoutHeader: {"3000"}}, func(*testEnv, *process) {}},
		{"kill", http.Header{}, func(e *testEnv, p *process) { e.kill(t, byPid(p.pid)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			svc := e.service(t, "drives Service.start and stream directly and watches the output pump's goroutine")
			p, sub, err := svc.start(&rpc.StartRequest{Process: cmd("yes"), Stdin: ptr(false)}, tc.h)
			if err != nil {
				t.Fatal(err)
			}
			waitPumpBlocked(t)
			tc.stop(e, p)
			waitDone(t, p)
			if p.end.GetStatus() != "signal: killed" {
				t.Errorf("end = %v; want killed", p.end)
			}
			err = svc.stream(t.Context(), http.Header{}, p, sub, func(*rpc.ProcessEvent) error { return nil })
			codeIs(t, "stalled reader of a stopped process", err, connect.CodeResourceExhausted)
		})
	}
}

// A starting client that is behind but keeps reading when the process is
// killed still gets the end event.
func TestSlowStartingClientGetsEndAfterKill(t *testing.T) {
	e := newTestEnv(t)
	svc := e.service(t, "drives Service.start and stream directly and watches the output pump's goroutine")
	p, sub, err := svc.start(&rpc.StartRequest{Process: cmd("yes"), Stdin: ptr(false)}, http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	waitPumpBlocked(t)
	e.kill(t, byPid(p.pid))
	var end *rpc.ProcessEvent_EndEvent
	err = svc.stream(t.Context(), http.Header{}, p, sub, func(ev *rpc.ProcessEvent) error {
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
		return nil
	})
	if err != nil || end.GetStatus() != "signal: killed" {
		t.Fatalf("stream: %v, end %v; want the killed end event", err, end)
	}
}
