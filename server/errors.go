package server

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/sandboxd/sandboxd/errdefs"
)

// statusOf is the one place an error kind becomes an HTTP status on the
// REST surfaces.
func statusOf(err error) int {
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

// errorBody is E2B's error shape; code always equals the HTTP status (JS
// reads the body's code, Python the status).
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErrorStatus(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}

// writeError answers err with its mapped status. A user-facing message
// (errdefs.Public) is shown as is; any other cause is logged, and the client
// gets the status text plus the request id to quote, never internals.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status := statusOf(err)
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
	writeErrorStatus(w, status, msg)
}
