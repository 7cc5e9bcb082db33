package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// Move renames source to destination with os.Rename's rules, as E2B does: an
// existing file is replaced, an existing directory is already_exists. Missing
// destination parents are created, owned by the request user. A missing
// source is not_found, checked before any parent is created.
//
// Unlike E2B, a move the kernel refuses with EXDEV is completed by copying,
// as mv(1) does: a sandbox's /tmp may be its own tmpfs, and overlayfs refuses
// to rename directories that come from a lower (template) layer.
func (s *Service) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	src, u, err := s.resolve(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	dst, _, err := s.resolve(req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	var e *filesystem.EntryInfo
	// Moved with the user's rights, as mv in their shell would.
	err = permissions.AsUser(u, func() error {
		if _, err := os.Lstat(src); err != nil {
			return err
		}
		if err := permissions.EnsureDir(filepath.Dir(dst), u); err != nil {
			return err
		}
		err := os.Rename(src, dst)
		if errors.Is(err, unix.EXDEV) {
			err = moveAcross(ctx, src, dst)
		}
		if err != nil {
			return err
		}
		e, err = EntryInfo(dst)
		return err
	})
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	s.log.Info("moved", "path", src, "destination", dst, "user", u.Name)
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// moveAcross moves src to dst across filesystems: it copies src into a
// temporary directory next to dst, renames the copy onto dst (so rename's
// rules for an existing dst still apply and dst never shows a partial copy),
// then removes src. On failure nothing but src remains.
func moveAcross(ctx context.Context, src, dst string) error {
	if dst == src || strings.HasPrefix(dst, src+"/") {
		// Copying a directory into itself would never end.
		return fmt.Errorf("move %s into itself: %w", src, unix.EINVAL)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), ".sandboxd-move-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	staged := filepath.Join(tmp, "entry")
	if err := copyEntry(ctx, src, staged); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := os.Rename(staged, dst); err != nil {
		return err
	}
	return os.RemoveAll(src)
}

// copyEntry copies src to the new path dst without following symlinks,
// keeping type, content, owner, mode (including setuid/setgid/sticky),
// extended attributes and timestamps, like cp -a. Hard links inside a tree
// become separate copies.
func copyEntry(ctx context.Context, src, dst string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no stat data", src)
	}
	mode := fi.Mode()
	switch {
	case mode.IsRegular():
		err = copyFile(src, dst)
	case mode.IsDir():
		err = copyDir(ctx, src, dst)
	case mode&os.ModeSymlink != 0:
		var target string
		if target, err = os.Readlink(src); err == nil {
			err = os.Symlink(target, dst)
		}
	default: // devices, FIFOs, sockets
		err = unix.Mknod(dst, st.Mode, int(st.Rdev))
	}
	if err != nil {
		return err
	}
	// chown before chmod and xattrs: chown clears setuid bits and file
	// capabilities. A user may not give files away: the copy is then theirs,
	// as with mv(1) run by them.
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if mode&os.ModeSymlink == 0 {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	copyXattrs(src, dst)
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil { // copy_file_range/sendfile when possible
		out.Close()
		return err
	}
	return out.Close()
}

func copyDir(ctx context.Context, src, dst string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	des, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, de := range des {
		if err := copyEntry(ctx, filepath.Join(src, de.Name()), filepath.Join(dst, de.Name())); err != nil {
			return err
		}
	}
	return nil
}

// copyXattrs is best effort, like cp -a: a destination filesystem may not
// support a namespace (or xattrs at all), which must not fail the move.
func copyXattrs(src, dst string) {
	size, err := unix.Llistxattr(src, nil)
	if err != nil || size <= 0 {
		return
	}
	buf := make([]byte, size)
	if size, err = unix.Llistxattr(src, buf); err != nil {
		return
	}
	for _, name := range strings.Split(string(buf[:size]), "\x00") {
		if name == "" {
			continue
		}
		n, err := unix.Lgetxattr(src, name, nil)
		if err != nil {
			continue
		}
		val := make([]byte, n)
		if n, err = unix.Lgetxattr(src, name, val); err != nil {
			continue
		}
		_ = unix.Lsetxattr(dst, name, val[:n], 0)
	}
}
