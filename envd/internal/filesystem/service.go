// Package filesystem implements envd's filesystem.Filesystem Connect service.
//
// Identity: like E2B's envd, the service runs as root and performs every
// operation with root's rights; the request user (Basic auth, else the sandbox
// default user) only decides how paths resolve (home, default workdir) and who
// owns the directories the service creates (MakeDir, the parents Move creates).
// Checking each operation against the user's own permissions would break
// clients that rely on E2B's behaviour, e.g. removing a root-owned file as
// "user", so we deliberately match it. Processes started by envd, not this
// service, are where the user's uid applies.
package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
)

// errClosed is the cause of the service context once Close ran. It wraps
// context.Canceled so that requests arriving after Close map to "canceled".
var errClosed = fmt.Errorf("filesystem service closed: %w", context.Canceled)

// Service owns the filesystem watchers.
type Service struct {
	filesystemconnect.UnimplementedFilesystemHandler
	log      *slog.Logger
	defaults *execctx.Defaults

	// ctx ends when Close runs; every watch (streamed or polled) ends with it.
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	watchers map[string]*syncWatcher // CreateWatcher's watchers by id

	// fsType returns the statfs magic of the filesystem holding a path; a
	// field so tests can pretend a directory lives on NFS.
	fsType func(path string) (int64, error)
	// maxPending bounds the events a polled watcher keeps between two
	// GetWatcherEvents calls; a field so tests can make it small.
	maxPending int
}

// New returns the service; Close stops its watchers. defaults is required.
func New(log *slog.Logger, defaults *execctx.Defaults) *Service {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Service{
		log:        log,
		defaults:   defaults,
		ctx:        ctx,
		cancel:     cancel,
		watchers:   map[string]*syncWatcher{},
		fsType:     statfsType,
		maxPending: defaultMaxPending,
	}
}

// Handler returns the Connect route prefix and handler.
func (s *Service) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	return filesystemconnect.NewFilesystemHandler(s, opts...)
}

// Close stops every watcher: polled watchers are removed and their inotify
// instances closed before Close returns; open WatchDir streams end as soon as
// their handler sees the service context end. Close is idempotent.
func (s *Service) Close() {
	s.cancel(errClosed)
	s.mu.Lock()
	ws := s.watchers
	s.watchers = map[string]*syncWatcher{}
	s.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
}

// closed reports whether Close has run.
func (s *Service) closed() bool {
	return errors.Is(context.Cause(s.ctx), errClosed)
}

// resolve returns the request user and path as that user sees it: an empty
// path means the default workdir (or home), "~" and relative paths start at
// the user's home. Errors are unknown users and paths that cannot be resolved
// (NUL bytes, "~other").
func (s *Service) resolve(h http.Header, path string) (string, *permissions.User, error) {
	u, err := permissions.RequestUser(h, s.defaults)
	if err != nil {
		return "", nil, err
	}
	p, err := permissions.ResolvePath(path, u, s.defaults.Workdir())
	if err != nil {
		return "", nil, err
	}
	return p, u, nil
}
