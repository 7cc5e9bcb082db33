package local_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	devices "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/local/starter"
)

// The floors below put numbers on the two parts of a create that the
// backend's design fixes, started the way the creates start their parts and
// measured in the same loop (BenchmarkCreateDestroy), so that the ratio to
// bwrap says what is left to the backend itself.

// libcontainerFloor runs /bin/true the way `bwrap --ro-bind / / true` does
// (a mount namespace, the host's / bound read-only as the root), through
// libcontainer started by sandboxd-init, as the backend starts sandboxes:
// the library the issue prescribes, with the least it can be asked to do.
// libcontainer always makes a cgroup; it gets one with no limits.
type libcontainerFloor struct {
	dir, rootfs, cgroupParent string
	starter                   *starter.Client
	n                         int
}

// newLibcontainerFloor keeps its state in env's root, as the backend does:
// libcontainer seals the binary it re-executes with an overlay whose lower
// layers are the binary's directory and the state directory, and falls back
// to copying the whole binary (8 ms for this one) where one contains the
// other, as a TempDir in /tmp does for a test binary run from /tmp.
func newLibcontainerFloor(tb testing.TB, env testEnv) *libcontainerFloor {
	tb.Helper()
	dir := filepath.Join(env.root, "floor-"+randHex())
	f := &libcontainerFloor{dir: dir, rootfs: filepath.Join(dir, "rootfs"), cgroupParent: env.cgroupParent + "-floor", starter: starter.New(initBin)}
	if err := os.MkdirAll(f.rootfs, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mount("/", f.rootfs, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		tb.Fatal(err)
	}
	// Private: the host's mounts from now on (the sandboxes' among them)
	// stay out of it, as they stay out of bwrap's namespace.
	if err := unix.Mount("", f.rootfs, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		_ = unix.Unmount(f.rootfs, unix.MNT_DETACH)
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = f.starter.Close()
		if err := unix.Unmount(f.rootfs, unix.MNT_DETACH); err != nil {
			tb.Errorf("floor: %v", err)
		}
		if err := os.RemoveAll(f.dir); err != nil {
			tb.Errorf("floor: %v", err)
		}
		for _, h := range local.CgroupRoots() {
			if err := os.Remove(filepath.Join(h, f.cgroupParent)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				tb.Errorf("floor: %v", err)
			}
		}
	})
	return f
}

// run times one container from the start request to the exit of /bin/true;
// the destroy after it is not timed (as bwrap's exit is its whole cleanup).
func (f *libcontainerFloor) run() (time.Duration, error) {
	f.n++
	id := fmt.Sprintf("floor-%d", f.n)
	cfg := &configs.Config{
		Rootfs:     f.rootfs,
		Readonlyfs: true,
		Namespaces: configs.Namespaces{{Type: configs.NEWNS}},
		Cgroups: &cgroups.Cgroup{
			Path: filepath.Join(f.cgroupParent, id),
			Resources: &cgroups.Resources{
				Devices: []*devices.Rule{{Type: devices.WildcardDevice, Permissions: "rwm", Allow: true}},
			},
		},
	}
	root := filepath.Join(f.dir, "state")
	t0 := time.Now()
	_, exited, err := f.starter.Start(context.Background(), starter.Spec{
		Root: root, ID: id, Config: cfg, Args: []string{"/bin/true"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/",
		Log: filepath.Join(f.dir, id+".log"),
	})
	if err != nil {
		return 0, err
	}
	<-exited
	d := time.Since(t0)
	ctr, err := libcontainer.Load(root, id)
	if err != nil {
		return 0, err
	}
	return d, ctr.Destroy()
}

// envdAlone times envd's own start, outside any sandbox: from exec to its
// first /health answer on its unix socket, asked the way the backend asks.
func envdAlone(dir string) (time.Duration, error) {
	sock := filepath.Join(dir, "envd.sock")
	_ = os.Remove(sock)
	t0 := time.Now()
	cmd := exec.Command(envdBin, "--socket", sock, "--listen", "", "--log-level", "error")
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() { _ = cmd.Process.Kill(); <-exited }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func(ctx context.Context) (net.Conn, error) { return envdconn.DialSocket(ctx, sock, "floor") }
	if err := envdconn.WaitHealthy(ctx, dial, envdconn.Health{Exited: exited, MaxDelay: 2 * time.Millisecond, Socket: sock}); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// BenchmarkLibcontainerGap runs libcontainerFloor with a pause of 0, 10
// and 30 ms before each start. On a host without the cgroup2 option
// favordynmods, moving the new init into its cgroup waits for an RCU grace
// period when no other move came in the last 10-20 ms (see favorDynMods):
// there gap=30ms is about 2.5× gap=0. Benchmarks in this package open
// backends, which turn the option on; run this one alone, first, to see a
// host as it was:
//
//	go test -run '^$' -bench LibcontainerGap -benchtime 40x ./runtime/local/
func BenchmarkLibcontainerGap(b *testing.B) {
	for _, gap := range []time.Duration{0, 10 * time.Millisecond, 30 * time.Millisecond} {
		b.Run(fmt.Sprintf("gap=%v", gap), func(b *testing.B) {
			f := newLibcontainerFloor(b, newEnv(b))
			var d []time.Duration
			for b.Loop() {
				time.Sleep(gap)
				t, err := f.run()
				if err != nil {
					b.Fatal(err)
				}
				d = append(d, t)
			}
			b.ReportMetric(ms(pct(d, 50)), "start-p50-ms")
			b.ReportMetric(ms(pct(d, 99)), "start-p99-ms")
		})
	}
}
