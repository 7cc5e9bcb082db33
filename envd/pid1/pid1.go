// Package pid1 lets envd be a sandbox's init. The kernel makes PID 1 the
// parent of every orphan and gives it no default signal handlers, so envd as
// PID 1 splits itself in two, as tini does: this small supervisor reaps every
// zombie and forwards signals, and the real envd runs as its child, whose own
// children are never reaped from under it.
package pid1

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// ChildEnv marks the re-executed child so it does not supervise again.
const ChildEnv = "SANDBOXD_ENVD_CHILD"

// IsChild reports whether this process is the supervised envd.
func IsChild() bool { return os.Getenv(ChildEnv) == "1" }

// Supervise re-executes envd with args[1:] as a child, reaps zombies and
// forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to it until
// it exits, and returns its exit code.
func Supervise(args []string) (int, error) {
	if err := LoopbackUp(); err != nil {
		fmt.Fprintf(os.Stderr, "envd init: loopback: %v\n", err)
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)

	// /proc/self/exe, not args[0]: PATH inside the sandbox may not hold envd.
	cmd := exec.Command("/proc/self/exe", args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), ChildEnv+"=1")
	if err := cmd.Start(); err != nil {
		return 1, fmt.Errorf("start envd: %w", err)
	}
	child := cmd.Process.Pid
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			_ = unix.Kill(child, sig.(syscall.Signal))
			continue
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			if pid == child {
				// The sandbox ends with envd: everything else in the PID
				// namespace is killed by the kernel when PID 1 exits.
				if ws.Signaled() {
					return 128 + int(ws.Signal()), nil
				}
				return ws.ExitStatus(), nil
			}
		}
	}
	return 1, errors.New("signal channel closed")
}

// LoopbackUp sets lo up in the calling thread's network namespace, if it is
// not up already: a container without a network device starts with loopback
// down, and the tunnel and user servers need 127.0.0.1. The incus backend
// calls it from the host, in the container's namespace (its envd has no
// CAP_NET_ADMIN).
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	flags := ifr.Uint16()
	if flags&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(flags | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}
