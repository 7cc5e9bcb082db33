package runtimetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
)

// RunRestart runs the tests that need a restart of sandboxd: both kinds of
// pause must survive one. open returns a fresh backend holding no
// sandboxes, and reopen, which returns another Backend value on the same
// state, as a new sandboxd process would make (the first one is forgotten,
// not closed). Both register their cleanup with t.Cleanup.
func RunRestart(t *testing.T, open func(t *testing.T) (b runtime.Backend, reopen func(t *testing.T) runtime.Backend)) {
	for _, kind := range []runtime.PauseKind{runtime.PauseMemory, runtime.PauseDisk} {
		t.Run("Pause/"+kind.String(), func(t *testing.T) {
			b, reopen := open(t)
			testPauseRestart(t, b, reopen, kind)
		})
	}
}

// The layer checks: a file with owner, mode, setuid bit, an xattr, a
// symlink and a hard link to it; a sparse file far larger than the disk
// that must stay sparse; a deleted file of the template (a
// whiteout in the upper layer); a directory of the template removed and
// made again (an opaque directory). Deleting prefers a template file that
// exists; the base template has /etc/hostname.
const (
	layerWrite = `set -e
mkdir -p /root/t
printf 'hello\n' > /root/t/kept
chown 1000:1000 /root/t/kept
chmod 0640 /root/t/kept
printf '#!/bin/sh\n' > /root/t/suid
chmod 4750 /root/t/suid
ln -s kept /root/t/link
ln /root/t/kept /root/t/hard
truncate -s 4G /root/t/sparse
printf 'tail' >> /root/t/sparse
if command -v setfattr >/dev/null && setfattr -n user.sbx -v v1 /root/t/kept 2>/dev/null; then
  touch /root/t/has-xattr
fi
for f in /etc/hostname /etc/issue /etc/motd; do
  if [ -f "$f" ]; then rm "$f"; echo "$f" > /root/t/deleted; break; fi
done
rm -rf /home
mkdir /home
touch /home/fresh
`
	layerCheck = `set -ex
test "$(cat /root/t/kept)" = hello
test "$(stat -c '%a %u %g' /root/t/kept)" = "640 1000 1000"
test "$(stat -c '%a' /root/t/suid)" = 4750
test "$(readlink /root/t/link)" = kept
test "$(stat -c %i /root/t/kept)" = "$(stat -c %i /root/t/hard)"
test "$(stat -c %s /root/t/sparse)" = 4294967300
test "$(du -k /root/t/sparse | cut -f1)" -lt 1024
test "$(tail -c 4 /root/t/sparse)" = tail
if [ -e /root/t/has-xattr ]; then
  test "$(getfattr --absolute-names --only-values -n user.sbx /root/t/kept)" = v1
fi
if [ -e /root/t/deleted ]; then
  test ! -e "$(cat /root/t/deleted)"
fi
test "$(ls -A /home)" = fresh
echo ok
`
)

func testPauseRestart(t *testing.T, b runtime.Backend, reopen func(t *testing.T) runtime.Backend, kind runtime.PauseKind) {
	ctx := ctxFor(t)
	id := NewID()
	if _, err := b.Create(ctx, spec(id)); err != nil {
		t.Fatalf("Create(%s) = %v", id, err)
	}
	cleanupWith := b
	t.Cleanup(func() {
		if err := cleanupWith.Destroy(context.Background(), id); err != nil {
			t.Errorf("cleanup: Destroy(%s) = %v", id, err)
		}
		assertNoTrace(t, cleanupWith, id)
	})
	mustSh(t, b, id, "root", layerWrite)

	err := b.Pause(ctx, id, kind)
	if kind == runtime.PauseDisk && errors.Is(err, runtime.ErrUnsupported) {
		t.Skipf("backend does not pause to disk: %v", err)
	}
	if err != nil {
		t.Fatalf("Pause(%s) = %v", kind, err)
	}
	if err := b.Pause(ctx, id, kind); err != nil {
		t.Fatalf("second Pause(%s) = %v", kind, err)
	}
	assertState(t, b, id, runtime.StatePaused)
	assertOnDisk(t, b, id, kind == runtime.PauseDisk)
	if kind == runtime.PauseDisk {
		assertStopped(t, id)
	}

	b2 := reopen(t)
	cleanupWith = b2
	assertState(t, b2, id, runtime.StatePaused)
	assertOnDisk(t, b2, id, kind == runtime.PauseDisk)
	if kind == runtime.PauseDisk {
		assertStopped(t, id) // the new backend's adoption started nothing
	}
	if _, err := b2.Dial(ctx, id, runtime.EnvdPort); !errors.Is(err, runtime.ErrPaused) {
		t.Errorf("Dial(paused) = %v; want ErrPaused", err)
	}
	restarted, err := b2.Resume(ctx, id)
	if err != nil {
		t.Fatalf("Resume after restart = %v", err)
	}
	if want := kind == runtime.PauseDisk; restarted != want {
		t.Errorf("Resume() restarted = %v; want %v", restarted, want)
	}
	assertState(t, b2, id, runtime.StateRunning)
	assertOnDisk(t, b2, id, false)
	mustHealthy(t, b2, id)
	if res := mustSh(t, b2, id, "root", layerCheck); res.Stdout != "ok\n" {
		t.Errorf("layer after resume: %v", res)
	}
	// It runs on as any sandbox: it writes, and pauses again.
	mustSh(t, b2, id, "root", "echo more > /root/t/more")
	if err := b2.Pause(ctx, id, kind); err != nil {
		t.Fatalf("Pause again = %v", err)
	}
	if _, err := b2.Resume(ctx, id); err != nil {
		t.Fatalf("Resume again = %v", err)
	}
	mustSh(t, b2, id, "root", `test "$(cat /root/t/more)" = more`)

	// A sandbox paused (to disk: with its saved layer) can be destroyed.
	if err := b2.Pause(ctx, id, kind); err != nil {
		t.Fatal(err)
	}
	if err := b2.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy(paused) = %v", err)
	}
	assertNoTrace(t, b2, id)
}

// assertStopped checks that nothing of sandbox id runs: no cgroup named
// after it (so no memory charged to it) and no process in one.
func assertStopped(t *testing.T, id string) {
	t.Helper()
	for _, p := range cgroupDirsNamed(id) {
		t.Errorf("cgroup of sandbox %s paused to disk: %s", id, p)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		for line := range strings.SplitSeq(string(raw), "\n") {
			if strings.HasSuffix(line, "/"+id) || strings.Contains(line, "/"+id+"/") {
				t.Errorf("process %s of sandbox %s paused to disk: %s", filepath.Dir(p), id, line)
				break
			}
		}
	}
}

// assertOnDisk checks List's OnDisk for id: the Manager's host budget
// leaves sandboxes paused to disk out by it.
func assertOnDisk(t *testing.T, b runtime.Backend, id string, want bool) {
	t.Helper()
	l, err := b.List(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l {
		if s.ID == id && s.OnDisk != want {
			t.Errorf("List() OnDisk of %s = %v; want %v", id, s.OnDisk, want)
		}
	}
}
