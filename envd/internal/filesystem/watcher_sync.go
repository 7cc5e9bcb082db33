package filesystem

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// defaultMaxPending bounds the events a polled watcher buffers between two
// GetWatcherEvents calls, so a client that stops polling cannot make envd
// grow without limit.
const defaultMaxPending = 100_000

// syncWatcher is a watch created by CreateWatcher, for the synchronous Python
// SDK, which polls instead of holding a stream open. It outlives the request
// that created it and ends with RemoveWatcher or Close.
type syncWatcher struct {
	cancel context.CancelFunc
	done   chan struct{} // closed once the watch goroutine exited and its inotify instance is closed

	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
	err    error // why the watch ended on its own; reported once events are drained
}

// CreateWatcher starts a watch with the same checks and events as WatchDir
// and returns its id.
func (s *Service) CreateWatcher(_ context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	if s.closed() {
		return nil, rpcerr.Connect(errClosed)
	}
	m := req.Msg
	root, err := s.watchRoot(req.Header(), m.GetPath(), m.GetAllowNetworkMounts())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	t, err := openTree(root, m.GetRecursive(), m.GetIncludeEntry(), s.log)
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	// The watch lives on after this request, until RemoveWatcher or Close.
	ctx, cancel := context.WithCancel(s.ctx)
	w := &syncWatcher{cancel: cancel, done: make(chan struct{})}
	limit := s.maxPending
	go func() {
		defer close(w.done)
		defer t.close()
		err := t.run(ctx, 0, func(ev *filesystem.FilesystemEvent) error { return w.add(ev, limit) }, nil)
		if ctx.Err() == nil {
			s.log.Warn("watcher failed", "path", root, "err", err)
			w.fail(err)
		}
	}()

	id := strings.ToLower(rand.Text())
	s.mu.Lock()
	if s.closed() { // Close ran since the check above and missed this watcher
		s.mu.Unlock()
		w.stop()
		return nil, rpcerr.Connect(errClosed)
	}
	s.watchers[id] = w
	s.mu.Unlock()
	s.log.Debug("watcher created", "id", id, "path", root, "recursive", m.GetRecursive())
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents returns the events since the previous call and forgets
// them. A watch that failed (e.g. the kernel queue overflowed) first hands out
// the events it still holds, then reports its error on every later call.
func (s *Service) GetWatcherEvents(_ context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	w, err := s.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	w.mu.Lock()
	events, werr := w.events, w.err
	w.events = nil
	w.mu.Unlock()
	if len(events) == 0 && werr != nil {
		return nil, rpcerr.Connect(werr)
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: events}), nil
}

// RemoveWatcher stops a watcher; its inotify instance is closed on return.
func (s *Service) RemoveWatcher(_ context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	id := req.Msg.GetWatcherId()
	s.mu.Lock()
	w, ok := s.watchers[id]
	delete(s.watchers, id)
	s.mu.Unlock()
	if !ok {
		return nil, rpcerr.Connect(fmt.Errorf("%w: watcher %q", rpcerr.ErrNotFound, id))
	}
	w.stop()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

func (s *Service) watcher(id string) (*syncWatcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.watchers[id]
	if !ok {
		return nil, fmt.Errorf("%w: watcher %q", rpcerr.ErrNotFound, id)
	}
	return w, nil
}

// add buffers an event. Past limit buffered events the watch ends with an
// error rather than silently dropping changes.
func (w *syncWatcher) add(ev *filesystem.FilesystemEvent, limit int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events) >= limit {
		return fmt.Errorf("more than %d events were not collected, later changes were lost: %w", limit, unix.ENOBUFS)
	}
	w.events = append(w.events, ev)
	return nil
}

func (w *syncWatcher) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = err
}

// stop ends the watch and waits until its inotify instance is closed.
func (w *syncWatcher) stop() {
	w.cancel()
	<-w.done
}
