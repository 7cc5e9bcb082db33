package process

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
)

// TestEndKillsSession: a command told to end (killed, timed out) ends with
// what it left running in its session, even in a process group of its own
// (timeout makes one) that a group kill misses. One whose leader exits on
// its own keeps it (`server &`, as on E2B), until a sweep of the leftovers
// (what a start does when the sandbox is out of pids). Each script prints
// the leftover's pid.
func TestEndKillsSession(t *testing.T) {
	e := newTestEnv(t)
	const leftover = "timeout 60 sleep 60 </dev/null >/dev/null 2>&1 & echo $!"
	tests := []struct {
		name string
		h    hdr
		// end ends the command once it has printed the leftover's pid.
		end  func(t *testing.T, pid uint32)
		kept bool
	}{
		{"leader exits", nil, func(*testing.T, uint32) {}, true},
		{"killed", nil, func(t *testing.T, pid uint32) { e.kill(t, byPid(pid)) }, false},
		{"timeout", hdr{"Connect-Timeout-Ms": "500"}, func(*testing.T, uint32) {}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			script := leftover
			if !tt.kept {
				script += "; sleep 60"
			}
			ev := e.start(t, t.Context(), &rpc.StartRequest{Process: sh(script), Stdin: ptr(false)}, tt.h)
			pid := ev.started()
			left, err := strconv.Atoi(strings.TrimSpace(ev.until("\n")))
			if err != nil {
				t.Fatalf("leftover pid: %v", err)
			}
			t.Cleanup(func() { _ = syscall.Kill(left, syscall.SIGKILL) })
			tt.end(t, pid)
			for ev.receive() && ev.msg().GetEnd() == nil {
			}
			if !tt.kept {
				// The end event comes after the sweep, but a timeout ends
				// the client's stream too, maybe first.
				eventually(t, "the leftover's end", func() bool { return !alive(left) })
				return
			}
			agenttest.InProcessOnly(t, "the rest looks into and sweeps the package's leftover sessions")
			eventually(t, "the leader's session remembered", func() bool { return remembered(int(pid)) })
			if !alive(left) {
				t.Fatal("the leftover ended with its leader; want it kept")
			}
			if n := leftovers.sweep(); n < 1 {
				t.Errorf("sweep ended %d sessions; want at least the leader's", n)
			}
			if alive(left) {
				t.Error("the leftover is alive after a sweep of the leftovers")
			}
		})
	}
}

// remembered says whether sid is among the leftovers.
func remembered(sid int) bool {
	leftovers.mu.Lock()
	defer leftovers.mu.Unlock()
	return slices.ContainsFunc(leftovers.entries, func(e leftover) bool { return e.sid == sid })
}

// alive says whether pid is a process that has not exited (zombies have).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
	return len(f) > 0 && string(f[0]) != "Z"
}
