// Package httpx holds what every HTTP surface of sandboxd shares: the one
// mapping of error kinds (errdefs) to HTTP statuses, JSON answers and
// E2B's error body, and strict JSON request decoding.
package httpx

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/sandboxd/sandboxd/errdefs"
)

// StatusOf is the one place an error kind becomes an HTTP status on the
// REST surfaces.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrRateLimited), errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusTooManyRequests
	case errors.Is(err, errdefs.ErrNotImplemented):
		return http.StatusNotImplemented
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, errdefs.ErrDeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// ErrorBody is E2B's error shape; code always equals the HTTP status (JS
// reads the body's code, Python the status).
type ErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// WriteJSON answers status with v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteErrorStatus answers status with E2B's error body.
func WriteErrorStatus(w http.ResponseWriter, status int, msg string) {
	WriteJSON(w, status, ErrorBody{Code: status, Message: msg})
}

// WriteError answers err with its mapped status. A user-facing message
// (errdefs.Public) is shown as is; any other cause is logged, and the client
// gets the status text plus the request id to quote, never internals.
func WriteError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status := StatusOf(err)
	msg, public := errdefs.Public(err)
	if !public {
		msg = http.StatusText(status)
		if status < 500 {
			// 4xx kinds without a public message still say what kind.
			msg = err.Error()
		}
	}
	if status >= 500 && status != http.StatusNotImplemented {
		reqID := middleware.GetReqID(r.Context())
		log.ErrorContext(r.Context(), "request failed", "status", status, "err", err, "request_id", reqID,
			"method", r.Method, "path", r.URL.Path)
		if !public {
			msg += " (request " + reqID + ")"
		}
	}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		if w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", strconv.Itoa(int(time.Second.Seconds())))
		}
	}
	WriteErrorStatus(w, status, msg)
}

// MaxJSONBody bounds JSON bodies; an exec body carries its stdin.
const MaxJSONBody = 16 << 20

// DecodeJSON reads a JSON body strictly (unknown fields are errors, so a
// typo does not silently fall back to a default).
func DecodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, MaxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errdefs.New(errdefs.ErrInvalidArgument, "missing JSON body")
		}
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid JSON body: "+err.Error())
	}
	return nil
}

// Deref is *p, or the zero value when p is nil (an absent optional field).
func Deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
