// Package netnsrun runs a function inside another process's network
// namespace: what the host does for a sandbox whose own processes lack
// CAP_NET_ADMIN (bring lo up, set a net sysctl).
package netnsrun

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Run calls fn on a locked OS thread that has entered the network
// namespace of process pid, and returns fn's error. Net sysctls under
// /proc/sys/net and sockets fn opens are that namespace's. The thread
// goes back to this process's namespace afterwards, or, if it cannot,
// ends with fn's goroutine, so no other goroutine ever runs in the
// sandbox's namespace.
func Run(pid int, fn func() error) error {
	if pid <= 0 {
		return fmt.Errorf("netnsrun: no process %d", pid)
	}
	return RunIn(fmt.Sprintf("/proc/%d/ns/net", pid), fn)
}

// RunNamed is Run in the named network namespace name (`ip netns add`,
// /run/netns/name): the tests' and fakeinet's namespaces.
func RunNamed(name string, fn func() error) error {
	return RunIn("/run/netns/"+name, fn)
}

// RunIn is Run in the network namespace of file path.
func RunIn(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back := false
		defer func() {
			if back {
				runtime.UnlockOSThread()
			} // else the locked thread ends with this goroutine
		}()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			back = true
			errc <- err
			return
		}
		defer unix.Close(self)
		target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			back = true
			errc <- err
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			back = true
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		err = fn()
		back = unix.Setns(self, unix.CLONE_NEWNET) == nil
		errc <- err
	}()
	return <-errc
}
