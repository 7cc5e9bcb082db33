package egress

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/netnsrun"
)

// SandboxRcvBuf is the receive buffer a TCP socket in a sandbox starts
// with: the default of net.ipv4.tcp_rmem in its network namespace (the
// kernel's is 128 KiB).
//
// Why: the kernel grows a socket's receive buffer (autotuning) only while
// its reader keeps up with what is queued. A download straight from a
// server starts slowly (the server's slow start over the whole path), so
// the buffer grows to megabytes before the reader falls behind. Through
// the name filter's proxy, the sender is on this host with the data
// buffered already: it fills the 128 KiB from the first round trip, the
// buffer never grows, and the sandbox acknowledges every few records it
// reads. That was three to five times the segments the sandbox sent per
// MB, and 1 ms more of its CPU per MB (a fifth), for an HTTPS download
// through the proxy (BENCHMARKS.md). 4 MiB is about what autotuning
// reaches for the same download direct. It is a ceiling, not an
// allocation: memory is taken only by data a sandbox leaves unread.
const SandboxRcvBuf = 4 << 20

// setRcvBuf sets the default of net.ipv4.tcp_rmem in the network
// namespace of process pid to SandboxRcvBuf (at most the namespace's
// maximum; never lower than it was), leaving the minimum and maximum as
// they are. A net sysctl is the namespace of the thread that opens it.
func setRcvBuf(pid int) error {
	return netnsrun.Run(pid, func() error { return writeRcvBuf("/proc/sys/net/ipv4/tcp_rmem", SandboxRcvBuf) })
}

// writeRcvBuf raises the default (second) value of the tcp_rmem file at
// path to def, capped by its maximum (third).
func writeRcvBuf(path string, def int) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	f := strings.Fields(string(raw))
	if len(f) != 3 {
		return fmt.Errorf("%s: %q is not three numbers", path, raw)
	}
	var v [3]int
	for i, s := range f {
		if v[i], err = strconv.Atoi(s); err != nil {
			return fmt.Errorf("%s: %q is not three numbers", path, raw)
		}
	}
	def = min(def, v[2])
	if def <= v[1] {
		return nil
	}
	return os.WriteFile(path, fmt.Appendf(nil, "%d %d %d", v[0], def, v[2]), 0o644)
}

// tuneSandbox applies SandboxRcvBuf in the network namespace of process
// pid. It only costs speed, so a kernel or runtime that does not let
// sandboxd write the sandbox's sysctls (no such file, not permitted)
// leaves the kernel's default.
func tuneSandbox(pid int) error {
	err := setRcvBuf(pid)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tcp_rmem in the sandbox: %w", err)
	}
	return nil
}
