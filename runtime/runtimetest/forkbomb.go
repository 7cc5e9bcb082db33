package runtimetest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

// ForkBomb runs a fork bomb for six seconds (the command's timeout) in
// sandbox id of b, as its user, and fails t unless the sandbox is usable
// again within twenty seconds of the bomb's end: a command starts and no
// more than a handful of processes are left.
//
// With reserve (the sandbox has a delegated cgroup2 tree: a v2 host), a
// command must also start while the bomb still runs and holds every pid
// its cgroup allows: envd keeps a reserve of the sandbox's pids that no
// single command can take.
//
// The bomb's processes are reparented to envd (PID 1) as their parents die,
// and timeout runs them in a process group of its own: only envd's kill of
// the command's cgroup, or its sweep of the command's session, takes them.
// Without it they hold the sandbox's pids (every start fails with EAGAIN)
// and burn its CPU.
func ForkBomb(t *testing.T, b runtime.Backend, id string, reserve bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// The command's timeout (the deadline, sent as Connect-Timeout-Ms, as
	// the SDKs' commands.run(cmd, timeout=6) sends it) ends the bomb.
	bombDone := make(chan struct{})
	go func() {
		defer close(bombDone)
		bombCtx, bombCancel := context.WithTimeout(ctx, 6*time.Second)
		defer bombCancel()
		_, _ = Exec(bombCtx, b, id, "user", "/bin/sh", "-c", "f(){ f|f& };f; sleep 60")
	}()
	if reserve {
		time.Sleep(3 * time.Second) // the bomb at its limit
		beside, cancelBeside := context.WithTimeout(ctx, 20*time.Second)
		res, err := Exec(beside, b, id, "root", "/bin/sh", "-c", "echo ok")
		cancelBeside()
		if err != nil || res.ExitCode != 0 || res.Stdout != "ok\n" {
			t.Errorf("a command beside a running fork bomb: %+v %v", res, err)
		}
	}
	<-bombDone
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := Exec(ctx, b, id, "root", "/bin/sh", "-c", "echo ok; ls -d /proc/[0-9]* 2>/dev/null | wc -l")
		if err == nil && res.ExitCode == 0 && strings.HasPrefix(res.Stdout, "ok\n") {
			// envd, sh, ls, wc, and a zombie or two not yet reaped.
			if n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(res.Stdout, "ok\n"))); n <= 8 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the bomb's end: %+v %v", res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
