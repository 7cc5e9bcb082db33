package filesystem

import (
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/metadata"
)

// EntryInfo describes the entry at path the way E2B's envd does. It does not
// follow a final symlink: name, size, permissions string, owner, group and
// modification time are the link's own. Like E2B, a symlink that resolves
// reports its target's type and permission bits and the fully resolved target
// path, so clients treat a link to a directory as a directory. A dangling or
// looping symlink, which E2B reports with an unspecified type (JS drops those
// from listings), is reported as FILE_TYPE_SYMLINK with its literal target made
// absolute.
//
// mode carries permission bits only (0o644, not 0o100644), as E2B's SDK tests
// expect; permissions is Go's FileMode string of the entry itself
// ("-rw-r--r--", "drwxr-xr-x", "Lrwxrwxrwx").
//
// Errors are those of lstat(2) (fs.ErrNotExist for a missing path), unwrapped
// so callers can map them with rpcerr.
func EntryInfo(path string) (*filesystem.EntryInfo, error) {
	var n names
	return n.entry(path)
}

// names caches uid and gid lookups for one request: os/user parses
// /etc/passwd and /etc/group on every call, which would dominate a large
// ListDir. The cache never outlives a request, so accounts created in the
// sandbox meanwhile show up on the next one.
type names struct {
	users  map[uint32]string
	groups map[uint32]string
}

func (n *names) user(uid uint32) string {
	if s, ok := n.users[uid]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(s); err == nil {
		s = u.Username
	}
	if n.users == nil {
		n.users = map[uint32]string{}
	}
	n.users[uid] = s
	return s
}

func (n *names) group(gid uint32) string {
	if s, ok := n.groups[gid]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(s); err == nil {
		s = g.Name
	}
	if n.groups == nil {
		n.groups = map[uint32]string{}
	}
	n.groups[gid] = s
	return s
}

func (n *names) entry(path string) (*filesystem.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	e := &filesystem.EntryInfo{
		Name:         validUTF8(fi.Name()),
		Type:         fileType(fi.Mode()),
		Path:         validUTF8(path),
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = n.user(st.Uid)
		e.Group = n.group(st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, ti, err := resolveLink(path)
		if err == nil {
			e.Type = fileType(ti.Mode())
			e.Mode = uint32(ti.Mode().Perm())
		} else {
			e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
			e.Mode = 0
		}
		target = validUTF8(target)
		e.SymlinkTarget = &target
	}
	// Metadata is best effort, as in E2B: an entry whose xattrs cannot be
	// read is still worth returning.
	if md, err := metadata.Read(path); err == nil {
		e.Metadata = validMetadata(md)
	}
	return e, nil
}

// resolveLink returns where the symlink at path finally points and what is
// there. For a link that does not resolve (dangling, loop, too long) it
// returns the literal target, made absolute against the link's directory,
// and the error.
func resolveLink(path string) (string, fs.FileInfo, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err == nil {
		var fi fs.FileInfo
		if fi, err = os.Stat(resolved); err == nil {
			return resolved, fi, nil
		}
	}
	target, rerr := os.Readlink(path)
	if rerr != nil {
		return path, nil, err
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(path), target)
	}
	return filepath.Clean(target), nil, err
}

func fileType(m fs.FileMode) filesystem.FileType {
	switch {
	case m.IsRegular():
		return filesystem.FileType_FILE_TYPE_FILE
	case m.IsDir():
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return filesystem.FileType_FILE_TYPE_SYMLINK
	}
	// Devices, FIFOs and sockets: E2B reports them unspecified too.
	return filesystem.FileType_FILE_TYPE_UNSPECIFIED
}

// validUTF8 makes a file name safe for a proto string field. Linux names are
// arbitrary bytes, but protobuf refuses to marshal invalid UTF-8 in string
// fields, and one such name would otherwise fail a whole ListDir or end a
// watch stream. The replacement is lossy, which only matters for names no
// JSON client could spell anyway.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// validMetadata drops entries that a proto map<string,string> cannot carry;
// xattrs set inside the sandbox (setfattr) may hold arbitrary bytes.
func validMetadata(md map[string]string) map[string]string {
	for k, v := range md {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			delete(md, k)
		}
	}
	if len(md) == 0 {
		return nil
	}
	return md
}
