package process

import (
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

func TestCloseKillsEverythingAndLeaksNothing(t *testing.T) {
	e := newTestEnv(t)
	attached := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("sleep", "100"), Stdin: ptr(false)}, nil)
	attached.started()
	ctx, cancel := contextWithCancel(t)
	detached := e.start(t, ctx, &rpc.StartRequest{Process: cmd("cat")}, nil)
	detachedPid := detached.started()
	cancel()
	term := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("sleep", "100"), Pty: ptySize(80, 24)}, nil)
	term.started()

	e.service(t, "calls Service.Close, which a binary has no way to do but exit, and counts the test process's goroutines").Close()
	for _, ev := range []*events{attached, term} {
		if end := ev.rest().end; end.GetStatus() != "signal: killed" {
			t.Errorf("end after Close = %v; want killed", end)
		}
	}
	if err := syscall.Kill(int(detachedPid), 0); err == nil {
		t.Errorf("detached process %d still exists after Close", detachedPid)
	}
	if got := e.startCode(t, &rpc.StartRequest{Process: cmd("true")}, nil); got != connect.CodeCanceled {
		t.Errorf("Start after Close: code %v; want canceled", got)
	}
	e.svc.Close() // idempotent

	eventually(t, "service goroutines to exit", func() bool { return len(packageGoroutines()) == 0 })
}

// A process that leaves a child behind which escaped its process group and
// keeps the output open still ends once its lifetime is up.
func TestEscapedChildCannotHoldTheStream(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{
		Process: sh("setsid sleep 100 & echo $!"),
		Stdin:   ptr(false),
	}, hdr{"Connect-Timeout-Ms": "200"})
	pid := ev.started()
	escaped, err := strconv.Atoi(strings.TrimSpace(ev.until("\n")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(escaped, syscall.SIGKILL) })
	for ev.receive() {
	}
	c := e.connect(t, t.Context(), byPid(pid), nil)
	c.started()
	if end := c.rest().end; end.GetExitCode() != 0 {
		t.Fatalf("end = %v; want the shell's own exit 0", end)
	}
}

// An observer attached with Connect that stops reading is cut off; it never
// holds up the process (the starting client, which reads, sets the pace).
func TestSlowReaderIsDisconnectedWithoutBlockingTheProcess(t *testing.T) {
	e := newTestEnv(t)
	// Far more events than a subscriber may buffer (chunks are at most 32 KiB).
	const total = 64 << 20
	svc := e.service(t, "drives Service.start and stream directly, to hold the observer's subscription unread")
	p, sub, err := svc.start(&rpc.StartRequest{Process: sh("head -c 67108864 /dev/zero"), Stdin: ptr(false)}, http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	// The starting client has not read yet, so the process cannot have ended:
	// the observer attaches while there is plenty of output to come.
	obs, ok := p.events.subscribe()
	if !ok {
		t.Fatal("process ended before an unread starting client let it")
	}
	startRes := make(chan error, 1)
	var got int
	go func() {
		startRes <- svc.stream(t.Context(), http.Header{}, p, sub, func(ev *rpc.ProcessEvent) error {
			got += len(ev.GetData().GetStdout())
			return nil
		})
	}()
	// The observer does not read at all until the process has finished: the
	// process must not wait for it.
	<-p.done
	if p.end.GetExitCode() != 0 {
		t.Fatalf("end = %v", p.end)
	}
	if err := <-startRes; err != nil || got != total {
		t.Fatalf("starting client: %v after %d bytes; want all %d", err, got, total)
	}
	var kinds []string
	err = svc.stream(t.Context(), http.Header{}, p, obs, func(ev *rpc.ProcessEvent) error {
		if ev.GetData() == nil {
			kinds = append(kinds, ev.String())
		}
		return nil
	})
	codeIs(t, "slow reader", err, connect.CodeResourceExhausted)
	if len(kinds) != 1 || !strings.Contains(kinds[0], "start") {
		t.Errorf("non-data events = %v; want only start (then the error)", kinds)
	}
}
