package local

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime"
)

var _ runtime.Differ = (*Backend)(nil)

// The marks overlayfs leaves in an upper directory: a deletion is a 0/0
// character device, a directory that hides the lower one carries this
// xattr.
const opaqueXattr = "trusted.overlay.opaque"

func isWhiteout(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0
}

// upperEntry is one entry of a sandbox's writable layer.
type upperEntry struct {
	rel    string // slash-separated, relative to the root
	info   fs.FileInfo
	opaque bool
}

// walkUpper lists the entries of the writable layer upper, in lexical
// order of their paths, through an os.Root (no path leaves it, however the
// sandbox made its names).
func walkUpper(upper string) ([]upperEntry, error) {
	root, err := os.OpenRoot(upper)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var out []upperEntry
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		e := upperEntry{rel: p, info: fi}
		if fi.IsDir() {
			e.opaque = hasOpaqueXattr(root, p)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

func hasOpaqueXattr(root *os.Root, rel string) bool {
	f, err := root.Open(rel)
	if err != nil {
		return false
	}
	defer f.Close()
	buf := make([]byte, 4)
	n, err := unix.Fgetxattr(int(f.Fd()), opaqueXattr, buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// inLowers reports whether rel exists in the stack of lower directories
// (top first): the first layer that has it, or a whiteout of it, decides.
// An opaque directory above is not looked through: a layer made by a
// build step rarely has one, and the answer is only "added" or
// "modified".
func inLowers(lowers []string, rel string) bool {
	for _, l := range lowers {
		fi, err := os.Lstat(filepath.Join(l, filepath.FromSlash(rel)))
		if err == nil {
			return !isWhiteout(fi)
		}
	}
	return false
}

// changes turns a writable layer's entries into changes.
func changes(entries []upperEntry, lowers []string) []runtime.Change {
	var out []runtime.Change
	for _, e := range entries {
		c := runtime.Change{Path: "/" + e.rel, Mode: e.info.Mode(), Opaque: e.opaque}
		switch existed := inLowers(lowers, e.rel); {
		case isWhiteout(e.info):
			c.Kind, c.Mode = runtime.ChangeDeleted, 0
		case e.info.IsDir() && existed && !e.opaque:
			continue // copied up to hold changes below
		case existed:
			c.Kind = runtime.ChangeModified
		default:
			c.Kind = runtime.ChangeAdded
		}
		if e.info.Mode().IsRegular() {
			c.Size = e.info.Size()
		}
		out = append(out, c)
	}
	return out
}

// Changes lists what sandbox id changed, from its writable layer (the
// saved one of a sandbox paused to disk).
func (b *Backend) Changes(ctx context.Context, id string) ([]runtime.Change, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	upper, lowers := s.upperDir(), slices.Clone(s.meta.Lowers)
	if s.meta.Paused == pausedDisk {
		upper = filepath.Join(b.savedDir(id), "upper")
	}
	gone, rec := s.gone, s.writers
	s.mu.Unlock()
	if gone {
		return nil, fmt.Errorf("sandbox %s: %w", id, runtime.ErrNotFound)
	}
	if rec != nil {
		b.writers.sync() // what was written before the call is in the record
	}
	entries, err := walkUpper(upper)
	if err != nil {
		return nil, fmt.Errorf("changes of sandbox %s: %w", id, err)
	}
	chs := changes(entries, lowers)
	if rec != nil {
		if err := rec.attach(upper, chs); err != nil {
			return nil, fmt.Errorf("writers of sandbox %s: %w", id, err)
		}
	}
	return chs, nil
}

// ExportChanges writes sandbox id's writable layer as an OCI layer tar,
// while the sandbox is frozen.
func (b *Backend) ExportChanges(ctx context.Context, id string, w io.Writer) error {
	return b.withFrozenUpper(ctx, id, func(s *sandbox, upper string) error {
		var idBase uint32
		if s.meta.UserNS {
			idBase = userNSBase
		}
		entries, err := walkUpper(upper)
		if err != nil {
			return err
		}
		root, err := os.OpenRoot(upper)
		if err != nil {
			return err
		}
		defer root.Close()
		tw := tar.NewWriter(w)
		for _, e := range entries {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := writeTarEntry(tw, root, e, idBase); err != nil {
				return fmt.Errorf("export %s: %w", e.rel, err)
			}
		}
		return tw.Close()
	})
}

// writeTarEntry writes one entry of a writable layer in the OCI layer
// format, its owner unshifted by idBase.
func writeTarEntry(tw *tar.Writer, root *os.Root, e upperEntry, idBase uint32) error {
	dir, name := path.Split(e.rel)
	if isWhiteout(e.info) {
		return tw.WriteHeader(&tar.Header{Name: dir + ".wh." + name, Typeflag: tar.TypeReg, Mode: 0o644, ModTime: e.info.ModTime()})
	}
	var link string
	if e.info.Mode()&fs.ModeSymlink != 0 {
		l, err := root.Readlink(e.rel)
		if err != nil {
			return err
		}
		link = l
	}
	if e.info.Mode()&fs.ModeSocket != 0 {
		return nil // not representable, and meaningless once the sandbox is gone
	}
	hdr, err := tar.FileInfoHeader(e.info, link)
	if err != nil {
		return err
	}
	hdr.Name = e.rel
	if e.info.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	if st, ok := e.info.Sys().(*syscall.Stat_t); ok {
		hdr.Uid, hdr.Gid = int(unshiftID(st.Uid, idBase)), int(unshiftID(st.Gid, idBase))
	}
	hdr.Format = tar.FormatPAX // any name, long or not UTF-8, and nanosecond times
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if e.opaque {
		if err := tw.WriteHeader(&tar.Header{Name: e.rel + "/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
	}
	if !e.info.Mode().IsRegular() {
		return nil
	}
	f, err := root.Open(e.rel)
	if err != nil {
		return err
	}
	defer f.Close()
	// The size in the header is what was stat'ed: a file that grew since
	// (it cannot, frozen) would overflow the entry; copy exactly that.
	_, err = io.CopyN(tw, f, hdr.Size)
	return err
}

// ReadChanged opens path as the template has it and as the sandbox has it.
func (b *Backend) ReadChanged(ctx context.Context, id, p string) (old, cur io.ReadCloser, err error) {
	rel := strings.TrimPrefix(path.Clean("/"+p), "/")
	if rel == "" {
		return nil, nil, nil
	}
	s, err := b.get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	upper, lowers := s.upperDir(), slices.Clone(s.meta.Lowers)
	if s.meta.Paused == pausedDisk {
		upper = filepath.Join(b.savedDir(id), "upper")
	}
	s.mu.Unlock()
	openReg := func(dir string) (io.ReadCloser, bool, error) {
		root, err := os.OpenRoot(dir)
		if err != nil {
			return nil, false, err
		}
		defer root.Close()
		fi, err := root.Lstat(rel)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		if isWhiteout(fi) {
			return nil, true, nil
		}
		if !fi.Mode().IsRegular() {
			return nil, true, nil
		}
		f, err := root.OpenFile(rel, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return nil, true, err
		}
		return f, true, nil
	}
	cur, _, err = openReg(upper)
	if err != nil {
		return nil, nil, err
	}
	for _, l := range lowers {
		r, found, err := openReg(l)
		if err != nil {
			if cur != nil {
				cur.Close()
			}
			return nil, nil, err
		}
		if found {
			old = r
			break
		}
	}
	return old, cur, nil
}
