package runtime

import (
	"context"
	"io"
	"io/fs"
)

// Differ is a backend that can say what a sandbox changed in its root
// filesystem since it was created, from its writable layer (not by walking
// the whole tree), and hand those changes out as a layer tar. Workspaces
// (inspect, export, publish) are built on it.
type Differ interface {
	// Changes lists what sandbox id added, modified and deleted, sorted
	// by path. A directory that only holds changes is not itself one.
	// ErrNotFound for a sandbox that is gone.
	Changes(ctx context.Context, id string) ([]Change, error)
	// ExportChanges writes sandbox id's changes to w as an uncompressed
	// tar in the OCI layer format: files, directories, symlinks and
	// special files as they are now (owners as the sandbox sees them), a
	// deletion as a ".wh.<name>" entry and a directory whose old content
	// is hidden as "<dir>/.wh..wh..opq". The sandbox is frozen while it is
	// read, so the tar is one moment's files.
	ExportChanges(ctx context.Context, id string, w io.Writer) error
	// ReadChanged opens the file at path (absolute, in the sandbox) as
	// its template has it (old; nil when it has none) and as the sandbox
	// has it now (cur; nil when deleted), for a diff. Only regular files
	// are opened; anything else is nil.
	ReadChanged(ctx context.Context, id, path string) (old, cur io.ReadCloser, err error)
}

// ChangeKind says what happened to a path.
type ChangeKind string

const (
	ChangeAdded    ChangeKind = "added"
	ChangeModified ChangeKind = "modified"
	ChangeDeleted  ChangeKind = "deleted"
)

// Change is one path a sandbox changed.
type Change struct {
	// Path is absolute, as the sandbox sees it. It may hold any byte but
	// NUL and '/' in a name, newlines and invalid UTF-8 included.
	Path string
	Kind ChangeKind
	// Mode is the type and permissions of what is there now (for a
	// deletion: zero). Size is a regular file's size.
	Mode fs.FileMode
	Size int64
	// Opaque: a directory that replaced the template's directory of that
	// path, hiding everything that was in it.
	Opaque bool
}
