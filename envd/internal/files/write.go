package files

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/envd/internal/metadata"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// copyBufSize is the one buffer an upload streams through, so memory stays
// constant whatever the file size.
const copyBufSize = 256 << 10

// writer stores uploaded files for one user.
type writer struct {
	log  *slog.Logger
	user *permissions.User
	meta map[string]string // replaces the metadata of every file written
	buf  []byte
}

func newWriter(log *slog.Logger, u *permissions.User, meta map[string]string) *writer {
	return &writer{log: log, user: u, meta: meta, buf: make([]byte, copyBufSize)}
}

// write stores src at path (absolute, resolved) and returns the file it
// wrote: path itself, or what a symlink at path points to. Parent
// directories are created owned by the user; the file ends up owned by the
// user with the request's metadata.
//
// Files are written in place (truncated, then rewritten), as E2B's envd does:
// watchers then see a WRITE of the file itself, open readers and hard links
// see the new content, and no temporary names appear in the directory. The
// cost is that a failed upload over an existing file leaves it truncated or
// partly written; a failed upload of a new file removes it. A symlink is
// written through, as `echo > link` would.
func (wr *writer) write(path string, src io.Reader) (string, error) {
	if err := permissions.EnsureDir(filepath.Dir(path), wr.user); err != nil {
		return "", err
	}
	target := path
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		fi = nil
	case err != nil:
		return "", err
	case fi.Mode()&fs.ModeSymlink != 0:
		if real, err := filepath.EvalSymlinks(path); err == nil {
			target = real
			if fi, err = os.Stat(real); err != nil {
				return "", err
			}
		} else {
			// A dangling link: replace the link itself with the file.
			if err := os.Remove(path); err != nil {
				return "", err
			}
			fi = nil
		}
	}
	if fi != nil {
		switch mode := fi.Mode(); {
		case mode.IsDir():
			return "", rpcerr.Kindf(rpcerr.ErrInvalidArgument, "path is a directory: %s", path)
		case mode&fs.ModeCharDevice != 0:
			// /dev/null and friends: write to the device, never chown it.
			return target, wr.writeInPlace(target, src, false)
		case !mode.IsRegular():
			// Opening a FIFO for writing would block until a reader appears.
			return "", fmt.Errorf("%w: path %q is not a regular file", rpcerr.ErrInvalidArgument, path)
		}
		return target, wr.writeInPlace(target, src, true)
	}

	// Mode 0o666 goes through the umask, as a plain create would.
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o666)
	if errors.Is(err, fs.ErrExist) {
		// Created by someone else since we looked: overwrite it like any
		// existing file.
		return wr.write(path, src)
	}
	if err != nil {
		if errors.Is(err, unix.EISDIR) {
			return "", rpcerr.Kindf(rpcerr.ErrInvalidArgument, "path is a directory: %s", path)
		}
		return "", err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(target)
		}
	}()
	// chown before anything else: the file is the user's from the start.
	if err := f.Chown(int(wr.user.UID), int(wr.user.GID)); err != nil {
		return "", fmt.Errorf("chown %s: %w", path, err)
	}
	if err := wr.copy(f, src); err != nil {
		return "", err
	}
	if err := wr.setMetadata(target); err != nil {
		return "", err
	}
	// Close reports deferred write errors (ENOSPC, EDQUOT on some filesystems).
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	ok = true
	return target, nil
}

// writeInPlace truncates and rewrites an existing file: the fallback where no
// temporary file can be made, and the only way to write a device.
func (wr *writer) writeInPlace(path string, src io.Reader, chown bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if chown {
		// Best effort: pseudo filesystems may refuse it, and the write is
		// what the client asked for.
		if err := f.Chown(int(wr.user.UID), int(wr.user.GID)); err != nil {
			wr.log.Debug("chown after in-place write failed", "path", path, "err", err)
		}
	}
	if err := wr.copy(f, src); err != nil {
		return err
	}
	if chown { // not on devices: their xattrs are not the user's to replace
		if err := wr.setMetadata(path); err != nil {
			if len(wr.meta) > 0 {
				return err
			}
			// Only clearing failed, on a file that pseudo filesystems
			// would not let carry metadata anyway.
			wr.log.Debug("clearing metadata after in-place write failed", "path", path, "err", err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// copy streams src into f through the writer's buffer. A failure to read the
// request (truncated body, corrupt gzip, bad multipart) is the client's: 400.
// A failure to write is ours and keeps its errno (ENOSPC becomes 507).
func (wr *writer) copy(f *os.File, src io.Reader) error {
	sr := &srcReader{r: src}
	// Hide *os.File's ReadFrom so the copy uses wr.buf instead of
	// allocating its own buffer per call.
	_, err := io.CopyBuffer(struct{ io.Writer }{f}, sr, wr.buf)
	if err == nil {
		return nil
	}
	if sr.err != nil {
		return fmt.Errorf("%w: reading upload: %v", rpcerr.ErrInvalidArgument, sr.err)
	}
	return fmt.Errorf("write %s: %w", f.Name(), err)
}

// setMetadata replaces the file's metadata with the request's (none clears
// it, as in E2B). A filesystem without user xattrs keeps the file without
// metadata: the upload itself succeeded, and the response reports what was
// actually stored.
func (wr *writer) setMetadata(path string) error {
	err := metadata.Replace(path, wr.meta)
	if errors.Is(err, unix.ENOTSUP) {
		if len(wr.meta) > 0 {
			wr.log.Warn("filesystem does not support xattrs; metadata not stored", "path", path)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("set metadata of %s: %w", path, err)
	}
	return nil
}

// srcReader remembers a read error so copy can tell whose fault it was.
type srcReader struct {
	r   io.Reader
	err error
}

func (s *srcReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}
