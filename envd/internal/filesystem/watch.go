package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/keepalive"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// WatchDir streams changes in a directory: first a start event once the
// watch is in place (so every later change is reported), then one filesystem
// event per change, with keepalive events whenever the stream has been idle
// for the Keepalive-Ping-Interval. It ends when the client goes away, the
// Connect-Timeout-Ms deadline passes, the watch fails (e.g. the kernel event
// queue overflowed), or the service closes; the latter ends it cleanly.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	if s.closed() {
		return rpcerr.Connect(errClosed)
	}
	m := req.Msg
	root, err := s.watchRoot(req.Header(), m.GetPath(), m.GetAllowNetworkMounts())
	if err != nil {
		return rpcerr.Connect(err)
	}
	t, err := openTree(root, m.GetRecursive(), m.GetIncludeEntry(), s.log)
	if err != nil {
		return rpcerr.Connect(err)
	}
	defer t.close()

	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{
		Start: &filesystem.WatchDirResponse_StartEvent{},
	}}); err != nil {
		return rpcerr.Connect(err)
	}

	// The watch belongs to the request, but Close must end it too.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.ctx, func() { cancel(errClosed) })
	defer stop()

	err = t.run(ctx, keepalive.Interval(req.Header()),
		func(ev *filesystem.FilesystemEvent) error {
			return stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}})
		},
		func() error {
			return stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{
				Keepalive: &filesystem.WatchDirResponse_KeepAlive{},
			}})
		})
	if errors.Is(context.Cause(ctx), errClosed) {
		return nil
	}
	if ctx.Err() == nil { // neither the client nor its deadline ended it
		s.log.Warn("watch failed", "path", root, "err", err)
	}
	return rpcerr.Connect(err)
}

// watchRoot resolves and checks the directory a WatchDir or CreateWatcher
// request names. A missing path is not_found; anything but a directory (or a
// symlink to one) is invalid_argument, and so is a directory on a network
// filesystem, where inotify misses changes made by other hosts, unless the
// client allows it.
func (s *Service) watchRoot(h http.Header, path string, allowNetwork bool) (string, error) {
	root, u, err := s.resolve(h, path)
	if err != nil {
		return "", err
	}
	// A user may watch only a directory they may read, as inotify_add_watch
	// run by them demands.
	var fi os.FileInfo
	err = permissions.AsUser(u, func() (err error) {
		if fi, err = os.Stat(root); err != nil || !fi.IsDir() {
			return err
		}
		fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: root, Err: err}
		}
		return unix.Close(fd)
	})
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%w: %s is not a directory", rpcerr.ErrInvalidArgument, root)
	}
	if !allowNetwork {
		magic, err := s.fsType(root)
		if err != nil {
			return "", err
		}
		if name, ok := networkFS[magic]; ok {
			return "", fmt.Errorf("%w: %s is on a network filesystem (%s); set allow_network_mounts to watch it anyway",
				rpcerr.ErrInvalidArgument, root, name)
		}
	}
	return root, nil
}

// networkFS holds the statfs(2) magic numbers (include/uapi/linux/magic.h,
// fs/smb) of the filesystems E2B's envd refuses to watch by default.
var networkFS = map[int64]string{
	0x6969:     "nfs",
	0xFF534D42: "cifs",
	0x517B:     "smb",
	0xFE534D42: "smb2",
	0x65735546: "fuse",
}

func statfsType(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return int64(st.Type), nil
}

// tree is one inotify watch of a directory and, when recursive, of every
// directory below it, including ones created or moved in later. Each watch
// has its own inotify instance, as in E2B, so closing one can never disturb
// another. fsnotify does not recurse on Linux, so tree does: it adds a watch
// for each new subdirectory and forgets the watches of subdirectories that
// are removed or moved away.
type tree struct {
	fsw       *fsnotify.Watcher
	root      string
	recursive bool
	entries   bool // attach EntryInfo to events that can carry one
	log       *slog.Logger

	// dirs indexes the watched directories of a recursive tree, root
	// included, by path under root, so that forgetting a subtree costs its
	// size, not the size of the whole tree.
	dirs map[string]*watchedDir
	// movedDir is a subdirectory just forgotten because it was moved out of
	// the tree; the kernel may still report the move once more from the
	// directory's own watch (IN_MOVE_SELF), which must not become a second
	// RENAME event.
	movedDir string
}

type watchedDir struct {
	ino  uint64              // which directory is watched under this path
	kids map[string]struct{} // watched subdirectories
}

// openTree starts watching root (an existing directory). The caller must
// close the tree.
func openTree(root string, recursive, entries bool, log *slog.Logger) (*tree, error) {
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", root, err)
	}
	t := &tree{fsw: fsw, root: root, recursive: recursive, entries: entries, log: log}
	if err := fsw.Add(root); err != nil {
		_ = fsw.Close()
		return nil, fmt.Errorf("watch %s: %w", root, err)
	}
	if recursive {
		t.dirs = map[string]*watchedDir{root: {kids: map[string]struct{}{}}}
		if err := t.addSubdirs(root, nil); err != nil {
			_ = fsw.Close()
			return nil, fmt.Errorf("watch %s: %w", root, err)
		}
	}
	return t, nil
}

// close releases the inotify instance; fsnotify waits for its reader.
func (t *tree) close() {
	_ = t.fsw.Close()
}

// run turns inotify events into FilesystemEvents and hands them to emit, one
// per operation, until ctx ends (returning its error), the watch fails, or
// emit fails. When idle is positive, onIdle runs after every idle period
// without an event (the keepalive of WatchDir).
func (t *tree) run(ctx context.Context, idle time.Duration, emit func(*filesystem.FilesystemEvent) error, onIdle func() error) error {
	var tick <-chan time.Time
	if idle > 0 {
		ticker := time.NewTicker(idle)
		defer ticker.Stop()
		tick = ticker.C
		sent := emit
		emit = func(ev *filesystem.FilesystemEvent) error {
			if err := sent(ev); err != nil {
				return err
			}
			ticker.Reset(idle)
			return nil
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			if err := onIdle(); err != nil {
				return err
			}
		case err, ok := <-t.fsw.Errors:
			if !ok {
				return fmt.Errorf("watch %s: %w", t.root, fsnotify.ErrClosed)
			}
			return fmt.Errorf("watch %s: %w", t.root, err)
		case e, ok := <-t.fsw.Events:
			if !ok {
				return fmt.Errorf("watch %s: %w", t.root, fsnotify.ErrClosed)
			}
			if err := t.handle(e, emit); err != nil {
				return err
			}
		}
	}
}

// handle reports one inotify event and, for a recursive tree, keeps the set
// of watched subdirectories in step with it.
func (t *tree) handle(e fsnotify.Event, emit func(*filesystem.FilesystemEvent) error) error {
	path := filepath.Clean(e.Name)
	if t.recursive && path == t.movedDir && e.Op == fsnotify.Rename {
		t.movedDir = ""
		return nil
	}
	t.movedDir = ""

	// found lists the entries of a directory that appeared in the tree
	// (created, or moved in with its contents).
	var found []string
	if t.recursive {
		switch {
		case e.Has(fsnotify.Remove) || e.Has(fsnotify.Rename):
			if t.forget(path) && e.Has(fsnotify.Rename) {
				t.movedDir = path
			}
		case e.Has(fsnotify.Create):
			// Watch a new directory and everything below it before
			// reporting it, so that a client reacting to the event by
			// writing inside it is seen.
			added, err := t.watchDir(path)
			if err == nil && added {
				err = t.addSubdirs(path, &found)
			}
			if err != nil {
				return fmt.Errorf("watch %s: %w", path, err)
			}
		}
	}

	for _, typ := range eventTypes(e.Op) {
		if err := emit(t.event(path, typ)); err != nil {
			return err
		}
	}
	// Entries created in the directory before its watch was in place
	// (mkdir -p a/b/c, a file written right after mkdir, a moved-in tree)
	// would go unreported; report them as created. A change racing with
	// the scan may be reported twice, never missed.
	for _, p := range found {
		if err := emit(t.event(p, filesystem.EventType_EVENT_TYPE_CREATE)); err != nil {
			return err
		}
	}
	return nil
}

// watchDir adds a watch for path if it is a directory not watched yet (a
// directory moved over a watched one counts as new). It reports whether it
// did, so the caller scans the directory's contents. Entries that vanish or
// cannot be read are skipped; other errors (such as running out of inotify
// watches) are returned, failing the watch rather than leaving part of the
// tree silently unwatched.
func (t *tree) watchDir(path string) (bool, error) {
	fi, err := os.Lstat(path)
	if err != nil || !fi.IsDir() {
		return false, nil // gone, or not a directory: nothing to watch
	}
	ino := fi.Sys().(*syscall.Stat_t).Ino
	if d, ok := t.dirs[path]; ok && d.ino == ino {
		return false, nil // already watched, e.g. found by a scan
	}
	t.forget(path)
	if err := t.fsw.Add(path); err != nil {
		if skippable(err) {
			t.log.Debug("watch: skipping directory", "path", path, "err", err)
			return false, nil
		}
		return false, err
	}
	t.dirs[path] = &watchedDir{ino: ino, kids: map[string]struct{}{}}
	if parent, ok := t.dirs[filepath.Dir(path)]; ok {
		parent.kids[path] = struct{}{}
	}
	return true, nil
}

// addSubdirs watches every directory below dir (dir itself is already
// watched). Symlinks are not followed. When found is set, every entry below
// dir is appended to it, parents first.
func (t *tree) addSubdirs(dir string, found *[]string) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		if skippable(err) {
			t.log.Debug("watch: skipping directory", "path", dir, "err", err)
			return nil
		}
		return err
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if found != nil {
			*found = append(*found, p)
		}
		if !de.IsDir() {
			continue
		}
		added, err := t.watchDir(p)
		if err != nil {
			return err
		}
		if added {
			if err := t.addSubdirs(p, found); err != nil {
				return err
			}
		}
	}
	return nil
}

// forget drops the watches of path and everything below it after it was
// removed or moved away (a moved directory keeps its inotify watch, which
// would report changes under the old name). It reports whether path was a
// watched subdirectory.
func (t *tree) forget(path string) bool {
	d, ok := t.dirs[path]
	if !ok {
		return false
	}
	for kid := range d.kids {
		t.forget(kid)
	}
	delete(t.dirs, path)
	if path == t.root {
		// fsnotify already dropped the root's watch when it was deleted
		// or moved; nothing below it is watched any more.
		return false
	}
	if parent, ok := t.dirs[filepath.Dir(path)]; ok {
		delete(parent.kids, path)
	}
	// The kernel may already have dropped the watch (deleted directory);
	// fsnotify then reports it as non-existent.
	_ = t.fsw.Remove(path)
	return true
}

// event builds the FilesystemEvent for path, named relative to the root.
// Only events about an entry that should still exist carry its EntryInfo:
// after a remove or rename, stat-ing the path could describe a newer entry
// created under the same name.
func (t *tree) event(path string, typ filesystem.EventType) *filesystem.FilesystemEvent {
	name, err := filepath.Rel(t.root, path)
	if err != nil {
		name = path // cannot happen: every watched path is under root
	}
	ev := &filesystem.FilesystemEvent{Name: validUTF8(name), Type: typ}
	if t.entries && typ != filesystem.EventType_EVENT_TYPE_REMOVE && typ != filesystem.EventType_EVENT_TYPE_RENAME {
		e, err := EntryInfo(path)
		switch {
		case err == nil:
			ev.Entry = e
		case !errors.Is(err, fs.ErrNotExist): // gone already: a benign race
			t.log.Warn("watch: cannot describe entry", "path", path, "err", err)
		}
	}
	return ev
}

// eventTypes splits an fsnotify op into one event type per bit, in E2B's
// order.
func eventTypes(op fsnotify.Op) []filesystem.EventType {
	var out []filesystem.EventType
	for _, m := range []struct {
		op  fsnotify.Op
		typ filesystem.EventType
	}{
		{fsnotify.Create, filesystem.EventType_EVENT_TYPE_CREATE},
		{fsnotify.Rename, filesystem.EventType_EVENT_TYPE_RENAME},
		{fsnotify.Chmod, filesystem.EventType_EVENT_TYPE_CHMOD},
		{fsnotify.Write, filesystem.EventType_EVENT_TYPE_WRITE},
		{fsnotify.Remove, filesystem.EventType_EVENT_TYPE_REMOVE},
	} {
		if op.Has(m.op) {
			out = append(out, m.typ)
		}
	}
	return out
}

// skippable reports errors that leave one directory of a recursive watch
// unwatched without failing the watch: the directory went away, was replaced
// by a non-directory, or cannot be read (e.g. inside /proc).
func skippable(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, fs.ErrPermission)
}
