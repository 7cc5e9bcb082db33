package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// ListDir lists a directory down to req.depth levels (0 means 1, as the SDKs
// default it), in lexical order, parents before their children. The path may
// be a symlink to a directory; entries are reported under the path as the
// client gave it, not the resolved one. Symlinks inside are listed but never
// descended into, so link loops cannot make the walk endless.
func (s *Service) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	path, u, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	depth := int(req.Msg.GetDepth())
	if depth <= 0 {
		depth = 1
	}
	l := lister{ctx: ctx, s: s}
	// The walk sees what the user may see: an unreadable directory is
	// permission_denied at the top and skipped below it.
	err = permissions.AsUser(u, func() error {
		// Stat follows symlinks: listing a link to a directory lists the directory.
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w: %s is not a directory", rpcerr.ErrInvalidArgument, path)
		}
		root, err := filepath.EvalSymlinks(path)
		if err != nil {
			return err
		}
		return l.walk(root, path, depth, true)
	})
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: l.entries}), nil
}

// lister collects the entries of one ListDir call.
type lister struct {
	ctx     context.Context
	s       *Service
	names   names
	entries []*filesystem.EntryInfo
}

// walk appends the entries of dir (a real directory path) reported under
// shown (the path the client sees), then those of its subdirectories while
// depth allows. Only the requested directory must be readable: a subdirectory
// that vanishes or cannot be read mid-walk is skipped, so a busy tree or a
// single unreadable mount does not fail the whole listing.
func (l *lister) walk(dir, shown string, depth int, top bool) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		if top {
			return err
		}
		l.s.log.Debug("list dir: skipping unreadable directory", "path", dir, "err", err)
		return nil
	}
	for _, de := range des {
		if err := l.ctx.Err(); err != nil {
			return err
		}
		p := filepath.Join(dir, de.Name())
		e, err := l.names.entry(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since ReadDir
		}
		if err != nil {
			return err
		}
		e.Path = validUTF8(filepath.Join(shown, de.Name()))
		l.entries = append(l.entries, e)
		// de.IsDir is false for a symlink to a directory: links are not followed.
		if depth > 1 && de.IsDir() {
			if err := l.walk(p, filepath.Join(shown, de.Name()), depth-1, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// MakeDir creates a directory and any missing parents, each owned by the
// request user. An existing directory (or symlink to one) is already_exists,
// which the SDKs turn into makeDir() == false; any other existing entry,
// including a dangling symlink, is invalid_argument, as in E2B.
func (s *Service) MakeDir(_ context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	path, u, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	var e *filesystem.EntryInfo
	// Created with the user's rights, as mkdir -p in their shell would.
	err = permissions.AsUser(u, func() error {
		if fi, err := os.Stat(path); err == nil {
			if fi.IsDir() {
				return fmt.Errorf("%w: directory %s", rpcerr.ErrAlreadyExists, path)
			}
			return fmt.Errorf("%w: %s exists and is not a directory", rpcerr.ErrInvalidArgument, path)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if _, err := os.Lstat(path); err == nil {
			return fmt.Errorf("%w: %s is a dangling symlink", rpcerr.ErrInvalidArgument, path)
		}
		if err := permissions.EnsureDir(path, u); err != nil {
			return err
		}
		e, err = EntryInfo(path)
		return err
	})
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	s.log.Info("directory created", "path", path, "user", u.Name)
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}
