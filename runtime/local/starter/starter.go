// Package starter starts libcontainer containers from sandboxd-init, a small
// long-lived helper process, instead of from sandboxd itself.
//
// libcontainer starts a container by re-executing the binary that calls it
// (/proc/self/exe) as the container's init, which runs every package init of
// that binary before it does anything else. sandboxd is a 30 MB binary with
// an HTTP API, a database and metrics. So the local backend hands its libcontainer.Create and
// Container.Run calls to sandboxd-init (cmd/sandboxd-init), which imports
// little more than libcontainer; everything after the start (signals, pause,
// stats, destroy) stays in sandboxd, on the container's state directory, as
// for a sandbox adopted after a restart.
//
// The two talk over a SOCK_SEQPACKET socket pair, one JSON message per
// packet. A start answers with the init's pid and a pidfd for it (SCM_RIGHTS),
// opened while the init is still the helper's unreaped child, so it names
// that process and no other; sandboxd learns of the init's exit from the
// pidfd, whoever reaps it. The helper reaps its children and exits when
// sandboxd closes its end; the containers it started live on, as they do when
// sandboxd exits. Through the API this takes 1.3-2.4 ms off a cold create
// (static helper, paired; BENCHMARKS.md).
package starter

import (
	"encoding/json"
	"os"
	"runtime"
	"strconv"

	"github.com/opencontainers/runc/libcontainer/configs"
)

func init() {
	// Keep the main goroutine on the main thread for the life of the
	// process, so that no other goroutine ever runs there, in every binary
	// that starts containers (sandboxd and sandboxd-init both import this
	// package). libcontainer joins a sandbox's mount namespace on a locked
	// thread while it starts the sandbox and lets the Go runtime end that
	// thread afterwards; but the main thread is never ended, only parked,
	// and one that joined a sandbox's mount namespace would keep it (and its
	// tmpfs) alive after Destroy, and make /proc/self/mountinfo show the
	// sandbox's mounts. A LockOSThread in an init function binds main to the
	// main thread.
	runtime.LockOSThread()
}

// PinGOMAXPROCS puts this process's GOMAXPROCS into its environment, where
// libcontainer takes the init re-exec's from (and the helper and the local
// backend's other children inherit it). Without it every init's Go runtime works out its
// own from the cgroup files, which means reading /proc/self/mountinfo: two
// lines per sandbox on the host, copied into each new mount namespace, so
// creates got slower as the host filled up (0.3 ms of CPU per create with
// 100 sandboxes, in a profile).
func PinGOMAXPROCS() {
	if os.Getenv("GOMAXPROCS") == "" {
		_ = os.Setenv("GOMAXPROCS", strconv.Itoa(runtime.GOMAXPROCS(0)))
	}
}

// OneProcForInits sets GOMAXPROCS=1 in this process's environment, from
// where libcontainer gives it to every init it starts (this process's own
// GOMAXPROCS was fixed when it started); sandboxd-init calls it. The init
// does libcontainer's setup on one locked thread, and with one P its Go
// runtime starts fewer threads: 3.4 instead of 4.3 per init, each a clone
// and a stack to fault in, and each one more for the execve of envd to end
// and wait for (begin_new_exec waited 0.65 instead of 0.75 ms). The start
// was 0.3 ms shorter in paired runs (BENCHMARKS.md).
func OneProcForInits() { _ = os.Setenv("GOMAXPROCS", "1") }

// Arg is the helper's first argument: sandboxd-init serves the socket on fd 3
// when it is given, and is libcontainer's init when it is "init".
const Arg = "serve"

// request asks for one container: libcontainer.Create(Root, ID, Config), then
// Run of an init process with Args, Env and Cwd whose stdout and stderr go to
// Log (opened for appending).
type request struct {
	Seq    uint64          `json:"seq"`
	Root   string          `json:"root"`
	ID     string          `json:"id"`
	Config *configs.Config `json:"config"`
	Args   []string        `json:"args"`
	Env    []string        `json:"env"`
	Cwd    string          `json:"cwd"`
	Log    string          `json:"log"`
}

// response answers request Seq: the init's pid, with its pidfd attached, or
// Error. A failed start leaves no container behind (the helper destroys what
// it created).
type response struct {
	Seq   uint64 `json:"seq"`
	Pid   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
}

// maxMessage bounds one packet: a container's config is a few KiB.
const maxMessage = 1 << 20

// warmJSON builds encoding/json's caches for libcontainer's config types,
// which the first start request would otherwise build on its way: 0.5-0.7 ms
// in a fresh process, for the encoding at sandboxd's end (and the decoding
// of the container's state after) and for the decoding at the helper's.
func warmJSON() { _ = json.Unmarshal([]byte(`{"config":{}}`), new(request)) }
