// Command sandboxd-init starts the local backend's sandboxes for sandboxd
// and is their init: libcontainer re-executes it as "init" for every start
// (see package runtime/local/starter for why it is not sandboxd itself).
// sandboxd runs it as "sandboxd-init serve" with a socket on fd 3; it needs
// no flags. Keep its imports small: every package init here runs at every
// sandbox start.
package main

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	// Device cgroup rules fail without the devices controller's
	// implementation, which is registered by import.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/runc/libcontainer"
	// nsenter's C constructor runs the namespace setup of "init" before
	// the Go runtime starts.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"

	"github.com/sandboxd/sandboxd/runtime/local/starter"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init() // exits
	}
	if len(os.Args) != 2 || os.Args[1] != starter.Arg {
		fmt.Fprintln(os.Stderr, "usage: sandboxd-init serve (run by sandboxd, with its socket on fd 3)")
		os.Exit(2)
	}
	// Each init re-exec would otherwise size its Go runtime from the cgroup
	// files, reading /proc/self/mountinfo (see runtime/local).
	if os.Getenv("GOMAXPROCS") == "" {
		_ = os.Setenv("GOMAXPROCS", strconv.Itoa(runtime.GOMAXPROCS(0)))
	}
	f := os.NewFile(3, "sandboxd")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd-init: fd 3:", err)
		os.Exit(1)
	}
	conn, ok := c.(*net.UnixConn)
	if !ok {
		fmt.Fprintln(os.Stderr, "sandboxd-init: fd 3 is not a unix socket")
		os.Exit(1)
	}
	if err := starter.Serve(conn); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd-init:", err)
		os.Exit(1)
	}
}
