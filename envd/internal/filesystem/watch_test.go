package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
	"github.com/sandboxd/sandboxd/envd/internal/keepalive"
)

const (
	evCreate = filesystem.EventType_EVENT_TYPE_CREATE
	evWrite  = filesystem.EventType_EVENT_TYPE_WRITE
	evRemove = filesystem.EventType_EVENT_TYPE_REMOVE
	evRename = filesystem.EventType_EVENT_TYPE_RENAME
	evChmod  = filesystem.EventType_EVENT_TYPE_CHMOD
)

// watchStream is an open WatchDir stream past its start event.
type watchStream struct {
	t          *testing.T
	st         *connect.ServerStreamForClient[filesystem.WatchDirResponse]
	cancel     context.CancelFunc
	keepalives int
}

func openWatch(t *testing.T, e *env, msg *filesystem.WatchDirRequest, header map[string]string) *watchStream {
	t.Helper()
	ctx, cancel := context.WithCancel(testCtx(t))
	r := request(msg, "root")
	for k, v := range header {
		r.Header().Set(k, v)
	}
	st, err := e.client.WatchDir(ctx, r)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); st.Close() })
	if !st.Receive() {
		t.Fatalf("WatchDir(%s): no start event: %v", msg.GetPath(), st.Err())
	}
	if st.Msg().GetStart() == nil {
		t.Fatalf("WatchDir(%s): first message %v; want start", msg.GetPath(), st.Msg())
	}
	return &watchStream{t: t, st: st, cancel: cancel}
}

// next returns the next filesystem event, counting keepalives it skips.
func (w *watchStream) next() *filesystem.FilesystemEvent {
	w.t.Helper()
	for w.st.Receive() {
		if ev := w.st.Msg().GetFilesystem(); ev != nil {
			return ev
		}
		if w.st.Msg().GetKeepalive() != nil {
			w.keepalives++
			continue
		}
		w.t.Fatalf("unexpected message %v", w.st.Msg())
	}
	w.t.Fatalf("stream ended: %v", w.st.Err())
	return nil
}

// until returns the events up to and including the first one named name of
// type typ.
func (w *watchStream) until(name string, typ filesystem.EventType) []*filesystem.FilesystemEvent {
	w.t.Helper()
	var seen []*filesystem.FilesystemEvent
	for {
		ev := w.next()
		seen = append(seen, ev)
		if ev.GetName() == name && ev.GetType() == typ {
			return seen
		}
	}
}

// mark creates a file named marker in dir and returns every event up to its
// creation. inotify reports a watch's events in order, so a change made
// before the marker that was going to be reported is in the result; this is
// how the tests show that something is not reported, without sleeping.
func (w *watchStream) mark(dir, marker string) []*filesystem.FilesystemEvent {
	w.t.Helper()
	writeFile(w.t, filepath.Join(dir, marker), "")
	return w.until(marker, evCreate)
}

func find(evs []*filesystem.FilesystemEvent, name string, typ filesystem.EventType) *filesystem.FilesystemEvent {
	for _, ev := range evs {
		if ev.GetName() == name && ev.GetType() == typ {
			return ev
		}
	}
	return nil
}

func describe(evs []*filesystem.FilesystemEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, fmt.Sprintf("%s:%s", strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_"), ev.GetName()))
	}
	return out
}

func TestWatchDir(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := tempDir(t)
	writeFile(t, filepath.Join(dir, "f.txt"), "old")
	writeFile(t, filepath.Join(dir, "sub", "nested.txt"), "old")

	w := openWatch(t, e, &filesystem.WatchDirRequest{Path: dir}, nil)

	writeFile(t, filepath.Join(dir, "f.txt"), "new")
	if ev := w.until("f.txt", evWrite)[0]; ev.GetEntry() != nil {
		t.Errorf("entry without include_entry: %v", ev.GetEntry())
	}
	writeFile(t, filepath.Join(dir, "n"), "x")
	w.until("n", evCreate)
	if err := os.Chmod(filepath.Join(dir, "n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.until("n", evChmod)
	if err := os.Rename(filepath.Join(dir, "n"), filepath.Join(dir, "m")); err != nil {
		t.Fatal(err)
	}
	w.until("n", evRename)
	w.until("m", evCreate)
	if err := os.Remove(filepath.Join(dir, "m")); err != nil {
		t.Fatal(err)
	}
	w.until("m", evRemove)

	// Not recursive: a change in a subdirectory is not reported.
	writeFile(t, filepath.Join(dir, "sub", "nested.txt"), "new")
	for _, ev := range w.mark(dir, "marker") {
		if strings.HasPrefix(ev.GetName(), "sub/") {
			t.Errorf("non-recursive watch reported %s %s", ev.GetType(), ev.GetName())
		}
	}

	// The watched directory itself going away is reported as ".".
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	w.until(".", evRemove)
}

func TestWatchDirIncludeEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := tempDir(t)
	w := openWatch(t, e, &filesystem.WatchDirRequest{Path: dir, IncludeEntry: true}, nil)

	writeFile(t, filepath.Join(dir, "f.txt"), "content")
	evs := w.until("f.txt", evWrite)
	for _, typ := range []filesystem.EventType{evCreate, evWrite} {
		ev := find(evs, "f.txt", typ)
		if ev == nil {
			t.Fatalf("no %v event in %q", typ, describe(evs))
		}
		en := ev.GetEntry()
		if en.GetPath() != filepath.Join(dir, "f.txt") || en.GetName() != "f.txt" || en.GetType() != filesystem.FileType_FILE_TYPE_FILE {
			t.Errorf("%v entry = %v; want file %s", typ, en, filepath.Join(dir, "f.txt"))
		}
	}
	// Remove and rename never carry an entry, even when the name exists
	// again by the time the event is handled.
	if err := os.Rename(filepath.Join(dir, "f.txt"), filepath.Join(dir, "g.txt")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "f.txt"), "again")
	if err := os.Remove(filepath.Join(dir, "g.txt")); err != nil {
		t.Fatal(err)
	}
	evs = w.until("g.txt", evRemove)
	for _, ev := range evs {
		if (ev.GetType() == evRename || ev.GetType() == evRemove) && ev.GetEntry() != nil {
			t.Errorf("%v %s carries an entry", ev.GetType(), ev.GetName())
		}
	}
}

func TestWatchDirRecursive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := tempDir(t)
	outside := tempDir(t)
	writeFile(t, filepath.Join(dir, "nested", "f.txt"), "old")

	w := openWatch(t, e, &filesystem.WatchDirRequest{Path: dir, Recursive: true}, nil)

	// An existing subdirectory.
	writeFile(t, filepath.Join(dir, "nested", "f.txt"), "new")
	w.until("nested/f.txt", evWrite)

	// A subdirectory created after the watch started, as in E2B's SDK test:
	// once its CREATE is seen, changes inside it are reported.
	if err := os.Mkdir(filepath.Join(dir, "later"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.until("later", evCreate)
	writeFile(t, filepath.Join(dir, "later", "f.txt"), "x")
	w.until("later/f.txt", evWrite)

	// mkdir -p: the inner directories exist before any watch on them.
	writeFile(t, filepath.Join(dir, "a", "b", "c", "deep.txt"), "x")
	w.until("a/b/c/deep.txt", evCreate)
	writeFile(t, filepath.Join(dir, "a", "b", "c", "deep.txt"), "y")
	w.until("a/b/c/deep.txt", evWrite)

	// A subdirectory renamed inside the tree is watched under its new name.
	if err := os.Rename(filepath.Join(dir, "later"), filepath.Join(dir, "renamed")); err != nil {
		t.Fatal(err)
	}
	w.until("later", evRename)
	w.until("renamed", evCreate)
	writeFile(t, filepath.Join(dir, "renamed", "g.txt"), "x")
	for _, ev := range w.until("renamed/g.txt", evCreate) {
		if strings.HasPrefix(ev.GetName(), "later/") {
			t.Errorf("change reported under the old name: %v %s", ev.GetType(), ev.GetName())
		}
	}

	// A directory moved over an empty watched one replaces it, subtree
	// included.
	if err := os.Mkdir(filepath.Join(dir, "target"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.until("target", evCreate)
	if err := os.MkdirAll(filepath.Join(dir, "incoming", "inner"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.until("incoming/inner", evCreate)
	// os.Rename refuses to replace a directory; rename(2) does not.
	if err := unix.Rename(filepath.Join(dir, "incoming"), filepath.Join(dir, "target")); err != nil {
		t.Fatal(err)
	}
	w.until("target", evCreate)
	writeFile(t, filepath.Join(dir, "target", "inner", "h.txt"), "x")
	w.until("target/inner/h.txt", evWrite)

	// A subdirectory moved out of the tree is reported once and then forgotten.
	if err := os.Rename(filepath.Join(dir, "renamed"), filepath.Join(outside, "renamed")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(outside, "renamed", "after.txt"), "x")
	evs := w.mark(dir, "marker1")
	var renames int
	for _, ev := range evs {
		if ev.GetName() == "renamed" && ev.GetType() == evRename {
			renames++
		}
		if strings.Contains(ev.GetName(), "after.txt") {
			t.Errorf("change outside the tree reported: %v %s", ev.GetType(), ev.GetName())
		}
	}
	if renames != 1 {
		t.Errorf("%d RENAME events for the moved-out directory in %q; want 1", renames, describe(evs))
	}

	// A directory removed and created again is watched again.
	if err := os.RemoveAll(filepath.Join(dir, "nested")); err != nil {
		t.Fatal(err)
	}
	w.until("nested", evRemove)
	if err := os.Mkdir(filepath.Join(dir, "nested"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.until("nested", evCreate)
	writeFile(t, filepath.Join(dir, "nested", "z"), "x")
	w.until("nested/z", evCreate)
}

// TestWatchDirSymlinkRoot watches through a symlink to a directory; names stay
// relative to the watched directory.
func TestWatchDirSymlinkRoot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := tempDir(t)
	writeFile(t, filepath.Join(dir, "real", "sub", "x"), "")
	link := filepath.Join(dir, "link")
	mustSymlink(t, filepath.Join(dir, "real"), link)

	w := openWatch(t, e, &filesystem.WatchDirRequest{Path: link, Recursive: true, IncludeEntry: true}, nil)
	writeFile(t, filepath.Join(dir, "real", "sub", "x"), "y")
	ev := w.until("sub/x", evWrite)
	if p := ev[len(ev)-1].GetEntry().GetPath(); p != filepath.Join(link, "sub", "x") {
		t.Errorf("entry path %s; want it under the link", p)
	}
}

func TestWatchDirErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := tempDir(t)
	writeFile(t, filepath.Join(dir, "file"), "x")
	nfs := filepath.Join(dir, "nfs")
	if err := os.Mkdir(nfs, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		req  *filesystem.WatchDirRequest
		want connect.Code
	}{
		{"missing", &filesystem.WatchDirRequest{Path: filepath.Join(dir, "missing")}, connect.CodeNotFound},
		{"file", &filesystem.WatchDirRequest{Path: filepath.Join(dir, "file")}, connect.CodeInvalidArgument},
	} {
		wantWatchDirCode(t, e, c.name, c.req, c.want)
	}

	// The rest fakes what nfs is on; other paths keep their real one.
	e.service(t, "the rest fakes statfs (fsType) to make a directory look like a network mount").fsType = func(path string) (int64, error) {
		if path == nfs {
			return 0x6969, nil
		}
		return statfsType(path)
	}
	for _, c := range []struct {
		name string
		req  *filesystem.WatchDirRequest
		want connect.Code
	}{
		{"network mount", &filesystem.WatchDirRequest{Path: nfs}, connect.CodeInvalidArgument},
		{"network mount, recursive", &filesystem.WatchDirRequest{Path: nfs, Recursive: true}, connect.CodeInvalidArgument},
	} {
		wantWatchDirCode(t, e, c.name, c.req, c.want)
	}

	// allow_network_mounts lifts the refusal.
	w := openWatch(t, e, &filesystem.WatchDirRequest{Path: nfs, AllowNetworkMounts: true}, nil)
	writeFile(t, filepath.Join(nfs, "x"), "")
	w.until("x", evCreate)
}

// wantWatchDirCode wants WatchDir of req to fail with code want.
func wantWatchDirCode(t *testing.T, e *env, name string, req *filesystem.WatchDirRequest, want connect.Code) {
	t.Helper()
	st, err := e.client.WatchDir(testCtx(t), request(req, "root"))
	if err == nil {
		if st.Receive() {
			t.Errorf("%s: got %v; want an error", name, st.Msg())
		}
		err = st.Err()
		st.Close()
	}
	wantCode(t, "WatchDir "+name, err, want)
}

func TestNetworkFSMagic(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of networkFS and statfsType")
	t.Parallel()
	for magic, want := range map[int64]bool{
		0x6969: true, 0xFF534D42: true, 0x517B: true, 0xFE534D42: true, 0x65735546: true,
		0xEF53 /* ext4 */ : false, 0x01021994 /* tmpfs */ : false, 0x794c7630 /* overlayfs */ : false,
	} {
		if _, got := networkFS[magic]; got != want {
			t.Errorf("networkFS[%#x] = %v; want %v", magic, got, want)
		}
	}
	dir := tempDir(t)
	magic, err := statfsType(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := networkFS[magic]; ok {
		t.Skipf("temp dir %s is on a network filesystem (%#x)", dir, magic)
	}
	if _, err := statfsType(filepath.Join(dir, "missing")); err == nil {
		t.Error("statfs of a missing path succeeded")
	}
}

func TestWatchDirKeepalive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := tempDir(t)
	w := openWatch(t, e, &filesystem.WatchDirRequest{Path: dir}, map[string]string{keepalive.Header: "1"})
	if !w.st.Receive() {
		t.Fatalf("stream ended: %v", w.st.Err())
	}
	if w.st.Msg().GetKeepalive() == nil {
		t.Fatalf("got %v; want a keepalive on an idle stream", w.st.Msg())
	}
	// Events still flow after keepalives.
	writeFile(t, filepath.Join(dir, "x"), "")
	w.until("x", evCreate)
}

// TestWatchDirEndsOnClose: closing the service ends open streams cleanly
// and refuses new watches.
func TestWatchDirEndsOnClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := tempDir(t)
	w := openWatch(t, e, &filesystem.WatchDirRequest{Path: dir, Recursive: true}, nil)
	e.service(t, "calls Service.Close, which a binary has no way to do but exit").Close()
	for w.st.Receive() {
	}
	if err := w.st.Err(); err != nil {
		t.Errorf("stream ended with %v; want a clean end", err)
	}
	st, err := e.client.WatchDir(testCtx(t), request(&filesystem.WatchDirRequest{Path: dir}, "root"))
	if err == nil {
		for st.Receive() {
		}
		err = st.Err()
		st.Close()
	}
	wantCode(t, "WatchDir after Close", err, connect.CodeCanceled)
	e.s.Close() // idempotent
}

// TestWatchDirDeadline: Connect-Timeout-Ms bounds the stream.
func TestWatchDirDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := tempDir(t)
	ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	st, err := e.client.WatchDir(ctx, request(&filesystem.WatchDirRequest{Path: dir}, "root"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for st.Receive() {
	}
	wantCode(t, "WatchDir past its deadline", st.Err(), connect.CodeDeadlineExceeded)
}

func TestEventTypes(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of eventTypes")
	t.Parallel()
	cases := []struct {
		op   fsnotify.Op
		want []filesystem.EventType
	}{
		{0, nil},
		{fsnotify.Create, []filesystem.EventType{evCreate}},
		{fsnotify.Write | fsnotify.Chmod, []filesystem.EventType{evChmod, evWrite}},
		{fsnotify.Create | fsnotify.Rename | fsnotify.Chmod | fsnotify.Write | fsnotify.Remove,
			[]filesystem.EventType{evCreate, evRename, evChmod, evWrite, evRemove}},
	}
	for _, c := range cases {
		if got := eventTypes(c.op); !slices.Equal(got, c.want) {
			t.Errorf("eventTypes(%v) = %v; want %v", c.op, got, c.want)
		}
	}
}

// inotifyFDs counts this process's inotify instances.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot read /proc/self/fd: %v", err)
	}
	n := 0
	for _, de := range des {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", de.Name())); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// eventually polls cond until it holds or the test context ends; the poll
// interval is not an assertion about speed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx := testCtx(t)
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: never happened", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestWatchNoLeaks runs alone (not parallel) so that counting inotify
// instances and goroutines is meaningful: streams dropped by the client,
// removed watchers and Close must release everything.
func TestWatchNoLeaks(t *testing.T) {
	agenttest.InProcessOnly(t, "counts the test process's own inotify instances and goroutines, and calls Service.Close")
	baseFDs := inotifyFDs(t)
	baseGoroutines := runtime.NumGoroutine()
	// The subtest owns the server, client and service; its cleanups run
	// when it returns.
	t.Run("watches", func(t *testing.T) {
		e := newEnv(t)
		dir := tempDir(t)
		writeFile(t, filepath.Join(dir, "a", "b", "c"), "")
		ctx := testCtx(t)
		var streams []*watchStream
		for range 3 {
			streams = append(streams, openWatch(t, e, &filesystem.WatchDirRequest{Path: dir, Recursive: true}, nil))
		}
		var ids []string
		for range 3 {
			resp, err := e.client.CreateWatcher(ctx, request(&filesystem.CreateWatcherRequest{Path: dir, Recursive: true}, "root"))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, resp.Msg.GetWatcherId())
		}
		if got := inotifyFDs(t); got != baseFDs+6 {
			t.Errorf("%d inotify instances for 6 watches; want 6", got-baseFDs)
		}
		// The client goes away.
		streams[0].cancel()
		eventually(t, "dropped stream releases its inotify instance", func() bool { return inotifyFDs(t) == baseFDs+5 })
		// A polled watcher is removed: released before RemoveWatcher returns.
		if _, err := e.client.RemoveWatcher(ctx, request(&filesystem.RemoveWatcherRequest{WatcherId: ids[0]}, "")); err != nil {
			t.Fatal(err)
		}
		if got := inotifyFDs(t); got != baseFDs+4 {
			t.Errorf("after RemoveWatcher: %d inotify instances; want 4", got-baseFDs)
		}
		// Close releases the rest: polled watchers at once, streams as
		// their handlers end.
		e.s.Close()
		eventually(t, "Close releases every inotify instance", func() bool { return inotifyFDs(t) == baseFDs })
		for _, w := range streams[1:] {
			for w.st.Receive() {
			}
			if err := w.st.Err(); err != nil {
				t.Errorf("stream ended with %v after Close; want a clean end", err)
			}
		}
	})
	eventually(t, "goroutines return to the baseline", func() bool { return runtime.NumGoroutine() <= baseGoroutines })
}

// TestKeepaliveResetByEvents runs the watch loop on a fake clock with a
// hand-fed event channel: keepalives come after each idle interval, and an
// event restarts the interval.
func TestKeepaliveResetByEvents(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of the watch loop on a fake clock (synctest)")
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		events := make(chan fsnotify.Event)
		tr := &tree{fsw: &fsnotify.Watcher{Events: events, Errors: make(chan error)}, root: "/w",
			log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		start := time.Now()
		var mu sync.Mutex
		var got []string
		record := func(what string) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, fmt.Sprintf("%s@%v", what, time.Since(start)))
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() {
			done <- tr.run(ctx, 10*time.Second,
				func(ev *filesystem.FilesystemEvent) error { record(ev.GetName()); return nil },
				func() error { record("keepalive"); return nil })
		}()

		time.Sleep(15 * time.Second) // keepalive at 10s
		events <- fsnotify.Event{Name: "/w/a", Op: fsnotify.Create}
		time.Sleep(12 * time.Second) // next keepalive at 25s, not 20s
		events <- fsnotify.Event{Name: "/w/b", Op: fsnotify.Write}
		time.Sleep(5 * time.Second) // none before 37s
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("run ended with %v; want context.Canceled", err)
		}
		want := []string{"keepalive@10s", "a@15s", "keepalive@25s", "b@27s"}
		if !slices.Equal(got, want) {
			t.Errorf("got %q; want %q", got, want)
		}
	})
}
