package volume

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
)

// The content API's file operations, on the root of one volume's files.
// Every path goes through os.Root, which resolves symlinks inside the
// volume and refuses one that leads out of it (a sandbox's root can make
// any symlink in a volume it mounts), so no request reaches the host's
// files. Owners are as the sandboxes see them.

// Defaults of new files and directories, as E2B's (its owner is the
// sandbox's `user`, uid 1000 in sandboxd's templates).
const (
	DefaultUID      = 1000
	DefaultGID      = 1000
	DefaultFileMode = 0o666
	DefaultDirMode  = 0o777
	MaxListDepth    = 10
)

// Entry is E2B's VolumeEntryStat.
type Entry struct {
	Name                string
	Type                string // file, directory, symlink, unknown
	Path                string // absolute within the volume
	Size                int64
	Mode                uint32 // permission bits
	UID, GID            uint32
	Atime, Mtime, Ctime time.Time
	Target              string // a symlink's target
}

// Clean turns a request's path into the absolute path within the volume
// and the name os.Root takes ("." for the root).
func Clean(p string) (abs, rel string, err error) {
	if strings.ContainsRune(p, 0) {
		return "", "", errdefs.New(errdefs.ErrInvalidArgument, "path contains a NUL byte")
	}
	abs = path.Clean("/" + p)
	rel = strings.TrimPrefix(abs, "/")
	if rel == "" {
		rel = "."
	}
	return abs, rel, nil
}

// fsErr gives an os error its kind, in the content API's words.
func fsErr(op, p string, err error) error {
	msg := fmt.Sprintf("%s %s: %v", op, p, unwrapPathErr(err))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.New(errdefs.ErrNotFound, msg)
	case errors.Is(err, syscall.ENOTDIR): // E2B's words and status
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("%s %s: a component of the path is a file, but must be a directory", op, p))
	case errors.Is(err, fs.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		return errdefs.New(errdefs.ErrConflict, msg)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		// E2B's orchestrator answers 500 here; 507 says what it is.
		return errdefs.New(errdefs.ErrNoSpace, fmt.Sprintf("%s %s: the volume is full", op, p))
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ELOOP),
		errors.Is(err, syscall.ENAMETOOLONG), strings.Contains(err.Error(), "escapes from parent"):
		return errdefs.New(errdefs.ErrInvalidArgument, msg)
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

// unwrapPathErr drops os.PathError's host path from a message.
func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func entryOf(root *os.Root, abs, rel string, fi fs.FileInfo) Entry {
	e := Entry{Name: path.Base(abs), Path: abs, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), Mtime: fi.ModTime().UTC(), Type: "unknown"}
	if abs == "/" {
		e.Name = "/"
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
	case fi.IsDir():
		e.Type = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		if t, err := root.Readlink(rel); err == nil {
			e.Target = t
		}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
		e.Atime = time.Unix(st.Atim.Sec, st.Atim.Nsec).UTC()
		e.Ctime = time.Unix(st.Ctim.Sec, st.Ctim.Nsec).UTC()
	}
	return e
}

// Stat describes p, not following a final symlink.
func Stat(root *os.Root, p string) (Entry, error) {
	abs, rel, err := Clean(p)
	if err != nil {
		return Entry{}, err
	}
	fi, err := root.Lstat(rel)
	if err != nil {
		return Entry{}, fsErr("stat", abs, err)
	}
	return entryOf(root, abs, rel, fi), nil
}

// OpenFile opens regular file p for reading. Anything else (a directory,
// a FIFO a sandbox made to hang the reader) is refused without blocking.
func OpenFile(root *os.Root, p string) (*os.File, Entry, error) {
	abs, rel, err := Clean(p)
	if err != nil {
		return nil, Entry{}, err
	}
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, Entry{}, fsErr("open", abs, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Entry{}, fsErr("stat", abs, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, Entry{}, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("read %s: not a regular file", abs))
	}
	return f, entryOf(root, abs, rel, fi), nil
}

// Owner is the owner and mode a create or an update asks for; nil fields
// take the defaults (create) or stay (update).
type Owner struct {
	UID, GID *int
	Mode     *int
}

func (o Owner) ids() (int, int) {
	uid, gid := DefaultUID, DefaultGID
	if o.UID != nil {
		uid = *o.UID
	}
	if o.GID != nil {
		gid = *o.GID
	}
	return uid, gid
}

func checkOwner(o Owner) error {
	for _, v := range []*int{o.UID, o.GID} {
		if v != nil && (*v < 0 || *v > 65535) {
			return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("uid/gid %d: want 0..65535 (the sandbox's ids)", *v))
		}
	}
	if o.Mode != nil && (*o.Mode < 0 || *o.Mode > 0o7777) {
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("mode %o: want 0..07777", *o.Mode))
	}
	return nil
}

// ensureParents makes p's missing parent directories, owned by uid:gid.
func ensureParents(root *os.Root, rel string, uid, gid int) error {
	dir := path.Dir(rel)
	if dir == "." {
		return nil
	}
	var missing []string
	for d := dir; d != "."; d = path.Dir(d) {
		if _, err := root.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		if err := root.Mkdir(d, DefaultDirMode); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := setOwner(root, d, uid, gid, DefaultDirMode); err != nil {
			return err
		}
	}
	return nil
}

// setOwner gives rel its owner and mode; the mode again after the create,
// which the umask cut.
func setOwner(root *os.Root, rel string, uid, gid, mode int) error {
	if err := root.Lchown(rel, uid, gid); err != nil {
		return err
	}
	return root.Chmod(rel, fs.FileMode(mode).Perm())
}

// WriteFile writes body to p. Without force p must not exist (409, as on
// E2B); with force its parents are made and an existing file replaced.
func WriteFile(root *os.Root, p string, body io.Reader, o Owner, force bool) (_ Entry, err error) {
	abs, rel, err := Clean(p)
	if err != nil {
		return Entry{}, err
	}
	if rel == "." {
		return Entry{}, errdefs.New(errdefs.ErrInvalidArgument, "write /: the volume's root is a directory")
	}
	if err := checkOwner(o); err != nil {
		return Entry{}, err
	}
	uid, gid := o.ids()
	mode := DefaultFileMode
	if o.Mode != nil {
		mode = *o.Mode
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_EXCL | syscall.O_NONBLOCK | syscall.O_NOCTTY
	if force {
		if err := ensureParents(root, rel, uid, gid); err != nil {
			return Entry{}, fsErr("write", abs, err)
		}
		flags = os.O_CREATE | os.O_WRONLY | syscall.O_NONBLOCK | syscall.O_NOCTTY
	}
	f, err := root.OpenFile(rel, flags, fs.FileMode(mode).Perm())
	if err != nil {
		return Entry{}, fsErr("write", abs, err)
	}
	defer f.Close()
	if !force {
		// A file this call made goes again if the write fails (a full
		// volume): no half file is left behind.
		defer func() {
			if err != nil {
				_ = root.Remove(rel)
			}
		}()
	}
	fi, err := f.Stat()
	if err != nil {
		return Entry{}, fsErr("write", abs, err)
	}
	if !fi.Mode().IsRegular() {
		return Entry{}, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("write %s: not a regular file", abs))
	}
	// Truncated only once known to be a regular file.
	if err := f.Truncate(0); err != nil {
		return Entry{}, fsErr("write", abs, err)
	}
	if _, err := io.Copy(f, body); err != nil {
		return Entry{}, fsErr("write", abs, err)
	}
	if err := f.Sync(); err != nil {
		return Entry{}, fsErr("write", abs, err)
	}
	if err := f.Chown(uid, gid); err != nil {
		return Entry{}, fsErr("write", abs, err)
	}
	if err := f.Chmod(fs.FileMode(mode).Perm()); err != nil { // the umask left out
		return Entry{}, fsErr("write", abs, err)
	}
	if fi, err = f.Stat(); err != nil {
		return Entry{}, fsErr("write", abs, err)
	}
	return entryOf(root, abs, rel, fi), nil
}

// MakeDir makes directory p. With force its parents are made too and an
// existing directory is no error.
func MakeDir(root *os.Root, p string, o Owner, force bool) (Entry, error) {
	abs, rel, err := Clean(p)
	if err != nil {
		return Entry{}, err
	}
	if err := checkOwner(o); err != nil {
		return Entry{}, err
	}
	uid, gid := o.ids()
	mode := DefaultDirMode
	if o.Mode != nil {
		mode = *o.Mode
	}
	if force {
		if err := ensureParents(root, rel, uid, gid); err != nil {
			return Entry{}, fsErr("mkdir", abs, err)
		}
	}
	if err := root.Mkdir(rel, fs.FileMode(mode).Perm()); err != nil {
		fi, serr := root.Lstat(rel)
		if !force || !errors.Is(err, fs.ErrExist) || serr != nil || !fi.IsDir() {
			return Entry{}, fsErr("mkdir", abs, err)
		}
		return entryOf(root, abs, rel, fi), nil
	}
	if err := setOwner(root, rel, uid, gid, mode); err != nil {
		return Entry{}, fsErr("mkdir", abs, err)
	}
	return Stat(root, abs)
}

// List lists directory p to depth levels (1: its entries only).
func List(root *os.Root, p string, depth int) ([]Entry, error) {
	abs, rel, err := Clean(p)
	if err != nil {
		return nil, err
	}
	depth = max(depth, 1)
	if depth > MaxListDepth {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("depth must be between 1 and %d", MaxListDepth))
	}
	fi, err := root.Lstat(rel)
	if err != nil {
		return nil, fsErr("list", abs, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("list %s: not a directory", abs))
	}
	out := []Entry{}
	return out, list(root, abs, rel, depth, &out)
}

func list(root *os.Root, abs, rel string, depth int, out *[]Entry) error {
	d, err := root.Open(rel)
	if err != nil {
		return fsErr("list", abs, err)
	}
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return fsErr("list", abs, err)
	}
	for _, de := range ents {
		fi, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		cabs, crel := path.Join(abs, de.Name()), path.Join(rel, de.Name())
		*out = append(*out, entryOf(root, cabs, crel, fi))
		if fi.IsDir() && depth > 1 {
			if err := list(root, cabs, crel, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// Update changes p's owner and mode (what o sets).
func Update(root *os.Root, p string, o Owner) (Entry, error) {
	abs, rel, err := Clean(p)
	if err != nil {
		return Entry{}, err
	}
	if err := checkOwner(o); err != nil {
		return Entry{}, err
	}
	fi, err := root.Lstat(rel)
	if err != nil {
		return Entry{}, fsErr("update", abs, err)
	}
	if o.UID != nil || o.GID != nil {
		uid, gid := -1, -1
		if o.UID != nil {
			uid = *o.UID
		}
		if o.GID != nil {
			gid = *o.GID
		}
		if err := root.Lchown(rel, uid, gid); err != nil {
			return Entry{}, fsErr("update", abs, err)
		}
	}
	if o.Mode != nil && fi.Mode()&fs.ModeSymlink == 0 {
		if err := root.Chmod(rel, fs.FileMode(*o.Mode).Perm()); err != nil {
			return Entry{}, fsErr("update", abs, err)
		}
	}
	return Stat(root, abs)
}

// Remove removes p and, for a directory, everything in it.
func Remove(root *os.Root, p string) error {
	abs, rel, err := Clean(p)
	if err != nil {
		return err
	}
	if rel == "." {
		return errdefs.New(errdefs.ErrInvalidArgument, "remove /: the volume's root cannot be removed (delete the volume)")
	}
	if _, err := root.Lstat(rel); err != nil {
		return fsErr("remove", abs, err)
	}
	if err := root.RemoveAll(rel); err != nil {
		return fsErr("remove", abs, err)
	}
	return nil
}
