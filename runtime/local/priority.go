package local

import (
	goruntime "runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// backgroundNice is the nice value of the thread that does a background
// create's work in this process (runtime.Spec.Background: a flood's creates
// after its first, pool refills). The sandbox's own start already gets the
// least CPU share (backgroundCPUShares); this is the rest of it: the
// cgroups, the mounts, the veth, the spawner's exec. Without it that work
// competed as an equal with another tenant's create, whose path runs mostly
// in this process (issue 24's fairness bench: the other tenant's
// sandboxd-spawn took 8-9 ms instead of 4 while a flood ran, every step of
// it about twice as slow).
const backgroundNice = 19

// lowerThreadPriority wires the calling goroutine to its thread and gives
// the thread backgroundNice, until the returned func (idempotent) gives it
// back its nice value and unwires it. A process started from the thread
// meanwhile inherits the nice value: sandboxd-spawn gives its init 0 again
// before the clone, and run calls the func before any other start. If the
// old value cannot be restored, the thread stays wired to the goroutine and
// ends with it, so that no other goroutine runs on it niced.
func lowerThreadPriority() (restore func()) {
	goruntime.LockOSThread()
	old, err := threadNice()
	if err != nil || unix.Setpriority(unix.PRIO_PROCESS, 0, backgroundNice) != nil {
		goruntime.UnlockOSThread()
		return func() {}
	}
	return sync.OnceFunc(func() {
		if unix.Setpriority(unix.PRIO_PROCESS, 0, old) == nil {
			goruntime.UnlockOSThread()
		}
	})
}

// threadNice is the calling thread's nice value (who 0 of PRIO_PROCESS is
// the thread on Linux; getpriority(2) answers 20 - nice).
func threadNice() (int, error) {
	p, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	return 20 - p, err
}
