// Package runtimetest is the conformance suite every runtime.Backend must
// pass: lifecycle, errors, pause, stats, list, concurrency, leaks, limits and
// isolation. A backend's own tests call Run, and RunRestart with a way to
// reopen the backend on the same state (both kinds of pause must survive a
// restart), and add only what is specific to them.
//
// The suite drives sandboxes the way sandboxd does: through the Backend
// methods, and inside the sandbox only through envd (its /health, and its
// Process service for commands). It needs /bin/sh and coreutils in the
// backend's default template; tests that need more (bash, python3) skip
// without it.
package runtimetest

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

// HostPaths is implemented by backends that keep per-sandbox state in host
// paths (state directories, cgroups, veths). After Destroy, the suite checks
// that none of them exists. A path that the kernel removes on its own right
// after (a veth goes with its sandbox's network namespace) has
// hostPathGrace to go.
type HostPaths interface {
	HostPaths(id string) []string
}

// Resources of the sandboxes the suite creates, small enough for a 2-core
// CI machine to run several at once.
const (
	memoryMB = 256
	diskMB   = 128
	cpuCount = 1
)

// Run runs the suite. newBackend is called once per subtest and must return
// a backend that holds no sandboxes; it should register its own cleanup with
// t.Cleanup. Subtests destroy what they create.
func Run(t *testing.T, newBackend func(t *testing.T) runtime.Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b runtime.Backend)
	}{
		{"CreateHealth", testCreateHealth},
		{"CreateEnvdInit", testCreateEnvdInit},
		{"CreateErrors", testCreateErrors},
		{"CreateCancelled", testCreateCancelled},
		{"DestroyTwice", testDestroyTwice},
		{"PauseResume", testPauseResume},
		{"Alive", testAlive},
		{"Fork", testFork},
		{"Stats", testStats},
		{"List", testList},
		{"Concurrency", testConcurrency},
		{"NoLeaks", testNoLeaks},
		{"Exec", testExec},
		{"DialPort", testDialPort},
		{"Limits/Memory", testMemoryLimit},
		{"Limits/Pids", testPidsLimit},
		{"Limits/Disk", testDiskLimit},
		{"Isolation/HostProcesses", testHostProcesses},
		{"Isolation/HostFiles", testHostFiles},
		{"Isolation/HostLoopback", testHostLoopback},
		{"Isolation/Mount", testMount},
		{"Isolation/Capabilities", testCapabilities},
		{"Isolation/Template", testTemplate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t)
			tc.fn(t, b)
		})
	}
}

// NewID returns a fresh sandbox id with a recognizable prefix.
func NewID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "rt-" + hex.EncodeToString(b[:])
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), Within(3*time.Minute))
	t.Cleanup(cancel)
	return ctx
}

func spec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Template: "base", CPUCount: cpuCount, MemoryMB: memoryMB, DiskSizeMB: diskMB}
}

// Finish fills what s leaves unset as sandboxd's control plane does by
// default (template "base", 2 CPUs, 512 MiB memory, 1024 MiB disk), for
// tests that drive a backend directly: backends take finished specs only.
func Finish(s runtime.Spec) runtime.Spec {
	s.Template = cmp.Or(s.Template, "base")
	s.CPUCount = cmp.Or(s.CPUCount, 2)
	s.MemoryMB = cmp.Or(s.MemoryMB, 512)
	s.DiskSizeMB = cmp.Or(s.DiskSizeMB, 1024)
	return s
}

// create creates a sandbox with the suite's resources and registers its
// destruction (and a check that it left nothing) with t.Cleanup.
func create(t *testing.T, b runtime.Backend) *runtime.Sandbox {
	t.Helper()
	return createSpec(t, b, spec(NewID()))
}

// createSpec is create with sp.
func createSpec(t *testing.T, b runtime.Backend, sp runtime.Spec) *runtime.Sandbox {
	t.Helper()
	sb, err := b.Create(ctxFor(t), sp)
	if err != nil {
		t.Fatalf("Create(%s) = %v", sp.ID, err)
	}
	t.Cleanup(func() {
		if err := b.Destroy(context.Background(), sp.ID); err != nil {
			t.Errorf("cleanup: Destroy(%s) = %v", sp.ID, err)
		}
		assertNoTrace(t, b, sp.ID)
	})
	return sb
}

// health asks envd in sandbox id for GET /health within timeout.
func health(ctx context.Context, b runtime.Backend, id string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := EnvdClient(b, id)
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://envd/health", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("GET /health = %s; want 204", resp.Status)
	}
	return nil
}

func mustHealthy(t *testing.T, b runtime.Backend, id string) {
	t.Helper()
	if err := health(ctxFor(t), b, id, Within(10*time.Second)); err != nil {
		t.Fatalf("sandbox %s: %v", id, err)
	}
}

// mustSh runs script as user and fails the test unless it exits 0.
func mustSh(t *testing.T, b runtime.Backend, id, user, script string) Result {
	t.Helper()
	res, err := sh(ctxFor(t), b, id, user, script)
	if err != nil {
		t.Fatalf("exec %q as %q: %v", script, user, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q as %q: %v; want exit 0", script, user, res)
	}
	return res
}

// hasCommand reports whether name is on PATH in sandbox id.
func hasCommand(t *testing.T, b runtime.Backend, id, name string) bool {
	t.Helper()
	res, err := sh(ctxFor(t), b, id, "root", "command -v "+name)
	return err == nil && res.ExitCode == 0
}

// assertNoTrace checks that sandbox id left nothing on the host: no mount
// whose path names it, no cgroup directory named after it, and none of the
// backend's HostPaths.
func assertNoTrace(t *testing.T, b runtime.Backend, id string) {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if strings.Contains(line, "/"+id+"/") || strings.Contains(line, "/"+id+" ") {
			t.Errorf("mount of destroyed sandbox %s left: %s", id, line)
		}
	}
	for _, p := range cgroupDirsNamed(id) {
		t.Errorf("cgroup of destroyed sandbox %s left: %s", id, p)
	}
	if hp, ok := b.(HostPaths); ok {
		left := hp.HostPaths(id)
		for deadline := time.Now().Add(hostPathGrace); ; time.Sleep(10 * time.Millisecond) {
			left = slices.DeleteFunc(left, func(p string) bool {
				_, err := os.Lstat(p)
				return err != nil
			})
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		for _, p := range left {
			t.Errorf("host path of destroyed sandbox %s left: %s", id, p)
		}
	}
}

const hostPathGrace = 5 * time.Second

// cgroupDirsNamed finds directories named id up to four levels below each
// cgroup hierarchy.
func cgroupDirsNamed(id string) []string {
	var found []string
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if e.Name() == id {
				found = append(found, p)
			}
			if depth < 4 {
				walk(p, depth+1)
			}
		}
	}
	// A v2-only host has the root cgroup's files in /sys/fs/cgroup itself
	// (hybrid hosts have them in unified/): one hierarchy, walked from its
	// root so that a sandbox's cgroup right under it counts too.
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		walk("/sys/fs/cgroup", 0)
		return found
	}
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hier {
		walk(h, 1)
	}
	return found
}

func testCreateHealth(t *testing.T, b runtime.Backend) {
	sb := create(t, b)
	if sb.State != runtime.StateRunning {
		t.Errorf("Create().State = %q; want %q", sb.State, runtime.StateRunning)
	}
	if sb.Spec.MemoryMB != memoryMB || sb.Spec.DiskSizeMB != diskMB || sb.Spec.CPUCount != cpuCount {
		t.Errorf("Create().Spec = %+v; want the requested resources", sb.Spec)
	}
	if sb.Template == "" || sb.CreatedAt.IsZero() {
		t.Errorf("Create() = %+v; want Template and CreatedAt set", sb)
	}
	// Create returns once envd answers: no retry here.
	if err := health(ctxFor(t), b, sb.ID, Within(5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// testCreateEnvdInit: a create given envd's /init body ends with envd
// initialized by it (the body's variables reach commands); one whose body
// envd refuses fails and leaves nothing.
func testCreateEnvdInit(t *testing.T, b runtime.Backend) {
	sp := spec(NewID())
	sp.EnvdInit = []byte(`{"envVars":{"SANDBOXD_FROM_INIT":"yes"},"timestamp":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}`)
	sb := createSpec(t, b, sp)
	id := sb.ID
	if !sb.EnvdInitialized {
		t.Errorf("Create().EnvdInitialized = false; want true (the backend sends EnvdInit as its probe)")
	}
	if res := mustSh(t, b, id, "user", "echo $SANDBOXD_FROM_INIT"); res.Stdout != "yes\n" {
		t.Errorf("SANDBOXD_FROM_INIT in a command = %q; want the /init body's \"yes\"", res.Stdout)
	}

	bad := NewID()
	sp = spec(bad)
	sp.EnvdInit = []byte(`{`)
	if _, err := b.Create(ctxFor(t), sp); err == nil || !strings.Contains(err.Error(), "400") {
		_ = b.Destroy(context.Background(), bad)
		t.Errorf("Create(refused /init body) = %v; want envd's 400", err)
	}
	assertNoTrace(t, b, bad)
}

func testCreateErrors(t *testing.T, b runtime.Backend) {
	ctx := ctxFor(t)
	sb := create(t, b)
	if _, err := b.Create(ctx, spec(sb.ID)); !errors.Is(err, runtime.ErrAlreadyExists) {
		t.Errorf("Create(existing id) = %v; want ErrAlreadyExists", err)
	}
	mustHealthy(t, b, sb.ID) // the failed duplicate must not hurt the original

	for _, id := range []string{"", "../x", "a/b", "with space", strings.Repeat("x", 64)} {
		if _, err := b.Create(ctx, spec(id)); !errors.Is(err, runtime.ErrInvalidSpec) {
			t.Errorf("Create(id %q) = %v; want ErrInvalidSpec", id, err)
		}
	}
	bad := spec(NewID())
	bad.MemoryMB = -1
	if _, err := b.Create(ctx, bad); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("Create(MemoryMB -1) = %v; want ErrInvalidSpec", err)
	}
	noTpl := spec(NewID())
	noTpl.Template = "no-such-template"
	if _, err := b.Create(ctx, noTpl); !errors.Is(err, runtime.ErrTemplateNotFound) {
		t.Errorf("Create(unknown template) = %v; want ErrTemplateNotFound", err)
	}
	assertNoTrace(t, b, noTpl.ID)

	unknown := NewID()
	if err := b.Pause(ctx, unknown, runtime.PauseMemory); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Pause(unknown) = %v; want ErrNotFound", err)
	}
	if _, err := b.Resume(ctx, unknown); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Resume(unknown) = %v; want ErrNotFound", err)
	}
	if _, err := b.Stats(ctx, unknown); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stats(unknown) = %v; want ErrNotFound", err)
	}
	if c, err := b.Dial(ctx, unknown, runtime.EnvdPort); !errors.Is(err, runtime.ErrNotFound) {
		if c != nil {
			c.Close()
		}
		t.Errorf("Dial(unknown) = %v; want ErrNotFound", err)
	}
	if err := b.Destroy(ctx, unknown); err != nil {
		t.Errorf("Destroy(unknown) = %v; want nil", err)
	}
}

func testCreateCancelled(t *testing.T, b runtime.Backend) {
	ctx, cancel := context.WithCancel(ctxFor(t))
	cancel()
	id := NewID()
	if _, err := b.Create(ctx, spec(id)); err == nil {
		t.Errorf("Create(cancelled ctx) = nil error; want one")
		_ = b.Destroy(context.Background(), id)
	}
	assertNoTrace(t, b, id)

	// A deadline that expires while envd starts: the create is undone.
	ctx, cancel = context.WithTimeout(ctxFor(t), time.Millisecond)
	defer cancel()
	id = NewID()
	if _, err := b.Create(ctx, spec(id)); err == nil {
		_ = b.Destroy(context.Background(), id) // fast machine: it made it
	}
	assertNoTrace(t, b, id)
	l, err := b.List(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 0 {
		t.Errorf("List() after failed creates = %d sandboxes; want 0", len(l))
	}
}

func testDestroyTwice(t *testing.T, b runtime.Backend) {
	ctx := ctxFor(t)
	id := NewID()
	if _, err := b.Create(ctx, spec(id)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := b.Destroy(ctx, id); err != nil {
			t.Fatalf("Destroy #%d = %v; want nil", i+1, err)
		}
	}
	assertNoTrace(t, b, id)
	if _, err := b.Stats(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stats(destroyed) = %v; want ErrNotFound", err)
	}
	if c, err := b.Dial(ctx, id, runtime.EnvdPort); !errors.Is(err, runtime.ErrNotFound) {
		if c != nil {
			c.Close()
		}
		t.Errorf("Dial(destroyed) = %v; want ErrNotFound", err)
	}
	// The id can be used again.
	if _, err := b.Create(ctx, spec(id)); err != nil {
		t.Fatalf("Create(reused id) = %v", err)
	}
	mustHealthy(t, b, id)
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, b, id)
}

// testAlive: a backend that can tell whether a sandbox runs
// (runtime.LivenessChecker) says so through a pause and after a destroy.
func testAlive(t *testing.T, b runtime.Backend) {
	lc, ok := b.(runtime.LivenessChecker)
	if !ok {
		t.Skip("the backend is not a runtime.LivenessChecker")
	}
	ctx := ctxFor(t)
	sb := create(t, b)
	for _, step := range []struct {
		name string
		do   func() error
		want error
	}{
		{"created", func() error { return nil }, nil},
		{"paused", func() error { return b.Pause(ctx, sb.ID, runtime.PauseMemory) }, runtime.ErrPaused},
		{"resumed", func() error { _, err := b.Resume(ctx, sb.ID); return err }, nil},
		{"destroyed", func() error { return b.Destroy(ctx, sb.ID) }, runtime.ErrNotFound},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if err := lc.Alive(ctx, sb.ID); !errors.Is(err, step.want) || (step.want == nil) != (err == nil) {
			t.Errorf("%s: Alive = %v, want %v", step.name, err, step.want)
		}
	}
	if err := lc.Alive(ctx, NewID()); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Alive of an unknown id = %v, want ErrNotFound", err)
	}
}

func testPauseResume(t *testing.T, b runtime.Backend) {
	ctx := ctxFor(t)
	sb := create(t, b)
	// A connection opened before the pause: the request sent while paused
	// gets no answer until Resume.
	conn, err := b.Dial(ctx, sb.ID, runtime.EnvdPort)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	for i := range 2 {
		if err := b.Pause(ctx, sb.ID, runtime.PauseMemory); err != nil {
			t.Fatalf("Pause #%d = %v", i+1, err)
		}
	}
	assertState(t, b, sb.ID, runtime.StatePaused)
	if _, err := io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: envd\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	br := bufio.NewReader(conn)
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("envd answered while paused")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("read while paused: %v; want a timeout", err)
	}
	if err := health(ctx, b, sb.ID, 300*time.Millisecond); err == nil {
		t.Fatal("GET /health succeeded while paused")
	}

	for i := range 2 {
		if _, err := b.Resume(ctx, sb.ID); err != nil {
			t.Fatalf("Resume #%d = %v", i+1, err)
		}
	}
	assertState(t, b, sb.ID, runtime.StateRunning)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("answer after resume: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("queued GET /health = %s; want 204", resp.Status)
	}
	mustHealthy(t, b, sb.ID)

	// A paused sandbox can be destroyed.
	if err := b.Pause(ctx, sb.ID, runtime.PauseMemory); err != nil {
		t.Fatal(err)
	}
	if err := b.Destroy(ctx, sb.ID); err != nil {
		t.Fatalf("Destroy(paused) = %v", err)
	}
	assertNoTrace(t, b, sb.ID)
}

func assertState(t *testing.T, b runtime.Backend, id string, want runtime.State) {
	t.Helper()
	l, err := b.List(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l {
		if s.ID == id {
			if s.State != want {
				t.Errorf("List() state of %s = %q; want %q", id, s.State, want)
			}
			return
		}
	}
	t.Errorf("List() lacks %s", id)
}

func testStats(t *testing.T, b runtime.Backend) {
	ctx := ctxFor(t)
	sb := create(t, b)
	st, err := b.Stats(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryBytes == 0 || st.Pids == 0 || st.CPUTime <= 0 {
		t.Errorf("Stats() = %+v; want memory, pids and CPU time in use", st)
	}
	if got, want := st.MemoryLimitBytes, uint64(memoryMB)<<20; got != want {
		t.Errorf("Stats().MemoryLimitBytes = %d; want %d", got, want)
	}
	if st.CPUCount != cpuCount {
		t.Errorf("Stats().CPUCount = %d; want %d", st.CPUCount, cpuCount)
	}
	if lim := uint64(diskMB) << 20; st.DiskLimitBytes < lim*9/10 || st.DiskLimitBytes > lim*11/10 {
		t.Errorf("Stats().DiskLimitBytes = %d; want about %d", st.DiskLimitBytes, lim)
	}
	if st.PidsLimit == 0 {
		t.Errorf("Stats().PidsLimit = 0; want a limit")
	}

	mustSh(t, b, sb.ID, "user", "head -c 20000000 /dev/zero > /home/user/blob")
	st2, err := b.Stats(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st2.DiskBytes < st.DiskBytes+19_000_000 {
		t.Errorf("Stats().DiskBytes after writing 20 MB = %d, before %d; want +20 MB", st2.DiskBytes, st.DiskBytes)
	}
	if st2.CPUTime <= st.CPUTime {
		t.Errorf("Stats().CPUTime did not grow: %v then %v", st.CPUTime, st2.CPUTime)
	}
}

func ids(l []*runtime.Sandbox) []string {
	var out []string
	for _, s := range l {
		out = append(out, s.ID)
	}
	slices.Sort(out)
	return out
}

func testList(t *testing.T, b runtime.Backend) {
	ctx := ctxFor(t)
	l, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 0 {
		t.Fatalf("List() on a new backend = %v; want none", ids(l))
	}
	x, y := create(t, b), create(t, b)
	want := []string{x.ID, y.ID}
	slices.Sort(want)
	l, err = b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(l); !slices.Equal(got, want) {
		t.Fatalf("List() = %v; want %v", got, want)
	}
	for _, s := range l {
		if s.State != runtime.StateRunning || s.Spec.MemoryMB != memoryMB {
			t.Errorf("List() entry %+v; want running with MemoryMB %d", s, memoryMB)
		}
	}
	if err := b.Destroy(ctx, x.ID); err != nil {
		t.Fatal(err)
	}
	l, err = b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(l); !slices.Equal(got, []string{y.ID}) {
		t.Errorf("List() after Destroy(%s) = %v; want [%s]", x.ID, got, y.ID)
	}
}

func testConcurrency(t *testing.T, b runtime.Backend) {
	const n = 10
	ctx := ctxFor(t)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		made   []string
		failed []error
	)
	for range n {
		wg.Go(func() {
			id := NewID()
			_, err := b.Create(ctx, spec(id))
			if err == nil {
				err = health(ctx, b, id, Within(10*time.Second))
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, fmt.Errorf("%s: %w", id, err))
			}
			made = append(made, id)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, id := range made {
			_ = b.Destroy(context.Background(), id)
		}
	})
	for _, err := range failed {
		t.Errorf("parallel Create: %v", err)
	}
	l, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != n {
		t.Errorf("List() after %d parallel creates = %d sandboxes", n, len(l))
	}
	for _, id := range made {
		wg.Go(func() {
			if err := b.Destroy(ctx, id); err != nil {
				t.Errorf("parallel Destroy(%s) = %v", id, err)
			}
		})
	}
	wg.Wait()
	for _, id := range made {
		assertNoTrace(t, b, id)
	}
}

func testNoLeaks(t *testing.T, b runtime.Backend) {
	ctx := ctxFor(t)
	id := NewID()
	if _, err := b.Create(ctx, spec(id)); err != nil {
		t.Fatal(err)
	}
	// Leave files, a background process and a paused state behind (setsid:
	// envd ends what a command leaves in its session).
	mustSh(t, b, id, "user", "echo x > /home/user/f; mkdir -p /tmp/d; (setsid sleep 600 >/dev/null 2>&1 &)")
	if err := b.Pause(ctx, id, runtime.PauseMemory); err != nil {
		t.Fatal(err)
	}
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, b, id)
}

func testExec(t *testing.T, b runtime.Backend) {
	sb := create(t, b)
	if got := mustSh(t, b, sb.ID, "user", "echo hello; echo err >&2").Stdout; got != "hello\n" {
		t.Errorf("echo hello printed %q", got)
	}
	if got := strings.TrimSpace(mustSh(t, b, sb.ID, "user", "id -u; echo $HOME; pwd").Stdout); got != "1000\n/home/user\n/home/user" {
		t.Errorf("as user: id/HOME/pwd = %q; want 1000, /home/user, /home/user", got)
	}
	if got := strings.TrimSpace(mustSh(t, b, sb.ID, "root", "id -u").Stdout); got != "0" {
		t.Errorf("as root: id -u = %q; want 0", got)
	}
	res, err := sh(ctxFor(t), b, sb.ID, "user", "exit 3")
	if err != nil || res.ExitCode != 3 {
		t.Errorf("exit 3 = %v, %v; want exit code 3", res, err)
	}
	mustSh(t, b, sb.ID, "user", "echo data > /tmp/t && cat /tmp/t && echo home > ~/h && cat ~/h")
	// What an agent's dev box runs, each doing real work under the
	// sandbox's seccomp profile and capabilities, offline. A tool the
	// template lacks (its need fails) is skipped.
	for _, tool := range []struct{ name, need, script string }{
		{"python3", "command -v python3", "python3 -c 'import json,ssl; print(6*7)'"},
		{"node", "command -v node", "node -e 'console.log(6*7)'"},
		{"git", "command -v git", "cd /tmp && git init -q r && cd r && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x && test \"$(git log --oneline | wc -l)\" = 1 && echo 42"},
		{"cc", "command -v cc", "cd /tmp && printf 'int main(void){return 42;}' > t.c && cc -O2 -o t t.c && { ./t; echo $?; }"},
		// npm installs a local package (no registry): its whole install
		// machinery, node's worker threads and libuv's I/O included.
		{"npm", "command -v npm", "mkdir -p /tmp/n/lib /tmp/n/app && cd /tmp/n/lib && npm init -y >/dev/null && echo 'module.exports = 42' > index.js && " +
			"cd ../app && npm init -y >/dev/null && npm install ../lib --offline --no-audit --no-fund >/dev/null && node -e 'console.log(require(\"lib\"))'"},
		// pip installs into a fresh venv from the wheels ensurepip carries.
		{"pip", "python3 -c 'import ensurepip, venv'", "python3 -m venv /tmp/v && /tmp/v/bin/python -m pip --version >/dev/null && /tmp/v/bin/python -c 'import pip; print(42)'"},
	} {
		if res, err := sh(ctxFor(t), b, sb.ID, "user", tool.need); err != nil || res.ExitCode != 0 {
			t.Logf("%s not in the template; skipped", tool.name)
			continue
		}
		res, err := sh(ctxFor(t), b, sb.ID, "user", tool.script)
		if err != nil {
			t.Errorf("%s: %v", tool.name, err)
		} else if got := strings.TrimSpace(res.Stdout); got != "42" || res.ExitCode != 0 {
			t.Errorf("%s: exit %d, printed %q, stderr %q; want 42", tool.name, res.ExitCode, got, res.Stderr)
		}
	}
}

func testDialPort(t *testing.T, b runtime.Backend) {
	sb := create(t, b)
	if !hasCommand(t, b, sb.ID, "python3") {
		t.Skip("needs python3 in the template for a server")
	}
	// setsid: the server outlives its command only in a session of its own.
	mustSh(t, b, sb.ID, "user", "cd /tmp && echo served > index.html && "+
		"(setsid python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 &) && "+
		"for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8123))' 2>/dev/null && exit 0; sleep 0.05; done; exit 1")
	ctx := ctxFor(t)
	c, err := b.Dial(ctx, sb.ID, 8123)
	if errors.Is(err, runtime.ErrUnsupported) {
		t.Skipf("Dial(port) unsupported yet: %v", err)
	}
	if err != nil {
		t.Fatalf("Dial(8123) = %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), "served") {
		t.Errorf("GET through Dial(8123) = %q; want the page", body)
	}
	if _, err := b.Dial(ctx, sb.ID, 8124); err == nil {
		t.Errorf("Dial(closed port) = nil error")
	}
}

func testMemoryLimit(t *testing.T, b runtime.Backend) {
	victim, neighbour := create(t, b), create(t, b)
	// tail keeps the whole "line" of /dev/zero in memory: it grows until
	// the sandbox's memory limit, where the OOM killer must take it and
	// only it.
	res, err := sh(ctxFor(t), b, victim.ID, "user", "exec tail /dev/zero")
	if err != nil {
		t.Fatalf("memory bomb: %v", err)
	}
	if res.ExitCode == 0 || !strings.Contains(res.Status, "kill") {
		t.Errorf("memory bomb ended with %v; want killed", res)
	}
	mustHealthy(t, b, victim.ID)
	mustSh(t, b, victim.ID, "user", "echo alive")
	mustHealthy(t, b, neighbour.ID)
}

func testPidsLimit(t *testing.T, b runtime.Backend) {
	victim, neighbour := create(t, b), create(t, b)
	ctx := ctxFor(t)
	st, err := b.Stats(ctx, victim.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.PidsLimit == 0 || st.PidsLimit > 100000 {
		t.Fatalf("PidsLimit = %d; want a limit below 100000", st.PidsLimit)
	}
	// Start sleepers until fork fails: the bomb must stop at the limit.
	// A sleeper is a subshell blocked opening a FIFO: a fork and no exec,
	// so that a thousand of them start in seconds even where the CPU is
	// emulated (the cgroup VMs: a thousand execs of sleep took over two
	// minutes there). When the shell gives up, its exit trap kills them
	// with the kill builtin (no fork needed), so the sandbox recovers at
	// once.
	script := fmt.Sprintf("f=$(mktemp -u) && mkfifo $f || exit 1; pids=; trap 'kill $pids 2>/dev/null; rm -f $f' EXIT; i=0; "+
		"while [ $i -lt %d ]; do ( read _ < $f ) & pids=\"$pids $!\"; i=$((i+1)); done; echo started $i",
		st.PidsLimit+100)
	bombCtx, cancel := context.WithTimeout(t.Context(), Within(5*time.Minute))
	defer cancel()
	res, err := sh(bombCtx, b, victim.ID, "user", script)
	if err != nil {
		t.Fatalf("fork bomb: %v", err)
	}
	if strings.Contains(res.Stdout, "started") {
		t.Errorf("fork bomb started %d sleepers past pids.max %d: %v", st.PidsLimit+100, st.PidsLimit, res)
	}
	if !strings.Contains(strings.ToLower(res.Stderr), "fork") {
		t.Errorf("fork bomb: %v; want a fork failure", res)
	}
	mustHealthy(t, b, neighbour.ID)
	// Once the sleepers are gone, the sandbox works again.
	deadline := time.Now().Add(Within(30 * time.Second))
	for {
		res, err := sh(ctx, b, victim.ID, "user", "echo alive")
		if err == nil && res.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox did not recover after the fork bomb: %v, %v", res, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	mustHealthy(t, b, victim.ID)
}

func testDiskLimit(t *testing.T, b runtime.Backend) {
	victim, neighbour := create(t, b), create(t, b)
	res, err := sh(ctxFor(t), b, victim.ID, "user",
		fmt.Sprintf("dd if=/dev/zero of=/home/user/fill bs=1M count=%d", diskMB*2))
	if err != nil {
		t.Fatalf("disk fill: %v", err)
	}
	// The write must stop at the limit with a disk-full error: ENOSPC from
	// a size-bounded filesystem (local's tmpfs) or EDQUOT from a quota
	// (btrfs qgroups on Incus); programs treat both as "disk full".
	full := strings.Contains(res.Stderr, "No space left on device") || strings.Contains(res.Stderr, "Disk quota exceeded")
	if res.ExitCode == 0 || !full {
		t.Errorf("filling the disk: %v; want ENOSPC or EDQUOT", res)
	}
	mustHealthy(t, b, neighbour.ID)
	mustHealthy(t, b, victim.ID)
	mustSh(t, b, victim.ID, "user", "rm /home/user/fill && echo ok > /home/user/after && cat /home/user/after")
}

func testHostProcesses(t *testing.T, b runtime.Backend) {
	sb := create(t, b)
	// A host process with a unique argument must not show in the sandbox.
	marker := strconv.Itoa(3000000 + int(time.Now().UnixNano()%1000000))
	proc, err := os.StartProcess("/bin/sleep", []string{"sleep", marker}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Kill(); _, _ = proc.Wait() })
	res := mustSh(t, b, sb.ID, "root",
		"n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo $n; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
	if strings.Contains(res.Stdout, marker) {
		t.Errorf("the sandbox sees host process 'sleep %s'", marker)
	}
	n, _ := strconv.Atoi(strings.SplitN(res.Stdout, "\n", 2)[0])
	if n == 0 || n > 20 {
		t.Errorf("the sandbox sees %d processes; want only its own few", n)
	}
	if !strings.Contains(mustSh(t, b, sb.ID, "root", "cat /proc/1/cmdline").Stdout, "envd") {
		t.Errorf("PID 1 in the sandbox is not envd")
	}
}

func testHostFiles(t *testing.T, b runtime.Backend) {
	sb := create(t, b)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host-secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{secret, filepath.Dir(secret)} {
		res, err := sh(ctxFor(t), b, sb.ID, "root", "cat "+p+" || ls "+p)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || strings.Contains(res.Stdout, "host-secret") {
			t.Errorf("the sandbox reads host path %s: %v", p, res)
		}
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(mustSh(t, b, sb.ID, "root", "hostname").Stdout); got == host {
		t.Errorf("the sandbox has the host's hostname %q", got)
	}
}

func testHostLoopback(t *testing.T, b runtime.Backend) {
	sb := create(t, b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() { // exits when ln is closed
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	var script string
	switch {
	case hasCommand(t, b, sb.ID, "python3"):
		script = fmt.Sprintf("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", %d), timeout=2)'", port)
	case hasCommand(t, b, sb.ID, "bash"):
		script = fmt.Sprintf("exec bash -c 'echo > /dev/tcp/127.0.0.1/%d'", port)
	default:
		t.Skip("needs python3 or bash in the template for a TCP client")
	}
	res, err := sh(ctxFor(t), b, sb.ID, "root", script)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode == 0 {
		t.Errorf("the sandbox connected to the host's 127.0.0.1:%d: %v", port, res)
	}
	select {
	case <-accepted:
		t.Errorf("the host's loopback listener accepted a connection from the sandbox")
	case <-time.After(100 * time.Millisecond):
	}
	// Only loopback: no other interface to reach anything through.
	ifs := mustSh(t, b, sb.ID, "root", "ls /sys/class/net").Stdout
	if strings.TrimSpace(ifs) != "lo" {
		t.Logf("interfaces in the sandbox: %q", ifs) // egress backends add one
	}
}

func testMount(t *testing.T, b runtime.Backend) {
	sb := create(t, b)
	for _, script := range []string{
		"mount -t tmpfs none /mnt",
		"mount --bind /tmp /mnt",
		"mount -o remount,rw /usr",
		"mount -t proc proc /mnt",
	} {
		res, err := sh(ctxFor(t), b, sb.ID, "root", script)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			t.Errorf("as root, %q succeeded", script)
		}
	}
}

const capSysAdmin = 21

// testCapabilities: no one in a sandbox has CAP_SYS_ADMIN, neither root
// nor user, nor user through a setuid root program (sudo, where the
// template has it: setuid works in sandboxes, as in E2B's, since what it
// gives is root inside; the backends' own tests check that it does).
func testCapabilities(t *testing.T, b runtime.Backend) {
	sb := create(t, b)
	const status = "grep -E '^(CapEff|CapBnd):' /proc/self/status"
	check := []struct{ who, user, script string }{
		{"root", "root", status},
		{"user", "user", status},
	}
	// Where sudo works (not in a host view, whose /usr is nosuid).
	if res := mustSh(t, b, sb.ID, "user", "sudo -n id -u 2>/dev/null || true"); strings.TrimSpace(res.Stdout) == "0" {
		check = append(check, struct{ who, user, script string }{"user with sudo", "user", "sudo -n " + status})
	}
	for _, c := range check {
		res := mustSh(t, b, sb.ID, c.user, c.script)
		fields := map[string]string{}
		for line := range strings.SplitSeq(strings.TrimSpace(res.Stdout), "\n") {
			k, v, _ := strings.Cut(line, ":")
			fields[k] = strings.TrimSpace(v)
		}
		for _, k := range []string{"CapEff", "CapBnd"} {
			v, err := strconv.ParseUint(fields[k], 16, 64)
			if err != nil {
				t.Fatalf("as %s: %s = %q: %v", c.who, k, fields[k], err)
			}
			if v&(1<<capSysAdmin) != 0 {
				t.Errorf("as %s: %s = %s has CAP_SYS_ADMIN", c.who, k, fields[k])
			}
		}
	}
}

func testTemplate(t *testing.T, b runtime.Backend) {
	x, y := create(t, b), create(t, b)
	// Root may write /usr (E2B's sandboxes let it install packages) or
	// not (a backend that shows it read-only), but never into the
	// template: another sandbox does not see it.
	for _, p := range []string{"/usr/bin/sandboxd-test", "/usr/sandboxd-test"} {
		if _, err := sh(ctxFor(t), b, x.ID, "root", "touch "+p); err != nil {
			t.Fatal(err)
		}
	}
	// Writable paths are per sandbox: what x writes, y does not see.
	mustSh(t, b, x.ID, "root", "echo x > /etc/sandboxd-marker && echo x > /tmp/sandboxd-marker && echo x > /home/user/sandboxd-marker")
	res := mustSh(t, b, y.ID, "root", "ls /etc/sandboxd-marker /tmp/sandboxd-marker /home/user/sandboxd-marker /usr/bin/sandboxd-test /usr/sandboxd-test 2>/dev/null; true")
	if strings.TrimSpace(res.Stdout) != "" {
		t.Errorf("sandbox %s sees files written by %s: %q", y.ID, x.ID, res.Stdout)
	}
}

// testFork: a fork starts with the source's files as they were at the fork
// (a file written by the user, a deletion of a template file), then the two
// diverge; forking a missing sandbox fails with ErrNotFound and leaves
// nothing; a failed fork leaves nothing either.
func testFork(t *testing.T, b runtime.Backend) {
	ctx := ctxFor(t)
	src := create(t, b)
	mustSh(t, b, src.ID, "user", "echo before > ~/f && mkdir -p ~/d/e && echo deep > ~/d/e/g")
	mustSh(t, b, src.ID, "root", "rm /etc/hostname 2>/dev/null; echo root-only > /root/r")

	sp := spec(NewID())
	sp.ForkOf = src.ID
	fork := createSpec(t, b, sp)
	if fork.Spec.ForkOf != "" {
		t.Errorf("the kept spec has ForkOf %q: it is for the create only", fork.Spec.ForkOf)
	}
	if got := strings.TrimSpace(mustSh(t, b, fork.ID, "user", "cat ~/f ~/d/e/g; id -un; stat -c %U ~/f").Stdout); got != "before\ndeep\nuser\nuser" {
		t.Errorf("fork sees %q, want the source's files owned by user", got)
	}
	if got := strings.TrimSpace(mustSh(t, b, fork.ID, "root", "cat /root/r; test -e /etc/hostname && echo present || echo deleted").Stdout); got != "root-only\ndeleted" {
		t.Errorf("fork sees %q, want root's file and the deletion", got)
	}
	mustSh(t, b, src.ID, "user", "echo after > ~/f")
	mustSh(t, b, fork.ID, "user", "echo fork > ~/only-fork")
	if got := strings.TrimSpace(mustSh(t, b, fork.ID, "user", "cat ~/f").Stdout); got != "before" {
		t.Errorf("fork's file after the source wrote: %q, want before", got)
	}
	if got := strings.TrimSpace(mustSh(t, b, src.ID, "user", "cat ~/f; test -e ~/only-fork && echo leaked || echo apart").Stdout); got != "after\napart" {
		t.Errorf("source after the fork wrote: %q", got)
	}
	mustHealthy(t, b, src.ID)

	missing := spec(NewID())
	missing.ForkOf = NewID()
	if _, err := b.Create(ctx, missing); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("fork of a missing sandbox: %v, want ErrNotFound", err)
	}
	assertNoTrace(t, b, missing.ID)
}
