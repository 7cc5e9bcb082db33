package process

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

// TestEndKillsSession: however a command ends, what it left running in its
// session goes with it, even in a process group of its own (timeout makes
// one) that a group kill misses. Each script prints the leftover's pid.
func TestEndKillsSession(t *testing.T) {
	e := newTestEnv(t)
	const leftover = "timeout 60 sleep 60 </dev/null >/dev/null 2>&1 & echo $!"
	tests := []struct {
		name string
		h    hdr
		// end ends the command once it has printed the leftover's pid.
		end func(t *testing.T, pid uint32)
	}{
		{"leader exits", nil, func(*testing.T, uint32) {}},
		{"killed", nil, func(t *testing.T, pid uint32) { e.kill(t, byPid(pid)) }},
		{"timeout", hdr{"Connect-Timeout-Ms": "500"}, func(*testing.T, uint32) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			script := leftover
			if tt.name != "leader exits" {
				script += "; sleep 60"
			}
			ev := e.start(t, t.Context(), &rpc.StartRequest{Process: sh(script), Stdin: ptr(false)}, tt.h)
			pid := ev.started()
			left, err := strconv.Atoi(strings.TrimSpace(ev.until("\n")))
			if err != nil {
				t.Fatalf("leftover pid: %v", err)
			}
			tt.end(t, pid)
			for ev.receive() && ev.msg().GetEnd() == nil {
			}
			// The end event comes after the sweep, but a timeout ends the
			// client's stream too, maybe first.
			eventually(t, "the leftover's end", func() bool { return !alive(left) })
		})
	}
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
