package process

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/envd/internal/cgroup"
)

// maxLeftovers bounds the sessions remembered: the oldest are forgotten
// first (their processes are left alone, not killed).
const maxLeftovers = 1024

// leftovers are the sessions of commands whose leader exited on its own
// while processes of theirs lived on. Sessions are the kernel's, one
// numbering for the whole sandbox, hence one list for envd.
var leftovers sessions

type sessions struct {
	mu      sync.Mutex
	entries []leftover
}

// leftover is what a command left running: its session, and its cgroup
// when it has one.
type leftover struct {
	sid int
	cg  *cgroup.Cgroup
}

// end kills everything the command left: its cgroup whole, then whatever
// of its session is outside it (a root command may leave its cgroup).
func (l leftover) end() {
	if l.cg != nil {
		l.cg.Kill()
	}
	endSession(l.sid)
}

// gone is a leftover with nothing left: its cgroup can go.
func (l leftover) gone() {
	if l.cg != nil {
		l.cg.Retire()
	}
}

// runawayMembers is how many processes a command may leave running when its
// leader exits on its own. More is a runaway (a fork bomb's survivors hold
// nearly all of the sandbox's pids), ended at once; servers and their
// workers stay far below it.
const runawayMembers = 256

// Watching a command's leftovers after its leader exited: a bomb churns
// through hundreds of pids a second, a server started with `&` through
// a few.
const (
	watchSamples  = 10
	watchInterval = 100 * time.Millisecond
)

// add watches what a command left running for a second and then
// remembers it; a runaway (more than runawayMembers processes seen in that
// time, or at once) is ended instead.
func (l *sessions) add(e leftover) {
	seen := map[int]struct{}{}
	for i := range watchSamples {
		live, zombies := sessionMembers(e.sid)
		if len(live) == 0 && (e.cg == nil || !e.cg.Populated()) {
			e.gone()
			return
		}
		for _, pid := range live {
			seen[pid] = struct{}{}
		}
		if len(seen) > runawayMembers || len(live)+zombies > runawayMembers {
			e.end()
			return
		}
		if i < watchSamples-1 {
			time.Sleep(watchInterval)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) == maxLeftovers {
		l.entries[0].gone()
		l.entries = l.entries[1:]
	}
	l.entries = append(l.entries, e)
}

// check ends the remembered commands' leftovers that have become runaways
// since their leader exited (a bomb keeps forking) and forgets those that
// are gone. A start calls it, so a sandbox a bomb's survivors fill up is
// usable again at the next command.
func (l *sessions) check() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) == 0 {
		return // the common case: a start pays nothing
	}
	// One pass over /proc for every remembered session.
	sizes := sessionSizes()
	l.entries = slices.DeleteFunc(l.entries, func(e leftover) bool {
		switch n := sizes[e.sid]; {
		case n.live == 0 && (e.cg == nil || !e.cg.Populated()):
			e.gone()
			return true
		case n.live+n.zombies > runawayMembers: // zombies hold pids too
			e.end()
			return true
		}
		return false
	})
}

// forget drops sid: its number now belongs to a new command's session (the
// kernel reuses a session's number once its last member is gone), which a
// sweep must not end.
func (l *sessions) forget(sid int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = slices.DeleteFunc(l.entries, func(e leftover) bool {
		if e.sid != sid {
			return false
		}
		e.gone()
		return true
	})
}

// sweep ends every remembered command's leftovers and forgets them all; it
// returns how many still had processes.
func (l *sessions) sweep() (ended int) {
	l.mu.Lock()
	entries := l.entries
	l.entries = nil
	l.mu.Unlock()
	for _, e := range entries {
		if live, _ := sessionMembers(e.sid); len(live) > 0 || (e.cg != nil && e.cg.Populated()) {
			e.end()
			ended++
		} else {
			e.gone()
		}
	}
	return ended
}

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
		pids, _ := sessionMembers(sid)
		if len(pids) == 0 {
			return
		}
		// Stopped first, all of them, then killed: a stopped process cannot
		// fork, so a bomb stops refilling the pids this pass frees while
		// the kills go out.
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGSTOP)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(time.Millisecond) // let the killed exit before the next scan
	}
}

// sessionMembers lists the live processes of session sid from /proc, and
// counts its zombies.
func sessionMembers(sid int) (live []int, zombies int) {
	scanProc(func(pid, session int, zombie bool) {
		switch {
		case session != sid:
		case zombie:
			zombies++
		default:
			live = append(live, pid)
		}
	})
	return live, zombies
}

// size is a session's live and zombie processes.
type size struct{ live, zombies int }

// sessionSizes counts the processes of every session, in one pass.
func sessionSizes() map[int]size {
	m := map[int]size{}
	scanProc(func(_, session int, zombie bool) {
		n := m[session]
		if zombie {
			n.zombies++
		} else {
			n.live++
		}
		m[session] = n
	})
	return m
}

// scanProc calls fn for every process in /proc with its session and
// whether it is a zombie. Processes that vanish while it reads are skipped.
func scanProc(fn func(pid, session int, zombie bool)) {
	d, err := os.Open("/proc")
	if err != nil {
		return
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return
	}
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
		if len(f) <= 3 {
			continue
		}
		session, err := strconv.Atoi(string(f[3]))
		if err != nil {
			continue
		}
		fn(pid, session, bytes.Equal(f[0], []byte("Z")))
	}
}
