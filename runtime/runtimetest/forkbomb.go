package runtimetest

import (
	"context"
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
// With reserve (the sandbox has a delegated cgroup2 tree: a v2 host),
// commands must also start while another command holds every pid its
// cgroup allows (reserveHeld): envd keeps a reserve of the sandbox's pids
// that no single command can take.
//
// The bomb's processes are reparented to envd (PID 1) as their parents die,
// and timeout runs them in a process group of its own: only envd's kill of
// the command's cgroup, or its sweep of the command's session, takes them.
// Without it they hold the sandbox's pids (every start fails with EAGAIN)
// and burn its CPU.
func ForkBomb(t *testing.T, b runtime.Backend, id string, reserve bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), Within(4*time.Minute))
	defer cancel()
	if reserve {
		reserveHeld(ctx, t, b, id)
	}
	// The command's timeout (the deadline, sent as Connect-Timeout-Ms, as
	// the SDKs' commands.run(cmd, timeout=6) sends it) ends the bomb.
	bombDone := make(chan struct{})
	go func() {
		defer close(bombDone)
		bombCtx, bombCancel := context.WithTimeout(ctx, 6*time.Second)
		defer bombCancel()
		_, _ = Exec(bombCtx, b, id, "user", "/bin/sh", "-c", "f(){ f|f& };f; sleep 60")
	}()
	<-bombDone
	deadline := time.Now().Add(Within(20 * time.Second))
	for {
		// Every process's stat line, read by the shell's builtins (no fork:
		// the listing counts only what was there).
		res, err := Exec(ctx, b, id, "root", "/bin/sh", "-c",
			`echo ok; for p in /proc/[0-9]*; do read -r l < "$p/stat" 2>/dev/null && echo "$l"; done`)
		procs := strings.Split(strings.TrimSpace(strings.TrimPrefix(res.Stdout, "ok\n")), "\n")
		// init, envd, sh, and a zombie or two not yet reaped.
		if err == nil && res.ExitCode == 0 && strings.HasPrefix(res.Stdout, "ok\n") && len(procs) <= 6 {
			return
		}
		if time.Now().After(deadline) {
			// Which processes are left (pid, name, state, parent, group,
			// session): a bomb's survivors or something else.
			for i, l := range procs {
				if f := strings.Fields(l); len(f) >= 6 && i < 20 {
					procs[i] = strings.Join(f[:6], " ")
				}
			}
			t.Fatalf("%v after the bomb's end, %d processes (exit %d, stderr %q, %v): %q",
				Within(20*time.Second), len(procs), res.ExitCode, res.Stderr, err, procs[:min(len(procs), 20)])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reserveHeld has a command take every pid it can and keep them (subshells
// blocked on a FIFO: they neither exit nor churn, so nothing frees a pid
// by chance; the loop keeps trying to fork), waits until the sandbox's
// pids are nine tenths used, and
// fails t unless three commands still start and run beside it. The holder
// stops when told (a file), killing its subshells with the kill builtin.
func reserveHeld(ctx context.Context, t *testing.T, b runtime.Backend, id string) {
	t.Helper()
	const stop = "/tmp/.sandboxd-hold-stop"
	held := make(chan struct{})
	go func() {
		defer close(held)
		// bash, not sh: where a fork fails dash gives up the script (and
		// frees every pid), bash retries it and goes on; SECONDS bounds
		// the holder without a fork should nothing be able to stop it.
		_, _ = Exec(ctx, b, id, "user", "/bin/bash", "-c", "f=$(mktemp -u) && mkfifo $f || exit 1; pids=; "+
			"trap 'kill $pids 2>/dev/null; rm -f $f' EXIT; "+
			"while [ ! -e "+stop+" ] && [ $SECONDS -lt 150 ]; do ( read _ < $f ) 2>/dev/null & pids=\"$pids $!\"; done")
	}()
	defer func() {
		// Told to stop by a command: that needs the reserve too.
		_, _ = Exec(ctx, b, id, "root", "/bin/sh", "-c", "touch "+stop)
		<-held
		_, _ = Exec(ctx, b, id, "root", "/bin/rm", "-f", stop)
	}()
	// At its limit once the count is nine tenths of the sandbox's and has
	// stopped growing for a second and a half: where forks are slow (an
	// emulated CPU) the holder is still filling up long after nine tenths.
	var last uint64
	steady := 0
	for steady < 3 {
		st, err := b.Stats(ctx, id)
		switch {
		case err != nil || st.PidsLimit == 0 || st.Pids*10 < st.PidsLimit*9:
			steady = 0
		case st.Pids <= last:
			steady++
		default:
			steady = 0
		}
		if err == nil {
			last = st.Pids
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the pids never filled up: %+v %v", st, err)
		case <-held:
			t.Fatalf("the command holding pids ended early")
		case <-time.After(500 * time.Millisecond):
		}
	}
	t.Logf("the holder is at its limit: %d pids in the sandbox", last)
	for i := range 3 {
		beside, cancelBeside := context.WithTimeout(ctx, Within(30*time.Second))
		res, err := Exec(beside, b, id, "root", "/bin/sh", "-c", "echo ok")
		cancelBeside()
		if st, err := b.Stats(ctx, id); err == nil {
			t.Logf("command %d beside the holder: %d of %d pids", i+1, st.Pids, st.PidsLimit)
		}
		if err != nil || res.ExitCode != 0 || res.Stdout != "ok\n" {
			t.Errorf("command %d beside one that holds every pid it may: %+v %v", i+1, res, err)
		}
	}
}
