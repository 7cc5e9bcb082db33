// Package errdefs holds the kinds of failure sandboxd's packages report and
// its surfaces translate: each surface (E2B REST, native REST, proxy) maps a
// kind to its status in one function, so a failure never changes status
// depending on which handler met it. Standard library only.
package errdefs

import "errors"

// The kinds. Wrap them with fmt.Errorf("...: %w", errdefs.ErrNotFound).
var (
	ErrInvalidArgument   = errors.New("invalid argument")
	ErrUnauthenticated   = errors.New("unauthenticated")
	ErrPermissionDenied  = errors.New("permission denied")
	ErrNotFound          = errors.New("not found")
	ErrAlreadyExists     = errors.New("already exists")
	ErrConflict          = errors.New("conflict") // wrong state for the action, e.g. pausing a paused sandbox
	ErrResourceExhausted = errors.New("resource exhausted")
	ErrRateLimited       = errors.New("rate limited")
	ErrUnavailable       = errors.New("unavailable") // host capacity, backend down: retry later
	ErrNotImplemented    = errors.New("not implemented")
	ErrDeadlineExceeded  = errors.New("deadline exceeded")
	// ErrNoSpace: a write found the volume or disk full (ENOSPC).
	ErrNoSpace = errors.New("no space left")
)

// IsNotFound reports whether err is of kind ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is of kind ErrConflict.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// Error is a kind plus a message safe to show to the caller, for failures
// whose text is meant for users (validation messages); other errors' text is
// logged, never echoed on 5xx.
type Error struct {
	Kind    error
	Message string
}

func (e *Error) Error() string { return e.Message }

// Unwrap lets errors.Is see the kind.
func (e *Error) Unwrap() error { return e.Kind }

// New returns an error of kind with a user-facing message.
func New(kind error, message string) error { return &Error{Kind: kind, Message: message} }

// Public returns the user-facing message of err, if it carries one.
func Public(err error) (string, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Message, true
	}
	return "", false
}
