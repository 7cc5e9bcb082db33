package filesystem

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
)

// poll calls GetWatcherEvents until an event named name of type typ arrives
// and returns every event the calls returned, in order.
func poll(t *testing.T, e *env, id, name string, typ filesystem.EventType) []*filesystem.FilesystemEvent {
	t.Helper()
	var all []*filesystem.FilesystemEvent
	ctx := testCtx(t)
	eventually(t, "event "+typ.String()+" "+name, func() bool {
		resp, err := e.client.GetWatcherEvents(ctx, request(&filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
		if err != nil {
			t.Fatalf("GetWatcherEvents(%s): %v", id, err)
		}
		all = append(all, resp.Msg.GetEvents()...)
		return find(resp.Msg.GetEvents(), name, typ) != nil
	})
	return all
}

func createWatcher(t *testing.T, e *env, msg *filesystem.CreateWatcherRequest) string {
	t.Helper()
	resp, err := e.client.CreateWatcher(testCtx(t), request(msg, "root"))
	if err != nil {
		t.Fatalf("CreateWatcher(%s): %v", msg.GetPath(), err)
	}
	id := resp.Msg.GetWatcherId()
	if id == "" {
		t.Fatal("empty watcher id")
	}
	return id
}

func TestSyncWatcher(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := tempDir(t)
	if err := os.Mkdir(filepath.Join(dir, "nested"), 0o755); err != nil {
		t.Fatal(err)
	}

	id := createWatcher(t, e, &filesystem.CreateWatcherRequest{Path: dir, Recursive: true, IncludeEntry: true})

	writeFile(t, filepath.Join(dir, "nested", "f.txt"), "x")
	evs := poll(t, e, id, "nested/f.txt", evWrite)
	ev := find(evs, "nested/f.txt", evCreate)
	if ev == nil {
		t.Fatalf("no CREATE nested/f.txt in %q", describe(evs))
	}
	if ev.GetEntry().GetPath() != filepath.Join(dir, "nested", "f.txt") {
		t.Errorf("entry %v; want one for %s", ev.GetEntry(), filepath.Join(dir, "nested", "f.txt"))
	}

	// Events are handed out once: the next call only has what happened since.
	writeFile(t, filepath.Join(dir, "second"), "x")
	for _, ev := range poll(t, e, id, "second", evCreate) {
		if ev.GetName() == "nested/f.txt" {
			t.Errorf("event %v %s handed out twice", ev.GetType(), ev.GetName())
		}
	}

	// A directory created later is watched too.
	if err := os.Mkdir(filepath.Join(dir, "later"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "later", "g"), "x")
	poll(t, e, id, "later/g", evCreate)

	// Ids are random and distinct.
	other := createWatcher(t, e, &filesystem.CreateWatcherRequest{Path: dir})
	if other == id {
		t.Errorf("two watchers share id %s", id)
	}

	if _, err := e.client.RemoveWatcher(ctx, request(&filesystem.RemoveWatcherRequest{WatcherId: id}, "")); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.GetWatcherEvents(ctx, request(&filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
	wantCode(t, "GetWatcherEvents after RemoveWatcher", err, connect.CodeNotFound)
	_, err = e.client.RemoveWatcher(ctx, request(&filesystem.RemoveWatcherRequest{WatcherId: id}, ""))
	wantCode(t, "RemoveWatcher twice", err, connect.CodeNotFound)

	// Close removes every watcher and refuses new ones.
	e.service(t, "the rest calls Service.Close, which a binary has no way to do but exit").Close()
	_, err = e.client.GetWatcherEvents(ctx, request(&filesystem.GetWatcherEventsRequest{WatcherId: other}, ""))
	wantCode(t, "GetWatcherEvents after Close", err, connect.CodeNotFound)
	_, err = e.client.CreateWatcher(ctx, request(&filesystem.CreateWatcherRequest{Path: dir}, ""))
	wantCode(t, "CreateWatcher after Close", err, connect.CodeCanceled)
}

func TestSyncWatcherErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := tempDir(t)
	writeFile(t, filepath.Join(dir, "file"), "x")
	e.service(t, "fakes statfs (fsType) to make every directory look like CIFS").fsType = func(string) (int64, error) { return 0xFF534D42, nil }

	cases := []struct {
		name string
		req  *filesystem.CreateWatcherRequest
		want connect.Code
	}{
		{"missing", &filesystem.CreateWatcherRequest{Path: filepath.Join(dir, "missing")}, connect.CodeNotFound},
		{"file", &filesystem.CreateWatcherRequest{Path: filepath.Join(dir, "file")}, connect.CodeInvalidArgument},
		{"network mount", &filesystem.CreateWatcherRequest{Path: dir}, connect.CodeInvalidArgument},
	}
	for _, c := range cases {
		_, err := e.client.CreateWatcher(ctx, request(c.req, "root"))
		wantCode(t, "CreateWatcher "+c.name, err, c.want)
	}
	createWatcher(t, e, &filesystem.CreateWatcherRequest{Path: dir, AllowNetworkMounts: true})

	for _, id := range []string{"", "nope", "w\x00"} {
		_, err := e.client.GetWatcherEvents(ctx, request(&filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
		wantCode(t, "GetWatcherEvents unknown id", err, connect.CodeNotFound)
		_, err = e.client.RemoveWatcher(ctx, request(&filesystem.RemoveWatcherRequest{WatcherId: id}, ""))
		wantCode(t, "RemoveWatcher unknown id", err, connect.CodeNotFound)
	}
}

// TestSyncWatcherOverflow: a watcher nobody polls stops at its buffer limit,
// hands out what it holds, then reports the loss instead of growing forever.
func TestSyncWatcherOverflow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t)
	dir := tempDir(t)
	e.service(t, "lowers the watcher buffer limit (maxPending) and waits on the watcher's done channel").maxPending = 2
	id := createWatcher(t, e, &filesystem.CreateWatcherRequest{Path: dir})

	for _, n := range []string{"a", "b", "c"} {
		if err := os.Mkdir(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	w, err := e.s.watcher(id)
	if err != nil {
		t.Fatal(err)
	}
	select { // the watch ends on its own once the third event does not fit
	case <-w.done:
	case <-ctx.Done():
		t.Fatal("watcher did not stop at its limit")
	}
	resp, err := e.client.GetWatcherEvents(ctx, request(&filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if got := describe(resp.Msg.GetEvents()); len(got) != 2 || got[0] != "CREATE:a" || got[1] != "CREATE:b" {
		t.Errorf("events %q; want CREATE a and b", got)
	}
	_, err = e.client.GetWatcherEvents(ctx, request(&filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
	wantCode(t, "GetWatcherEvents after overflow", err, connect.CodeInternal)
	if _, err := e.client.RemoveWatcher(context.Background(), request(&filesystem.RemoveWatcherRequest{WatcherId: id}, "")); err != nil {
		t.Errorf("RemoveWatcher after overflow: %v", err)
	}
}
