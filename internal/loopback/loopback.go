// Package loopback brings a network namespace's lo up. A container without a
// network device starts with loopback down, and envd's tunnel and the
// sandbox's own servers need 127.0.0.1: envd does it as the sandbox's init,
// and the incus backend from the host, in the container's namespace (its
// envd has no CAP_NET_ADMIN). It is shared by both sides, and belongs to
// neither.
package loopback

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Up sets lo up in the calling thread's network namespace, if it is not up
// already.
func Up() error {
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
