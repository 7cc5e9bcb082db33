package local

// The layer copy of a pause to disk and of its resume: a walk by directory
// fds (no path is ever resolved through the sandbox's symlinks, and depth is
// not bounded by PATH_MAX) that keeps what overlayfs needs: whiteouts,
// xattrs (opaque directories), owners, modes, times, hard links and holes.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// copyTreeArg is the os.Args[1] of the child process that restores an
// upper layer (see Init).
const copyTreeArg = "sandboxd-local-copytree"

// copyTreeInCgroup runs copyTree(src, dst) in a child process that joins
// the cgroup at path before it writes anything.
func copyTreeInCgroup(ctx context.Context, path, src, dst string) error {
	m, err := cgroupManager(path)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, copyTreeArg, src, dst)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	// The child copies only once it reads the go-ahead, after joining.
	if err := m.Apply(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("join cgroup %s: %w", path, err)
	}
	_, _ = stdin.Write([]byte{1})
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("copy %s: %w: %s", src, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// copyTreeMain is the child of copyTreeInCgroup.
func copyTreeMain(args []string) {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: "+copyTreeArg+" SRC DST")
		os.Exit(2)
	}
	var go1 [1]byte
	if n, _ := os.Stdin.Read(go1[:]); n != 1 {
		os.Exit(3) // the parent gave up
	}
	if err := copyTree(args[0], args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// copyTree copies the tree at src to dst, which must be empty or not exist, with all
// that an overlayfs upper layer holds: file types including the 0/0
// character devices of whiteouts, ownership, modes, all extended attributes
// (trusted.overlay.* marks opaque directories and more, security.capability
// file capabilities), timestamps, symlinks and hard links. It follows no
// symlink. Its source must be quiet: no process of the sandbox runs while a
// layer is copied.
//
// It works on directory fds and names (openat, mkdirat, ...), never on
// full paths: a sandbox can make paths longer than PATH_MAX (by relative
// steps), which must not make its layer impossible to save or restore. It
// holds two fds per level of depth.
func copyTree(src, dst string) error { return copyTreeIDs(src, dst, 0) }

// copyTreeIDs is copyTree that shifts the ids of the sandboxes' user
// namespace range starting at idBase back by it (owners, and the ids that
// file capabilities and ACLs hold: see unshiftXattr), making a sandbox's
// upper layer a layer that reads the same through an idmapped view. An
// idBase of 0 keeps ids as they are.
func copyTreeIDs(src, dst string, idBase uint32) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("copy %s: not a directory", src)
	}
	if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	sf, err := openDir(unix.AT_FDCWD, src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer sf.Close()
	df, err := openDir(unix.AT_FDCWD, dst)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer df.Close()
	c := &treeCopier{root: df, links: map[fileKey]linkLoc{}, idBase: idBase}
	if err := c.dir(sf, df, nil); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	// The root's own metadata: what the entries' creation changed last.
	if err := c.setMeta(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, &st); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

type fileKey struct{ dev, ino uint64 }

// linkLoc is where the first copy of a hard-linked file went: its
// directory (names from the root of the copy) and name.
type linkLoc struct {
	dir  []string
	name string
}

type treeCopier struct {
	root   *os.File // dst
	links  map[fileKey]linkLoc
	idBase uint32 // see copyTreeIDs
}

// openDir opens the directory name under dirfd, following no symlink.
func openDir(dirfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// dir copies the entries of the directory src into dst; rel is dst's path
// from the root of the copy, as names.
func (c *treeCopier) dir(src, dst *os.File, rel []string) error {
	names, err := src.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", strings.Join(rel, "/"), err)
	}
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	for _, name := range names {
		if err := c.entry(sfd, dfd, name, rel); err != nil {
			if _, ok := errors.AsType[*copyError](err); ok {
				return err // named by a deeper level
			}
			return &copyError{path: path.Join(append(rel, name)...), err: err}
		}
	}
	return nil
}

// copyError is a failure of copyTree at path (relative to the tree).
type copyError struct {
	path string
	err  error
}

func (e *copyError) Error() string { return e.path + ": " + e.err.Error() }
func (e *copyError) Unwrap() error { return e.err }

// entry copies src's entry name to dst.
func (c *treeCopier) entry(sfd, dfd int, name string, rel []string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return fmt.Errorf("mkdir: %w", err)
		}
		sub, err := openDir(sfd, name)
		if err != nil {
			return err
		}
		defer sub.Close()
		dsub, err := openDir(dfd, name)
		if err != nil {
			return err
		}
		defer dsub.Close()
		if err := c.dir(sub, dsub, append(slices.Clip(rel), name)); err != nil {
			return err
		}
		// Last: creating its entries changed its times.
		return c.setMeta(sfd, name, dfd, name, &st)
	case unix.S_IFREG:
		k := fileKey{st.Dev, st.Ino}
		if first, ok := c.links[k]; ok {
			return c.link(first, dfd, name)
		}
		if err := copyFileAt(sfd, dfd, name, st.Size); err != nil {
			return err
		}
		if st.Nlink > 1 {
			c.links[k] = linkLoc{dir: slices.Clone(rel), name: name}
		}
	case unix.S_IFLNK:
		to, err := readlinkat(sfd, name)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(to, dfd, name); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
	case unix.S_IFCHR, unix.S_IFBLK:
		// Only overlayfs's whiteouts (0/0) belong here: a sandbox
		// cannot make device nodes, and none is ever copied to the
		// host's disk.
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			return nil
		}
		fallthrough
	default: // fifos, sockets
		if err := unix.Mknodat(dfd, name, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod: %w", err)
		}
	}
	return c.setMeta(sfd, name, dfd, name, &st)
}

// link makes name in dfd a hard link to the first copy at loc, reaching
// its directory one name at a time.
func (c *treeCopier) link(loc linkLoc, dfd int, name string) error {
	dir := c.root
	for _, n := range loc.dir {
		d, err := openDir(int(dir.Fd()), n)
		if dir != c.root {
			dir.Close()
		}
		if err != nil {
			return err
		}
		dir = d
	}
	if dir != c.root {
		defer dir.Close()
	}
	if err := unix.Linkat(int(dir.Fd()), loc.name, dfd, name, 0); err != nil {
		return fmt.Errorf("link: %w", err)
	}
	return nil
}

// readlinkat returns the target of the symlink name in dirfd.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", fmt.Errorf("readlink: %w", err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// fdPath names the entry name of the directory dirfd for the calls that
// have no *at form (the xattr calls): /proc/self/fd/N is followed to the
// directory, name is not followed, and the path stays short however deep
// the directory is.
func fdPath(dirfd int, name string) string {
	if dirfd == unix.AT_FDCWD {
		return name
	}
	return "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
}

// setMeta gives the copy dname in dfd the ownership, mode, extended
// attributes and times of the original (st, sname in sfd).
func (c *treeCopier) setMeta(sfd int, sname string, dfd int, dname string, st *unix.Stat_t) error {
	// chown clears setuid bits and file capabilities: it goes first.
	uid, gid := unshiftID(st.Uid, c.idBase), unshiftID(st.Gid, c.idBase)
	if err := unix.Fchownat(dfd, dname, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(dfd, dname, st.Mode&0o7777, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := copyXattrs(fdPath(sfd, sname), fdPath(dfd, dname), c.idBase); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(dfd, dname, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("utimes: %w", err)
	}
	return nil
}

// copyFileAt copies the regular file name of sfd to a new file name in
// dfd, keeping its holes: a sandbox can make a sparse file far larger than
// its disk, which must take no more room on the host's disk (or on its
// tmpfs when it comes back) than it did.
func copyFileAt(sfd, dfd int, name string, size int64) error {
	ifd, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	in := os.NewFile(uintptr(ifd), name)
	defer in.Close()
	ofd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	out := os.NewFile(uintptr(ofd), name)
	if err := copyData(in, out, size); err != nil {
		out.Close()
		return fmt.Errorf("copy: %w", err)
	}
	return out.Close()
}

// copyData copies the data extents of in (SEEK_DATA/SEEK_HOLE) to the same
// offsets of out and sets out's size.
func copyData(in, out *os.File, size int64) error {
	fd := int(in.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		hole = min(hole, size)
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// copyXattrs copies every extended attribute of src to dst (neither
// followed if a symlink), with ids unshifted by idBase (copyTreeIDs).
func copyXattrs(src, dst string, idBase uint32) error {
	names, err := listXattrs(src)
	if err != nil {
		return fmt.Errorf("list xattrs of %s: %w", src, err)
	}
	for _, name := range names {
		val, err := getXattr(src, name)
		if err != nil {
			return fmt.Errorf("get xattr %s of %s: %w", name, src, err)
		}
		if idBase != 0 {
			val = unshiftXattr(name, val, idBase)
		}
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", name, dst, err)
		}
	}
	return nil
}

func listXattrs(p string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := unix.Llistxattr(p, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, sz+64)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
}

func getXattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := unix.Lgetxattr(p, name, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, sz+64)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// syncDir flushes the tree at dir to disk, so that a saved layer that
// meta.json points to is there after a power loss too.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
