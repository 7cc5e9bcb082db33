// Package rpcerr maps envd's errors to the codes E2B's SDKs branch on, in one
// place per surface: Connect codes for RPCs, HTTP statuses for /files.
package rpcerr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"io/fs"
	"net/http"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/envd/internal/metadata"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
)

// Kind errors that packages wrap with %w when no syscall error says it.
var (
	ErrInvalidArgument = errors.New("invalid argument")
	ErrNotFound        = errors.New("not found")
	ErrAlreadyExists   = errors.New("already exists")
	// ErrFailedPrecondition: the target is in the wrong state for the call
	// (stdin of a process that has none, a resize of a non-PTY process).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrResourceExhausted: a bounded buffer or limit was exceeded.
	ErrResourceExhausted = errors.New("resource exhausted")
)

// Kindf returns an error of kind (one of the Err kinds above, for errors.Is)
// whose message is the formatted text alone, without the kind's name: for
// answers whose message must be E2B envd's exact text.
func Kindf(kind error, format string, a ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, a...)}
}

type kindError struct{ kind, err error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// Code returns the Connect code for err.
func Code(err error) connect.Code {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return ce.Code()
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, permissions.ErrUnknownUser),
		errors.Is(err, envdapi.ErrBadSignature), errors.Is(err, envdapi.ErrMissingSignature),
		errors.Is(err, envdapi.ErrExpiredSignature):
		return connect.CodeUnauthenticated
	case errors.Is(err, ErrInvalidArgument), errors.Is(err, permissions.ErrBadPath),
		errors.Is(err, metadata.ErrInvalid),
		errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EISDIR), errors.Is(err, unix.EINVAL),
		errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTEMPTY),
		errors.Is(err, unix.EXDEV):
		return connect.CodeInvalidArgument
	case errors.Is(err, ErrFailedPrecondition):
		return connect.CodeFailedPrecondition
	case errors.Is(err, ErrResourceExhausted):
		return connect.CodeResourceExhausted
	case errors.Is(err, ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return connect.CodeNotFound
	case errors.Is(err, ErrAlreadyExists), errors.Is(err, fs.ErrExist):
		return connect.CodeAlreadyExists
	case errors.Is(err, fs.ErrPermission), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		return connect.CodePermissionDenied
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errors.Is(err, unix.EMFILE):
		return connect.CodeResourceExhausted
	}
	return connect.CodeInternal
}

// Connect wraps err as a *connect.Error with its mapped code (unchanged if it
// already is one). nil stays nil.
func Connect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	return connect.NewError(Code(err), err)
}

// HTTPStatus returns the status of a plain-HTTP envd error (E2B's /files
// contract: 400, 401, 404, 507 for a full disk, 500 otherwise).
func HTTPStatus(err error) int {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return http.StatusInsufficientStorage
	}
	switch Code(err) {
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodeInvalidArgument:
		return http.StatusBadRequest
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

// WriteJSON writes an error body whose code equals the HTTP status, as E2B's
// SDKs expect.
func WriteJSON(w http.ResponseWriter, status int, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, message})
}
