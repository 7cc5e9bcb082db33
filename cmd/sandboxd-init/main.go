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
	"strconv"

	"github.com/opencontainers/runc/libcontainer/exeseal"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime/local/starter"
)

func main() {
	starter.InitIfAsked()
	if len(os.Args) != 2 || os.Args[1] != starter.Arg {
		fmt.Fprintln(os.Stderr, "usage: sandboxd-init serve (run by sandboxd, with its socket on fd 3)")
		os.Exit(2)
	}
	// Serve from a sealed in-memory copy of this binary: libcontainer then
	// re-executes that copy for every start (no container can write to it,
	// CVE-2019-5736) instead of sealing the binary afresh each time with an
	// overlay mount that it tears down again.
	if !exeseal.IsSelfExeCloned() && os.Getenv(sealedEnv) == "" {
		err := reexecSealed()
		fmt.Fprintln(os.Stderr, "sandboxd-init: serving from the binary itself (libcontainer seals it at every start):", err)
	}
	starter.OneProcForInits()
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

// sealedEnv marks the re-executed copy, so that a copy libcontainer does not
// count as sealed (a file where memfd_create fails) is not copied again.
const sealedEnv = "SANDBOXD_INIT_SEALED"

// reexecSealed copies this binary into a sealed memfd and executes the copy
// with the same arguments and fd 3; it returns only on failure.
func reexecSealed() error {
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer self.Close()
	st, err := self.Stat()
	if err != nil {
		return err
	}
	clone, err := exeseal.CloneBinary(self, st.Size(), "sandboxd-init", os.TempDir())
	if err != nil {
		return err
	}
	defer clone.Close()
	return unix.Exec("/proc/self/fd/"+strconv.Itoa(int(clone.Fd())), os.Args, append(os.Environ(), sealedEnv+"=1"))
}
