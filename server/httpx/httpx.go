// Package httpx holds what every HTTP surface of sandboxd shares: the one
// mapping of error kinds (errdefs) to HTTP statuses, JSON answers and
// E2B's error body, and strict JSON request decoding.
package httpx

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/ratelimit"
)

// Kinds that exist only at the HTTP layer; errdefs.New gives them a message.
var (
	ErrBodyTooLarge     = errors.New("request body too large")
	ErrMethodNotAllowed = errors.New("method not allowed")
)

// StatusOf is the one place an error kind becomes an HTTP status on the
// REST surfaces.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, ErrBodyTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrMethodNotAllowed):
		return http.StatusMethodNotAllowed
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
	case errors.Is(err, errdefs.ErrNoSpace):
		return http.StatusInsufficientStorage
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

// Describe is what a client is told of err: its mapped status and a
// message, err's own when public (errdefs.Public) or for a 4xx kind, else
// the status text.
func Describe(err error) (status int, msg string, public bool) {
	status = StatusOf(err)
	msg, public = errdefs.Public(err)
	if !public {
		msg = http.StatusText(status)
		if status < 500 {
			// 4xx kinds without a public message still say what kind.
			msg = err.Error()
		}
	}
	return status, msg, public
}

// WriteError answers err with its mapped status. A user-facing message
// (errdefs.Public) is shown as is; any other cause is logged, and the client
// gets the status text plus the request id to quote, never internals.
func WriteError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status, msg, public := Describe(err)
	if status >= 500 && status != http.StatusNotImplemented && status != http.StatusInsufficientStorage {
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

// DecodeJSON reads a JSON body of at most MaxJSONBody bytes strictly:
// unknown fields are errors (a typo does not silently fall back to a
// default), and so is anything after the one JSON value.
func DecodeJSON(r *http.Request, v any) error {
	return DecodeJSONLimit(r, v, MaxJSONBody)
}

// DecodeJSONLimit is DecodeJSON with a limit of limit bytes; a larger body
// is ErrBodyTooLarge.
func DecodeJSONLimit(r *http.Request, v any, limit int64) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyErr(err, limit)
	}
	return trailing(dec, limit)
}

// trailing fails unless dec is at the end of its input: `{...}xyz` or two
// values are not one JSON body.
func trailing(dec *json.Decoder, limit int64) error {
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil && isTooLarge(err) {
			return bodyErr(err, limit)
		}
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid JSON body: unexpected data after the JSON value")
	}
	return nil
}

func isTooLarge(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

// bodyErr says what is wrong with a body that did not decode.
func bodyErr(err error, limit int64) error {
	switch {
	case isTooLarge(err):
		return errdefs.New(ErrBodyTooLarge, fmt.Sprintf("request body is larger than %d bytes", limit))
	case errors.Is(err, io.EOF):
		return errdefs.New(errdefs.ErrInvalidArgument, "missing JSON body")
	}
	return errdefs.New(errdefs.ErrInvalidArgument, "invalid JSON body: "+err.Error())
}

// LimitJSONBody is middleware for handlers that decode their own body (the
// generated E2B server): it reads a body of at most limit bytes, refuses a
// larger one or one that is not a single JSON value, and hands the handler
// the bytes it read. onErr answers the refusal in the surface's error shape.
func LimitJSONBody(limit int64, onErr func(http.ResponseWriter, *http.Request, error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Body == nil || r.Body == http.NoBody {
				next.ServeHTTP(w, r)
				return
			}
			// With w, the server closes the connection after a 413 instead
			// of reading the rest of an oversize body.
			raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
			if err != nil {
				onErr(w, r, bodyErr(err, limit))
				return
			}
			if len(bytes.TrimSpace(raw)) > 0 {
				dec := json.NewDecoder(bytes.NewReader(raw))
				var v json.RawMessage
				if err := dec.Decode(&v); err != nil {
					onErr(w, r, bodyErr(err, limit))
					return
				}
				if err := trailing(dec, limit); err != nil {
					onErr(w, r, err)
					return
				}
			}
			r.Body = io.NopCloser(bytes.NewReader(raw))
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), rawBodyKey{}, raw)))
		})
	}
}

type rawBodyKey struct{}

// RawBody is the body LimitJSONBody read, for the checks a generated
// decoder cannot make (a JSON null where the spec has no nullable field).
func RawBody(ctx context.Context) []byte {
	b, _ := ctx.Value(rawBodyKey{}).([]byte)
	return b
}

// MapLimits bounds a string-to-string map of a request (metadata, env).
type MapLimits struct {
	Entries          int // most entries
	KeyLen, ValueLen int // longest key and value, in bytes
}

// The bounds of a sandbox's metadata and environment on both APIs, stated
// in their specs. E2B publishes none, so these are sandboxd's: room for any
// real use, while metadata, which every list and get returns, stays small.
var (
	MetadataLimits = MapLimits{Entries: 100, KeyLen: 256, ValueLen: 4096}
	EnvLimits      = MapLimits{Entries: 1000, KeyLen: 256, ValueLen: 32 << 10}
)

// CheckMap refuses m (named name in the message) when it exceeds lim or has
// an empty key.
func CheckMap(name string, m map[string]string, lim MapLimits) error {
	if len(m) > lim.Entries {
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("%s: %d entries; at most %d", name, len(m), lim.Entries))
	}
	for k, v := range m {
		switch {
		case k == "":
			return errdefs.New(errdefs.ErrInvalidArgument, name+": empty key")
		case len(k) > lim.KeyLen:
			return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("%s: key %.32q... is %d bytes; at most %d", name, k, len(k), lim.KeyLen))
		case len(v) > lim.ValueLen:
			return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("%s: value of %.32q is %d bytes; at most %d", name, k, len(v), lim.ValueLen))
		}
	}
	return nil
}

// SetAllow sets the Allow header of a 405 answer (which must carry it) to
// the methods routes serves at r's path; chi hands a custom 405 handler
// no list of its own.
func SetAllow(w http.ResponseWriter, r *http.Request, routes chi.Routes) {
	path := r.URL.Path
	if rctx := chi.RouteContext(r.Context()); rctx != nil && rctx.RoutePath != "" {
		path = rctx.RoutePath // below the mount point
	}
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if routes.Match(chi.NewRouteContext(), m, path) {
			allow = append(allow, m)
		}
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
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
	retry = RetryAfter(d)
	h.Set("Retry-After", strconv.Itoa(retry))
	return retry
}

// RetryAfter is the whole seconds (at least 1) until a refused d would pass.
func RetryAfter(d ratelimit.Decision) int {
	return max(int(math.Ceil(d.RetryAfter.Seconds())), 1)
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
