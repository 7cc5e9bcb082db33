package local_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// openTracking opens a backend of e that tracks writers in user namespace
// mode m.
func (e testEnv) openTracking(t *testing.T, m local.UserNSMode) *local.Backend {
	t.Helper()
	opts := e.modeOptions(t, m)
	opts.TrackWriters = true
	b, err := local.New(context.Background(), opts)
	skipWithoutUserNS(t, m, err)
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	return b
}

// closeOnce closes b at the end of t unless t closed it: a test that
// checks what Close leaves closes it itself.
func closeOnce(t *testing.T, b *local.Backend) func() error {
	var once sync.Once
	var err error
	closeB := func() error {
		once.Do(func() { err = b.Close() })
		return err
	}
	t.Cleanup(func() { _ = closeB() })
	return closeB
}

// skipWithoutFanotify skips t when the kernel refused the fanotify flags
// writer tracking needs (as a Debian kernel before 5.17 would), and only
// then.
func skipWithoutFanotify(t *testing.T, b *local.Backend) {
	t.Helper()
	if err := b.WriterTracking(); errors.Is(err, local.ErrWritersUnsupported) {
		t.Skipf("kernel refuses writer tracking: %v", err)
	} else if err != nil {
		t.Fatalf("writer tracking: %v", err)
	}
}

func envdClient(b runtime.Backend, id, user string) *envdconn.Client {
	return envdconn.NewClient(func(ctx context.Context) (net.Conn, error) { return b.Dial(ctx, id, runtime.EnvdPort) }, "", user)
}

// startUntil starts cmd through envd in sandbox id as root and returns its
// pid once it printed "ready"; it runs on until the sandbox ends.
func startUntil(t *testing.T, b runtime.Backend, id string, cmd envdconn.Command) uint32 {
	t.Helper()
	c := envdClient(b, id, "root")
	t.Cleanup(c.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	o, err := c.StartOutput(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		var out bytes.Buffer
		said := false
		x, err := o.Follow(func(stdout, stderr []byte) {
			out.Write(stdout)
			out.Write(stderr)
			if !said && bytes.Contains(out.Bytes(), []byte("ready\n")) {
				close(ready)
				said = true
			}
		})
		ended <- fmt.Errorf("%s ended: %v %v, output %q", cmd.Cmd, x, err, out.String())
	}()
	select {
	case <-ready:
	case err := <-ended:
		t.Fatal(err)
	}
	return o.Pid
}

// upload writes data to path in sandbox id through envd's /files.
func upload(t *testing.T, b runtime.Backend, id, path, data string) {
	t.Helper()
	c := envdClient(b, id, "root")
	defer c.Close()
	resp, err := c.Files(t.Context(), http.MethodPost, path, strings.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload %s: %s %s", path, resp.Status, body)
	}
}

// changesOf returns sandbox id's changes, as listed and by path.
func changesOf(t *testing.T, b *local.Backend, id string) ([]runtime.Change, map[string]runtime.Change) {
	t.Helper()
	chs, err := b.Changes(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]runtime.Change{}
	for _, c := range chs {
		got[c.Path] = c
	}
	return chs, got
}

func changesByPath(t *testing.T, b *local.Backend, id string) map[string]runtime.Change {
	t.Helper()
	_, got := changesOf(t, b, id)
	return got
}

// wantWriter is what a test expects of a change's writer.
type wantWriter struct {
	path    string
	comm    string // "": no writer
	pid     int    // 0: any but the envd command's
	envdPID int
	command string // a part of it
}

func checkWriters(t *testing.T, got map[string]runtime.Change, want []wantWriter) {
	t.Helper()
	for _, w := range want {
		c, ok := got[w.path]
		if !ok {
			t.Errorf("%s: not among the changes", w.path)
			continue
		}
		switch {
		case w.comm == "" && c.Writer != nil:
			t.Errorf("%s (%s): writer %+v, want none", w.path, c.Kind, *c.Writer)
		case w.comm == "":
		case c.Writer == nil:
			t.Errorf("%s (%s): no writer, want %s", w.path, c.Kind, w.comm)
		case c.Writer.Comm != w.comm || c.Writer.EnvdPID != w.envdPID || !strings.Contains(c.Writer.Command, w.command) ||
			(w.pid != 0 && c.Writer.PID != w.pid) || (w.pid == 0 && (c.Writer.PID == w.envdPID || c.Writer.PID <= 1)):
			t.Errorf("%s: writer %+v, want comm %s pid %d envd pid %d, command with %q", w.path, *c.Writer, w.comm, w.pid, w.envdPID, w.command)
		}
	}
}

// TestWriters: each change names the process that wrote it: a shell envd
// started, a Python process that shell started (the same envd command),
// envd itself for an upload; a deletion names none. A rename of the
// directory above keeps the writer. The record survives pauses in memory
// and to disk, tracking goes on after each resume and after a restart of
// the backend (which forgets the writers), and nothing is left: no mark
// once the sandbox is paused or gone, no fanotify fd or reader once the
// backend is closed.
func TestWriters(t *testing.T) {
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			env := newEnv(t)
			b := env.openTracking(t, m)
			closeB := closeOnce(t, b)
			id := mustCreate(t, b, runtime.Spec{})
			t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
			skipWithoutFanotify(t, b)

			const py = `import os, sys, time
os.makedirs("/home/user/pydir")
with open("/home/user/pydir/f", "w") as f: f.write("py")
os.rename("/home/user/pydir", "/home/user/pydir2")
print("ready", flush=True)
time.sleep(3600)`
			// The shell writes, then starts Python and waits: both live
			// on, so /proc has them whenever their events are read.
			shPid := int(startUntil(t, b, id, envdconn.Command{Cmd: "/bin/sh", Args: []string{"-c",
				`echo sh > /home/user/by-sh; echo more >> /etc/hostname; python3 -c '` + py + `' & wait; :`}}))
			upload(t, b, id, "/home/user/by-envd", "envd")
			if res, err := runtimetest.Exec(t.Context(), b, id, "root", "/bin/rm", "/etc/hosts"); err != nil || res.ExitCode != 0 {
				t.Fatalf("rm: %v %v", res, err)
			}
			want := []wantWriter{
				{path: "/home/user/by-sh", comm: "sh", pid: shPid, envdPID: shPid, command: "echo sh >"},
				{path: "/etc/hostname", comm: "sh", pid: shPid, envdPID: shPid, command: "echo sh >"},
				{path: "/home/user/pydir2", comm: "python3", envdPID: shPid, command: "python3 -c"},
				{path: "/home/user/pydir2/f", comm: "python3", envdPID: shPid, command: "python3 -c"},
				{path: "/home/user/by-envd", comm: "envd", pid: 1, envdPID: 0, command: "/opt/sandboxd/envd"},
				{path: "/etc/hosts"}, // deleted
			}
			got := changesByPath(t, b, id)
			checkWriters(t, got, want)
			if c := got["/etc/hosts"]; c.Kind != runtime.ChangeDeleted {
				t.Errorf("/etc/hosts: %+v, want deleted", c)
			}
			pyPid := 0
			if w := got["/home/user/pydir2/f"].Writer; w != nil {
				pyPid = w.PID
			}
			assertMarks(t, b, 1)
			if tr, err := b.WritersTruncated(t.Context(), id); err != nil || tr {
				t.Errorf("WritersTruncated = %v, %v", tr, err)
			}

			// Paused in memory: untracked, the record kept; tracked again
			// after the resume.
			if err := b.Pause(t.Context(), id, runtime.PauseMemory); err != nil {
				t.Fatal(err)
			}
			assertMarks(t, b, 0)
			checkWriters(t, changesByPath(t, b, id), want)
			if _, err := b.Resume(t.Context(), id); err != nil {
				t.Fatal(err)
			}
			assertMarks(t, b, 1)
			upload(t, b, id, "/home/user/after-memory", "x")
			want = append(want, wantWriter{path: "/home/user/after-memory", comm: "envd", pid: 1, command: "envd"})
			checkWriters(t, changesByPath(t, b, id), want)

			// Paused to disk: its processes end, their writers stay.
			if err := b.Pause(t.Context(), id, runtime.PauseDisk); err != nil {
				t.Fatal(err)
			}
			assertMarks(t, b, 0)
			for i := range want {
				if want[i].comm == "python3" {
					want[i].pid = pyPid
				}
			}
			checkWriters(t, changesByPath(t, b, id), want)
			if _, err := b.Resume(t.Context(), id); err != nil {
				t.Fatal(err)
			}
			assertMarks(t, b, 1)
			checkWriters(t, changesByPath(t, b, id), want)
			upload(t, b, id, "/home/user/after-disk", "x")
			// A file of before the pause, written again after it.
			upload(t, b, id, "/home/user/by-sh", "envd now")
			want = append(want, wantWriter{path: "/home/user/after-disk", comm: "envd", pid: 1, command: "envd"})
			want[0] = wantWriter{path: "/home/user/by-sh", comm: "envd", pid: 1, command: "envd"}
			checkWriters(t, changesByPath(t, b, id), want)

			// A restart of sandboxd: the writers it kept are lost, the
			// adopted sandbox is tracked again.
			if err := closeB(); err != nil {
				t.Fatal(err)
			}
			assertNoTracker(t)
			b = env.openTracking(t, m)
			closeB = closeOnce(t, b)
			assertMarks(t, b, 1)
			for i := range want {
				want[i] = wantWriter{path: want[i].path}
			}
			checkWriters(t, changesByPath(t, b, id), want)
			upload(t, b, id, "/home/user/after-restart", "x")
			want = append(want, wantWriter{path: "/home/user/after-restart", comm: "envd", pid: 1, command: "envd"})
			checkWriters(t, changesByPath(t, b, id), want)

			if err := b.Destroy(t.Context(), id); err != nil {
				t.Fatal(err)
			}
			assertMarks(t, b, 0)
			if err := closeB(); err != nil {
				t.Fatal(err)
			}
			assertNoTracker(t)
		})
	}
}

// TestWritersTruncated: past its bound a sandbox's record takes no new
// path and says it is truncated.
func TestWritersTruncated(t *testing.T) {
	b := newEnv(t).openTracking(t, local.UserNSAuto)
	closeOnce(t, b)
	local.SetMaxWriterPaths(t, 3)
	id := mustCreate(t, b, runtime.Spec{})
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	skipWithoutFanotify(t, b)
	// Its writes before (TestWriters has WritersTruncated false for a
	// record under its bound) and these: more inodes than 3.
	for i := range 5 {
		upload(t, b, id, fmt.Sprintf("/home/user/f%d", i), "x")
	}
	got := changesByPath(t, b, id)
	if tr, err := b.WritersTruncated(t.Context(), id); err != nil || !tr {
		t.Errorf("WritersTruncated = %v, %v past the bound; want true", tr, err)
	}
	n := 0
	for _, c := range got {
		if c.Writer != nil {
			n++
		}
	}
	if n > 3 {
		t.Errorf("%d changes have a writer; the record holds at most 3", n)
	}
}

func assertMarks(t *testing.T, b *local.Backend, want int) {
	t.Helper()
	if n, err := b.WriterMarks(); err != nil || n != want {
		t.Errorf("fanotify marks: %d, %v; want %d", n, err, want)
	}
}

// assertNoTracker checks that no fanotify group is open in this process
// and that no goroutine reads one.
func assertNoTracker(t *testing.T) {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if l, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); l == "anon_inode:[fanotify]" {
			t.Errorf("fd %s is a fanotify group, left open", fd.Name())
		}
	}
	buf := make([]byte, 1<<20)
	stacks := string(buf[:goruntime.Stack(buf, true)])
	if strings.Contains(stacks, "writerTracker).read") {
		t.Errorf("the writer tracker's reader still runs:\n%s", stacks)
	}
}

// BenchmarkWriterTracking measures what tracking writers costs the
// sandbox's writes: 10,000 small files (an echo each, no fork, in a
// shell loop) and one 256 MiB file, in a sandbox of a backend without and
// one with tracking. Each iteration runs the workload in both, in
// alternating order, so that a shared machine's load falls on both alike;
// the times are inside the sandbox (no envd round trip), and
// tracked/untracked is the median of the iterations' ratios.
func BenchmarkWriterTracking(b *testing.B) {
	type sbx struct {
		be *local.Backend
		id string
	}
	var sandboxes [2]sbx // untracked, tracked
	for i, track := range []bool{false, true} {
		opts := newEnv(b).options(b)
		opts.TrackWriters = track
		be, err := local.New(context.Background(), opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = be.Close() })
		id := mustCreate(b, be, runtime.Spec{MemoryMB: 1024, DiskSizeMB: 1024})
		b.Cleanup(func() { _ = be.Destroy(context.Background(), id) })
		if err := be.WriterTracking(); track && err != nil {
			b.Skipf("writers are not tracked: %v", err)
		}
		sandboxes[i] = sbx{be, id}
	}
	// timed runs script in s and returns how long it took inside.
	timed := func(b *testing.B, s sbx, script string) time.Duration {
		res, err := runtimetest.Exec(context.Background(), s.be, s.id, "root", "/bin/sh", "-c",
			`s=$(date +%s%N); `+script+`; e=$(date +%s%N); echo $((e-s))`)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%v %v", res, err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(res.Stdout), 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		if res, err := runtimetest.Exec(context.Background(), s.be, s.id, "root", "/bin/rm", "-rf", "/tmp/w"); err != nil || res.ExitCode != 0 {
			b.Fatalf("%v %v", res, err)
		}
		return time.Duration(ns)
	}
	for _, w := range []struct{ name, script string }{
		{"small", `mkdir /tmp/w && cd /tmp/w && i=0; while [ $i -lt 10000 ]; do echo x > f$i; i=$((i+1)); done`},
		{"large", `dd if=/dev/zero of=/tmp/w bs=1M count=256 status=none`},
	} {
		b.Run(w.name, func(b *testing.B) {
			var sum [2]time.Duration
			var ratios []float64
			n := 0
			for b.Loop() {
				var d [2]time.Duration
				for _, i := range [][2]int{{0, 1}, {1, 0}}[n%2] {
					d[i] = timed(b, sandboxes[i], w.script)
					sum[i] += d[i]
				}
				ratios = append(ratios, float64(d[1])/float64(d[0]))
				n++
			}
			slices.Sort(ratios)
			b.ReportMetric(float64(sum[0].Milliseconds())/float64(n), "untracked-ms")
			b.ReportMetric(float64(sum[1].Milliseconds())/float64(n), "tracked-ms")
			b.ReportMetric(ratios[len(ratios)/2], "tracked/untracked")
		})
	}
}
