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
	// Writer is the process that last created, renamed, changed the
	// attributes of or closed after writing what is at Path, where the
	// backend recorded it (a WriterTracker); nil for a deletion, and
	// where nothing was recorded. Shared between changes: read only.
	Writer *Writer
}

// Writer is a process that wrote to a sandbox's filesystem, as the
// sandbox saw it when the backend looked (best effort: a process that had
// exited left less to see).
type Writer struct {
	// PID is its pid in the sandbox's pid namespace.
	PID int
	// Comm is its kernel name (at most 15 bytes).
	Comm string
	// Command is its argv joined by spaces, cut at MaxWriterCommand
	// bytes; "" when it had exited.
	Command string
	// EnvdPID is the pid (in the sandbox) of the command envd started
	// that this process is or descends from: the leader of its session,
	// as envd makes every command one. 0 when it is envd itself or not
	// one of envd's commands, or when that leader had gone.
	EnvdPID int
}

// MaxWriterCommand bounds Writer.Command.
const MaxWriterCommand = 256

// WriterTracker is a Differ that records which process wrote each path
// (Change.Writer). Its record per sandbox is bounded; WritersTruncated
// says when it stopped growing (or lost events), so that a change without
// a writer may have had one.
type WriterTracker interface {
	WritersTruncated(ctx context.Context, id string) (bool, error)
}
