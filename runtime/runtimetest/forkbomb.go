package runtimetest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

// ForkBomb runs a fork bomb for three seconds (under timeout) in sandbox id
// of b, as its user, and fails t unless the sandbox is usable again within
// five seconds of the bomb's end: a command starts and no more than a
// handful of processes are left.
//
// The bomb's processes are reparented to envd (PID 1) as their parents die,
// and timeout runs them in a process group of its own: only envd's sweep of
// the command's session takes them (a runaway left by a leader that exited,
// or a start that found no pid). Without it they hold the sandbox's pids
// (every start fails with EAGAIN) and burn its CPU.
func ForkBomb(t *testing.T, b runtime.Backend, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := Exec(ctx, b, id, "user", "/bin/sh", "-c",
		"timeout 3 sh -c 'f(){ f|f& };f' >/dev/null 2>&1; echo done")
	if err != nil || !strings.Contains(res.Stdout, "done") {
		t.Fatalf("bomb: %+v %v", res, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err = Exec(ctx, b, id, "root", "/bin/sh", "-c", "echo ok; ls -d /proc/[0-9]* 2>/dev/null | wc -l")
		if err == nil && res.ExitCode == 0 && strings.HasPrefix(res.Stdout, "ok\n") {
			// envd, sh, ls, wc, and a zombie or two not yet reaped.
			if n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(res.Stdout, "ok\n"))); n <= 8 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the bomb's end: %+v %v", res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
