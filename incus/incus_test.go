package incus_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"

	"github.com/sandboxd/sandboxd/incus"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/egress"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// The real-Incus tests need what scripts/incus-setup.sh prepares: incusd on
// its socket, the pool and the image. Override with SANDBOXD_INCUS_SOCKET,
// SANDBOXD_INCUS_POOL and SANDBOXD_INCUS_IMAGE.
var (
	envdBin    string
	skipReason string
)

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	sock := env("SANDBOXD_INCUS_SOCKET", incus.DefaultSocket)
	switch {
	case os.Geteuid() != 0:
		skipReason = "the Incus backend tests need root"
	default:
		if _, err := os.Stat(sock); err != nil {
			skipReason = fmt.Sprintf("no Incus at %s (run scripts/incus-setup.sh)", sock)
		}
	}
	if skipReason == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := incus.NewUnixClient(sock)
		if _, err := c.Server(ctx); err != nil {
			skipReason = fmt.Sprintf("Incus at %s does not answer: %v (run scripts/incus-setup.sh)", sock, err)
		} else if _, err := c.ImageAlias(ctx, env("SANDBOXD_INCUS_IMAGE", "sandboxd-base")); err != nil {
			skipReason = fmt.Sprintf("no image %s in Incus: %v (run scripts/incus-setup.sh)", env("SANDBOXD_INCUS_IMAGE", "sandboxd-base"), err)
		}
	}
	if skipReason == "" {
		bin, cleanup, err := runtimetest.EnvdBinary("incus-envd-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cleanup()
		envdBin = bin
	}
	return m.Run()
}

func randHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// remoteClient is a client over HTTPS when SANDBOXD_INCUS_URL (with
// SANDBOXD_INCUS_CLIENT_CERT, _CLIENT_KEY and _SERVER_CERT) is set: the
// backend then talks to Incus over HTTPS instead of the unix socket (the
// socket directories stay local, so the server must be this host).
func remoteClient(t testing.TB) *incus.Client {
	u := os.Getenv("SANDBOXD_INCUS_URL")
	if u == "" {
		return nil
	}
	cfg, err := incus.LoadRemoteConfig(u, os.Getenv("SANDBOXD_INCUS_CLIENT_CERT"),
		os.Getenv("SANDBOXD_INCUS_CLIENT_KEY"), os.Getenv("SANDBOXD_INCUS_SERVER_CERT"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := incus.NewRemoteClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRemoteClient checks the HTTPS client against a real server: trusted,
// and refused with another pinned certificate.
func TestRemoteClient(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	c := remoteClient(t)
	if c == nil {
		t.Skip("SANDBOXD_INCUS_URL not set (an HTTPS listener and a trusted client certificate)")
	}
	s, err := c.Server(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if s.Auth != "trusted" {
		t.Errorf("GET /1.0 over HTTPS: auth %q; want trusted", s.Auth)
	}
	cfg, err := incus.LoadRemoteConfig(os.Getenv("SANDBOXD_INCUS_URL"), os.Getenv("SANDBOXD_INCUS_CLIENT_CERT"),
		os.Getenv("SANDBOXD_INCUS_CLIENT_KEY"), os.Getenv("SANDBOXD_INCUS_CLIENT_CERT")) // wrong pin
	if err != nil {
		t.Fatal(err)
	}
	bad, err := incus.NewRemoteClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Server(t.Context()); err == nil {
		t.Errorf("GET /1.0 with a wrong pinned server certificate succeeded")
	}
}

// options gives each backend its own namespace and socket root, so that it
// starts empty however many other sandboxes Incus holds.
func options(t testing.TB, ns string) incus.Options {
	return incus.Options{
		Client:    remoteClient(t),
		Socket:    env("SANDBOXD_INCUS_SOCKET", incus.DefaultSocket),
		Pool:      env("SANDBOXD_INCUS_POOL", "sandboxd"),
		Images:    map[string]string{incus.DefaultTemplate: env("SANDBOXD_INCUS_IMAGE", "sandboxd-base")},
		EnvdPath:  envdBin,
		Root:      filepath.Join(testRoot, ns),
		Namespace: "test-" + ns,
		Log:       slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
}

// newBackend opens a backend in a fresh namespace; its cleanup destroys what
// the test left and waits for the deletions.
func newBackend(t testing.TB) (*incus.Backend, string) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	ns := randHex()
	b, err := incus.New(context.Background(), options(t, ns))
	if err != nil {
		t.Fatalf("incus.New: %v", err)
	}
	t.Cleanup(func() { cleanupBackend(t, b, ns) })
	return b, ns
}

// cleanupBackend destroys what a test left and waits for the deletions.
func cleanupBackend(t testing.TB, b *incus.Backend, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, _ := b.List(ctx)
	for _, s := range l {
		_ = b.Destroy(ctx, s.ID)
	}
	if err := b.WaitDeletes(ctx); err != nil {
		t.Errorf("cleanup: %v", err)
	}
	if err := b.Reconcile(ctx); err != nil {
		t.Errorf("cleanup: Reconcile: %v", err)
	}
	_ = os.RemoveAll(filepath.Join(testRoot, ns))
	// The parent goes with the last test that used it (non-empty, the
	// removal fails and it stays for the others). It is this package's
	// own: runtime/local's tests, which may run at the same time, make
	// and remove /run/sandboxd-test.
	_ = os.Remove(testRoot)
}

// testRoot holds the state directories of the tests' backends.
const testRoot = "/run/sandboxd-incustest"

func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtime.Backend {
		b, _ := newBackend(t)
		return b
	})
}

// TestRestartConformance runs the shared restart suite: both kinds of pause
// survive a new backend (a restarted sandboxd) on the same Incus.
func TestRestartConformance(t *testing.T) {
	runtimetest.RunRestart(t, func(t *testing.T) (runtime.Backend, func(t *testing.T) runtime.Backend) {
		b, ns := newBackend(t)
		return b, func(t *testing.T) runtime.Backend { return reopen(t, options(t, ns)) }
	})
}

// reopen opens a second backend with opts, as a restarted sandboxd does
// (New, then Reconcile).
func reopen(t *testing.T, opts incus.Options) *incus.Backend {
	t.Helper()
	b, err := incus.New(t.Context(), opts)
	if err != nil {
		t.Fatalf("incus.New again: %v", err)
	}
	if err := b.Reconcile(t.Context()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return b
}

// TestRecovery: a second backend (a restarted sandboxd) sees the sandboxes
// of the first, running and paused, and can use and destroy them.
func TestRecovery(t *testing.T) {
	b1, ns := newBackend(t)
	ctx := t.Context()
	x, y := runtimetest.NewID(), runtimetest.NewID()
	for _, id := range []string{x, y} {
		if _, err := b1.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 128, CPUCount: 1})); err != nil {
			t.Fatal(err)
		}
	}
	if err := b1.Pause(ctx, y, runtime.PauseMemory); err != nil {
		t.Fatal(err)
	}
	b2, err := incus.New(ctx, options(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := b2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]runtime.State{}
	for _, s := range l {
		got[s.ID] = s.State
		if s.Spec.MemoryMB != 256 || s.Template != incus.DefaultTemplate {
			t.Errorf("re-adopted %+v; want its spec back", s)
		}
	}
	if got[x] != runtime.StateRunning || got[y] != runtime.StatePaused || len(got) != 2 {
		t.Fatalf("List() after restart = %v", got)
	}
	if _, err := b2.Resume(ctx, y); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{x, y} {
		res, err := runtimetest.Exec(ctx, b2, id, "user", "/bin/sh", "-c", "echo hi")
		if err != nil || res.Stdout != "hi\n" {
			t.Errorf("exec in re-adopted %s: %v, %v", id, res, err)
		}
		if err := b2.Destroy(ctx, id); err != nil {
			t.Error(err)
		}
	}
	if err := b2.WaitDeletes(ctx); err != nil {
		t.Fatal(err)
	}
	l, _ = b2.List(ctx)
	if len(l) != 0 {
		t.Errorf("List() after Destroy = %d sandboxes", len(l))
	}
}

// TestTiming measures create → envd healthy and Destroy → instance gone,
// sequentially, without and with internet access (alternating), and logs
// the medians. Run with SANDBOXD_INCUS_BENCH=1 go test -run TestTiming -v.
func TestTiming(t *testing.T) {
	if os.Getenv("SANDBOXD_INCUS_BENCH") == "" {
		t.Skip("a measurement: set SANDBOXD_INCUS_BENCH=1")
	}
	ns := randHex()
	opts := options(t, ns)
	opts.EgressSubnet = egressSubnet(t)
	b := newBackendWith(t, ns, opts)
	ctx := t.Context()
	n := 11
	type series struct{ create, destroy, gone []time.Duration }
	var res [2]series
	for i := range 2 * n {
		internet := i%2 == 1
		id := runtimetest.NewID()
		t0 := time.Now()
		if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 128, CPUCount: 1, AllowInternet: internet})); err != nil {
			t.Fatal(err)
		}
		c := time.Since(t0)
		t1 := time.Now()
		if err := b.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		d := time.Since(t1)
		if err := b.WaitDeletes(ctx); err != nil {
			t.Fatal(err)
		}
		g := time.Since(t1)
		if i < 2 {
			continue // warm-up
		}
		r := &res[i%2]
		r.create, r.destroy, r.gone = append(r.create, c), append(r.destroy, d), append(r.gone, g)
	}
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	for i, r := range res {
		t.Logf("internet %v, n=%d: create→envd healthy p50 %v (min %v max %v); Destroy returns p50 %v; instance gone p50 %v",
			i == 1, len(r.create), med(r.create), r.create[0], r.create[len(r.create)-1], med(r.destroy), med(r.gone))
	}
}

// TestSocketDir: the shared socket directory is a small tmpfs of its own
// (root inside cannot fill the host's /run), and a symlink planted as
// envd.sock does not lead sandboxd to a host socket.
func TestSocketDir(t *testing.T) {
	b, _ := newBackend(t)
	ctx := t.Context()
	id := runtimetest.NewID()
	if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 128})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	runtimetest.CheckSocketDir(t, b, id, 8)
}

// TestEnvAndLimits: the spec's environment reaches envd, and
// the instance carries the limits and user.sandboxd.* keys.
func TestEnvAndLimits(t *testing.T) {
	b, _ := newBackend(t)
	ctx := t.Context()
	id := runtimetest.NewID()
	if _, err := b.Create(ctx, runtime.Spec{ID: id, Template: incus.DefaultTemplate, MemoryMB: 300, DiskSizeMB: 64, CPUCount: 1,
		Env: map[string]string{"FOO": "bar baz"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	// envd's own environment (what it starts with; processes get theirs
	// from envd, as in runtime/local).
	res, err := runtimetest.Exec(ctx, b, id, "root", "/bin/sh", "-c",
		`tr '\0' '\n' </proc/1/environ | grep -E '^(FOO|E2B_SANDBOX|E2B_SANDBOX_ID)=' | sort | tr '\n' '|'; echo; ls /sys/class/net; ls -d /dev/incus 2>/dev/null`)
	if err != nil {
		t.Fatal(err)
	}
	if want := "E2B_SANDBOX=true|E2B_SANDBOX_ID=" + id + "|FOO=bar baz|\n"; !strings.HasPrefix(res.Stdout, want) {
		t.Errorf("env = %q; want prefix %q", res.Stdout, want)
	}
	if !strings.Contains(res.Stdout, "lo\n") || strings.Contains(res.Stdout, "eth") {
		t.Errorf("network: %q; want lo only", res.Stdout)
	}
	if strings.Contains(res.Stdout, "/dev/incus") {
		t.Errorf("/dev/incus exists: the guest API would show the sandbox its user.sandboxd.* keys")
	}
	// No nested user namespace (a way to CAP_SYS_ADMIN and mounts), and
	// root cannot lift the limit.
	for _, user := range []string{"user", "root"} {
		res, err := runtimetest.Exec(ctx, b, id, user, "/bin/sh", "-c",
			"echo 100 > /proc/sys/user/max_user_namespaces; unshare -Urm sh -c 'mount -t tmpfs none /mnt && echo MOUNTED'")
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || strings.Contains(res.Stdout, "MOUNTED") {
			t.Errorf("as %s, a nested user namespace could mount: %v", user, res)
		}
	}
	l, err := b.Client().Instances(ctx, "user.sandboxd.id")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range l {
		if in.Config["user.sandboxd.id"] != id {
			continue
		}
		c := in.Config
		if c["limits.memory"] != "300MiB" || c["limits.cpu"] != "1" || c["limits.processes"] == "" ||
			c["user.sandboxd.template"] != incus.DefaultTemplate || c["user.sandboxd.created-at"] == "" || !in.Ephemeral {
			t.Errorf("instance config %v; want limits and user.sandboxd.* keys, ephemeral", c)
		}
		if len(in.Devices) != 3 || in.Devices["root"]["pool"] == "" {
			t.Errorf("devices %v; want root, envd and sock only (no NIC)", in.Devices)
		}
		return
	}
	t.Errorf("no instance with user.sandboxd.id %s", id)
}

// TestIdleMemory creates 10 idle sandboxes and logs how much the host's
// MemAvailable drops per sandbox, the PSS of Incus's per-instance monitor
// and the container's cgroup memory. Run with SANDBOXD_INCUS_BENCH=1.
func TestIdleMemory(t *testing.T) {
	if os.Getenv("SANDBOXD_INCUS_BENCH") == "" {
		t.Skip("a measurement: set SANDBOXD_INCUS_BENCH=1")
	}
	b, _ := newBackend(t)
	ctx := t.Context()
	memAvail := func() int64 {
		raw, err := os.ReadFile("/proc/meminfo")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(raw), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
				var kb int64
				fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb)
				return kb << 10
			}
		}
		t.Fatal("no MemAvailable")
		return 0
	}
	// Warm-up: the first sandbox also unpacks nothing (btrfs) but loads code.
	warm := runtimetest.NewID()
	if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: warm, MemoryMB: 256, DiskSizeMB: 128, CPUCount: 1})); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	before := memAvail()
	const n = 10
	var stat runtime.Stats
	for range n {
		id := runtimetest.NewID()
		if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 128, CPUCount: 1})); err != nil {
			t.Fatal(err)
		}
		stat, _ = b.Stats(ctx, id)
	}
	time.Sleep(3 * time.Second)
	after := memAvail()
	// Incus keeps one "[lxc monitor]" process per instance on the host.
	var monitors int
	var pss int64
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err != nil || !strings.HasPrefix(string(cmd), "[lxc monitor]") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(filepath.Dir(p), "smaps_rollup"))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(raw), "\n") {
			if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
				var kb int64
				fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb)
				pss += kb << 10
				monitors++
			}
		}
	}
	if monitors == 0 {
		monitors = 1
	}
	t.Logf("per idle sandbox: host MemAvailable drop %.1f MiB (n=%d, noisy); [lxc monitor] PSS %.1f MiB (%d processes); container cgroup memory %.1f MiB",
		float64(before-after)/n/(1<<20), n, float64(pss)/float64(monitors)/(1<<20), monitors, float64(stat.MemoryBytes)/(1<<20))
}

// TestInstanceVanished: when the instance stops behind the backend's back
// (envd exited: the ephemeral container is deleted by Incus), List drops
// the sandbox and its socket directory goes.
func TestInstanceVanished(t *testing.T) {
	b, ns := newBackend(t)
	ctx := t.Context()
	id := runtimetest.NewID()
	if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64})); err != nil {
		t.Fatal(err)
	}
	name := incus.InstanceName("test-"+ns, id)
	if err := b.Client().SetState(ctx, name, incus.StatePut{Action: "stop", Force: true, Timeout: -1}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := b.Client().Instance(ctx, name); errors.Is(err, runtime.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("instance still there 5 s after its stop")
		}
		time.Sleep(20 * time.Millisecond)
	}
	l, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 0 {
		t.Errorf("List() = %d sandboxes; want none", len(l))
	}
	if _, err := b.Stats(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stats(vanished) = %v; want ErrNotFound", err)
	}
	if err := b.WaitDeletes(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(testRoot, ns, "sandboxes", name)
	if _, err := os.Lstat(dir); err == nil {
		t.Errorf("socket dir %s left", dir)
	}
}

// TestPauseToDisk checks what the shared suite cannot see of a pause to
// disk on Incus: the instance is stopped (no init process, no memory
// charged) and persistent while paused, kept by a new backend's Reconcile,
// an ordinary ephemeral instance again once resumed, and deleted by a
// Destroy while paused; a sandbox with internet access gets its network
// back on resume.
func TestPauseToDisk(t *testing.T) {
	for _, internet := range []bool{false, true} {
		t.Run(fmt.Sprintf("internet=%v", internet), func(t *testing.T) {
			if skipReason != "" {
				t.Skip(skipReason)
			}
			if internet {
				if err := egress.HaveNft(); err != nil {
					t.Skip(err)
				}
			}
			ns := randHex()
			opts := options(t, ns)
			opts.EgressSubnet = egressSubnet(t)
			b := newBackendWith(t, ns, opts)
			ctx := t.Context()
			c := b.Client()
			id := runtimetest.NewID()
			name := incus.InstanceName("test-"+ns, id)
			if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, CPUCount: 1, AllowInternet: internet})); err != nil {
				t.Fatal(err)
			}
			sh := func(b runtime.Backend, script string) string {
				t.Helper()
				res, err := runtimetest.Exec(ctx, b, id, "root", "/bin/sh", "-c", script)
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("exec %q: %+v %v", script, res, err)
				}
				return res.Stdout
			}
			netView := func(b runtime.Backend) string {
				t.Helper()
				res, err := runtimetest.Exec(ctx, b, id, "user", "/usr/bin/python3", "-c", ifaceScript)
				if err != nil {
					t.Fatal(err)
				}
				return res.Stdout
			}
			before := netView(b)
			if got := strings.Contains(before, "default eth0"); got != internet {
				t.Fatalf("network before the pause (internet %v):\n%s", internet, before)
			}
			sh(b, "echo kept > /root/kept")
			// LXC gives every container start a boot id of its own (a
			// bind over this path): the resumed sandbox looks rebooted.
			const bootID = "cat /proc/sys/kernel/random/boot_id"
			bootBefore := sh(b, bootID)

			if err := b.Pause(ctx, id, runtime.PauseDisk); err != nil {
				t.Fatal(err)
			}
			wantInstance := func(status string, ephemeral bool, paused string) {
				t.Helper()
				in, err := c.Instance(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if in.Status != status || in.Ephemeral != ephemeral || in.Config["user.sandboxd.paused"] != paused {
					t.Fatalf("instance %s: status %s ephemeral %v paused %q; want %s %v %q",
						name, in.Status, in.Ephemeral, in.Config["user.sandboxd.paused"], status, ephemeral, paused)
				}
			}
			wantInstance("Stopped", false, "disk")
			st, err := c.InstanceState(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if st.Pid > 0 || st.Processes > 0 || st.Memory.Usage > 0 {
				t.Errorf("state of an instance paused to disk: pid %d, %d processes, %d bytes of memory", st.Pid, st.Processes, st.Memory.Usage)
			}
			if ms := mountsAt(filepath.Join(opts.Root, "sandboxes", name)); len(ms) != 0 {
				t.Errorf("socket dir still mounted while paused to disk: %v", ms)
			}

			b2 := reopen(t, opts)
			wantInstance("Stopped", false, "disk")
			restarted, err := b2.Resume(ctx, id)
			if err != nil || !restarted {
				t.Fatalf("Resume = %v, %v; want restarted", restarted, err)
			}
			wantInstance("Running", true, "")
			if got := sh(b2, "cat /root/kept"); got != "kept\n" {
				t.Errorf("file after resume: %q", got)
			}
			if got := sh(b2, bootID); got == bootBefore {
				t.Errorf("boot_id after a pause to disk = %q, unchanged; want a new one", got)
			}
			if after := netView(b2); after != before {
				t.Errorf("network after resume:\n%s\nbefore:\n%s", after, before)
			}

			if err := b2.Pause(ctx, id, runtime.PauseDisk); err != nil {
				t.Fatal(err)
			}
			if err := b2.Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := b2.WaitDeletes(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Instance(ctx, name); !errors.Is(err, runtime.ErrNotFound) {
				t.Errorf("instance of a sandbox destroyed while paused to disk: %v; want it gone", err)
			}
		})
	}
}

// mountsAt lists the mounts at dir in this process's mount namespace.
func mountsAt(dir string) []string {
	raw, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for line := range strings.SplitSeq(string(raw), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			out = append(out, line)
		}
	}
	return out
}

// TestCreateTakenID: Create skips the "is the id free?" GET when the id has
// no socket directory, so the cases where one exists, or an instance does
// without one, must still come out right.
func TestCreateTakenID(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	ns := randHex()
	opts := options(t, ns)
	b1 := newBackendWith(t, ns, opts)
	// Opened before b1 makes anything, so it adopts nothing of b1's; b1's
	// cleanup removes the shared root.
	b2, err := incus.New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b2.WaitDeletes(context.Background()) })
	ctx := t.Context()
	dirOf := func(id string) string {
		return filepath.Join(opts.Root, "sandboxes", incus.InstanceName("test-"+ns, id))
	}
	create := func(b *incus.Backend, id string) error {
		_, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, CPUCount: 1}))
		return err
	}
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, id string) // with b1
		wantErr error
		wantDir bool // b1's socket dir after the failed Create
	}{
		{"stale socket dir, no instance", func(t *testing.T, id string) {
			if err := os.Mkdir(dirOf(id), 0o700); err != nil {
				t.Fatal(err)
			}
		}, nil, true},
		{"live instance of another backend", func(t *testing.T, id string) {
			if err := create(b1, id); err != nil {
				t.Fatal(err)
			}
		}, runtime.ErrAlreadyExists, true},
		{"instance of another backend paused to disk", func(t *testing.T, id string) {
			if err := create(b1, id); err != nil {
				t.Fatal(err)
			}
			if err := b1.Pause(ctx, id, runtime.PauseDisk); err != nil {
				t.Fatal(err)
			}
		}, runtime.ErrAlreadyExists, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := runtimetest.NewID()
			t.Cleanup(func() { _ = b1.Destroy(context.Background(), id); _ = b2.Destroy(context.Background(), id) })
			tc.prepare(t, id)
			err := create(b2, id)
			if !errors.Is(err, tc.wantErr) && (tc.wantErr != nil || err != nil) {
				t.Fatalf("Create = %v; want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil {
				wantExec(t, b2, id)
				return
			}
			if _, err := os.Stat(dirOf(id)); (err == nil) != tc.wantDir {
				t.Errorf("socket dir after the failed Create: %v; want it there: %v", err, tc.wantDir)
			}
			// The other backend's sandbox is untouched and still works.
			if _, err := b1.Resume(ctx, id); err != nil {
				t.Fatalf("Resume by its own backend = %v", err)
			}
			wantExec(t, b1, id)
		})
	}
}

// wantExec runs a command in sandbox id through envd.
func wantExec(t *testing.T, b runtime.Backend, id string) {
	t.Helper()
	res, err := runtimetest.Exec(t.Context(), b, id, "user", "/bin/sh", "-c", "echo hi")
	if err != nil || res.Stdout != "hi\n" {
		t.Fatalf("exec in %s: %+v, %v", id, res, err)
	}
}

// TestReconcileUnmarksLiveInstance: a crash between marking an instance as
// paused to disk and stopping it (or between starting it and unmarking it
// on resume) leaves it running, persistent and marked. Reconcile makes it a
// running sandbox's again: ephemeral, unmarked.
func TestReconcileUnmarksLiveInstance(t *testing.T) {
	b, ns := newBackend(t)
	ctx := t.Context()
	c := b.Client()
	id := runtimetest.NewID()
	name := incus.InstanceName("test-"+ns, id)
	if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, CPUCount: 1})); err != nil {
		t.Fatal(err)
	}
	persistent := false
	if err := c.PatchInstance(ctx, name, incus.InstancePatch{Ephemeral: &persistent, Config: map[string]string{"user.sandboxd.paused": "disk"}}); err != nil {
		t.Fatal(err)
	}
	b2, err := incus.New(ctx, options(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	in, err := c.Instance(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != "Running" || !in.Ephemeral || in.Config["user.sandboxd.paused"] != "" {
		t.Errorf("after Reconcile: status %s, ephemeral %v, paused %q; want Running, ephemeral, unmarked", in.Status, in.Ephemeral, in.Config["user.sandboxd.paused"])
	}
	if _, err := runtimetest.Exec(ctx, b2, id, "root", "/bin/true"); err != nil {
		t.Errorf("exec after Reconcile: %v", err)
	}
}

// TestForkBomb: a fork bomb that ends (at its timeout) leaves its container
// usable (runtimetest.ForkBomb).
func TestForkBomb(t *testing.T) {
	b, _ := newBackend(t)
	id := runtimetest.NewID()
	if _, err := b.Create(t.Context(), runtimetest.Finish(runtime.Spec{ID: id, MemoryMB: 256, DiskSizeMB: 64, CPUCount: 1})); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	runtimetest.ForkBomb(t, b, id, cgroups.IsCgroup2UnifiedMode())
}

// TestQuotaGuard: the backend finds its pool's quota-group state in sysfs
// (a guard that found nothing would never rescan), and a check leaves the
// groups consistent: rescanned if the kernel had marked them, untouched
// otherwise.
func TestQuotaGuard(t *testing.T) {
	b, _ := newBackend(t)
	g := incus.QuotaGuardOf(b)
	if g.Inconsistent() == "" {
		t.Fatal("no qgroups/inconsistent file found for the pool; the guard would never act")
	}
	if _, err := g.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(g.Inconsistent())
	if err != nil || strings.TrimSpace(string(raw)) != "0" {
		t.Errorf("after the check, %s = %q, %v; want 0", g.Inconsistent(), raw, err)
	}
	// scripts/incus-setup.sh turns simple quotas on where the kernel has them.
	if _, err := os.Stat("/sys/fs/btrfs/features/simple_quota"); err == nil && !g.Simple() {
		t.Errorf("the pool keeps full quota groups; scripts/incus-setup.sh turns simple quotas on")
	}
}

// TestDiskSize: a sandbox can write its DiskSizeMB into its root, and not
// much more, whatever its template's root holds (the base, or a layer of a
// sandbox that wrote 200 MB), and a full sandbox is still destroyed.
func TestDiskSize(t *testing.T) {
	b, _ := newBackend(t)
	ctx := t.Context()
	src := runtimetest.NewID()
	if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: src, MemoryMB: 256, DiskSizeMB: 256, CPUCount: 1})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), src) })
	sh(t, b, src, "root", "head -c 200000000 /dev/urandom > /big && sync")
	key := newLayerKey(t, b)
	if err := b.Commit(ctx, src, key); err != nil {
		t.Fatal(err)
	}
	tpl := "disk-" + randHex()
	if err := b.DefineTemplate(ctx, tpl, incus.DefaultTemplate, []string{key}); err != nil {
		t.Fatal(err)
	}
	for _, template := range []string{incus.DefaultTemplate, tpl} {
		id := runtimetest.NewID()
		if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, Template: template, MemoryMB: 256, DiskSizeMB: 64, CPUCount: 1})); err != nil {
			t.Fatal(err)
		}
		sh(t, b, id, "root", "head -c 50000000 /dev/urandom > /mine && sync")
		r, err := runtimetest.Exec(ctx, b, id, "root", "/bin/sh", "-c", "head -c 30000000 /dev/urandom > /more && sync")
		if err != nil || r.ExitCode == 0 || !strings.Contains(r.Stderr, "quota") {
			t.Errorf("%s: 80 MB into a 64 MiB disk: %v, %+v; want a disk quota error", template, err, r)
		}
		if err := b.Destroy(ctx, id); err != nil {
			t.Errorf("%s: Destroy of a full sandbox: %v", template, err)
		}
	}
	if err := b.Destroy(ctx, src); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitDeletes(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestBaseImage: the base image is scripts/base-rootfs.sh's Debian (what
// E2B's base has), with sudo working for user (no no_new_privs) and /usr
// writable by root, in the sandbox's own volume.
func TestBaseImage(t *testing.T) {
	b, _ := newBackend(t)
	ctx := t.Context()
	id := runtimetest.NewID()
	if _, err := b.Create(ctx, runtime.Spec{ID: id, Template: incus.DefaultTemplate, MemoryMB: 300, DiskSizeMB: 64, CPUCount: 1}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	res, err := runtimetest.Exec(ctx, b, id, "user", "/bin/sh", "-c",
		`sudo -n id -u && python --version && node --version >/dev/null && npm --version >/dev/null && git --version >/dev/null && sudo -n touch /usr/local/probe && echo ok`)
	if err != nil || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "0\nPython 3.") || !strings.HasSuffix(res.Stdout, "ok\n") || res.Stderr != "" {
		t.Errorf("base image: %+v, %v", res, err)
	}
}

// TestCloseWaitsForDeletes: Destroy deletes in the background, and Close
// waits for those deletions, so a stopped sandboxd leaves no instance of a
// sandbox it destroyed.
func TestCloseWaitsForDeletes(t *testing.T) {
	b, ns := newBackend(t)
	ctx := t.Context()
	var ids []string
	for range 2 {
		id := runtimetest.NewID()
		if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id})); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		if err := b.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	all, err := b.Client().Instances(ctx, "user.sandboxd.namespace")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range all {
		if in.Config["user.sandboxd.namespace"] == "test-"+ns {
			t.Errorf("instance %s (%s) left after Close", in.Name, in.Status)
		}
	}
}
