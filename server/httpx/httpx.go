// Package httpx holds what every HTTP surface of sandboxd shares: the one
// mapping of error kinds (errdefs) to HTTP statuses, JSON answers and
// E2B's error body, and strict JSON request decoding.
package httpx

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/ratelimit"
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

// LimitHeaders sets the X-RateLimit-* headers of d, and Retry-After when d
// refuses; it returns the Retry-After seconds.
func LimitHeaders(w http.ResponseWriter, d ratelimit.Decision) (retry int) {
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.Itoa(max(d.Limit.Burst, 1)))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(d.Remaining))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Add(d.Reset).Unix(), 10))
	if d.Allowed {
		return 0
	}
	retry = max(int(math.Ceil(d.RetryAfter.Seconds())), 1)
	h.Set("Retry-After", strconv.Itoa(retry))
	return retry
}

// LimitMessage says which limit refused a request and when to retry.
func LimitMessage(d ratelimit.Decision, class string, retry int) string {
	return fmt.Sprintf("rate limit exceeded for %s requests (%g/s, burst %d); retry in %ds",
		class, d.Limit.Rate, max(d.Limit.Burst, 1), retry)
}

// StatusRecorder remembers the status a handler wrote. Unwrap lets
// http.ResponseController reach the real writer's Flush, Hijack and
// EnableFullDuplex; Flush is also implemented directly for handlers that
// type-assert http.Flusher.
type StatusRecorder struct {
	http.ResponseWriter
	Status int // 0 until written
}

func (r *StatusRecorder) WriteHeader(code int) {
	// 1xx other than 101 are informational; the final status comes later.
	if r.Status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		r.Status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *StatusRecorder) Write(b []byte) (int, error) {
	if r.Status == 0 {
		r.Status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *StatusRecorder) Flush() {
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

// Hijack takes over the connection (an upgrade such as a websocket): the
// status is then 101, written by whoever hijacked.
func (r *StatusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(r.ResponseWriter).Hijack()
	if err == nil && r.Status == 0 {
		r.Status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

func (r *StatusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
