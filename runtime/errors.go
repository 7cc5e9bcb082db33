package runtime

import "errors"

// Errors a Backend returns, wrapped with what it knows (use errors.Is). The
// control plane maps them to its own error kinds in one place.
var (
	// ErrNotFound: no live sandbox has this id.
	ErrNotFound = errors.New("sandbox not found")
	// ErrAlreadyExists: Create with an id already in use.
	ErrAlreadyExists = errors.New("sandbox already exists")
	// ErrInvalidSpec: the spec cannot be satisfied as written.
	ErrInvalidSpec = errors.New("invalid sandbox spec")
	// ErrTemplateNotFound: the spec names a template the backend lacks.
	ErrTemplateNotFound = errors.New("template not found")
	// ErrPaused: the operation needs a running sandbox.
	ErrPaused = errors.New("sandbox is paused")
	// ErrNotRunning: the sandbox exists but its processes are gone (envd
	// died, or it was OOM-killed as a whole); only Destroy helps.
	ErrNotRunning = errors.New("sandbox is not running")
	// ErrUnavailable: envd did not answer in time, or a dependency of the
	// backend is missing; retrying may help.
	ErrUnavailable = errors.New("sandbox backend unavailable")
	// ErrRestarted: a pause to disk failed after the sandbox's processes
	// had ended, and the backend started it afresh instead: it runs, but
	// its envd is a new process that has to be initialised again.
	ErrRestarted = errors.New("sandbox was restarted")
	// ErrUnsupported: the backend cannot do this (for example a port Dial
	// before envd has a tunnel).
	ErrUnsupported = errors.New("not supported by this backend")
	// ErrInUse: the thing to remove (a layer) is used by a live sandbox.
	ErrInUse = errors.New("in use by a live sandbox")
)
