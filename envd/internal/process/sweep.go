package process

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// sweepPasses bounds endSession: each pass kills every member it finds, so
// only children forked between a pass's scan and its kills are left for the
// next; a bomb of a thousand processes is gone in a few passes.
const sweepPasses = 200

// endSession SIGKILLs every process left in the session sid and returns
// once none is left alive (or after sweepPasses).
//
// A command is its own session (Setsid), and its descendants stay in it
// unless they call setsid themselves. Its process group is not enough:
// timeout, shells with job control and daemons take groups of their own,
// and what outlives the leader is reparented to envd (PID 1), so ancestry
// is lost too. The session id is kept: the kernel does not reuse sid's
// number while a member lives, so no later command can be hit.
func endSession(sid int) {
	for range sweepPasses {
		pids := sessionMembers(sid)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(time.Millisecond) // let the killed exit before the next scan
	}
}

// sessionMembers lists the live (not zombie) processes of session sid from
// /proc. Processes that vanish while it reads are skipped.
func sessionMembers(sid int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil
	}
	want := []byte(strconv.Itoa(sid))
	var out []int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		// After the parenthesised command: state, ppid, pgrp, session.
		f := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
		if len(f) > 3 && !bytes.Equal(f[0], []byte("Z")) && bytes.Equal(f[3], want) {
			out = append(out, pid)
		}
	}
	return out
}
