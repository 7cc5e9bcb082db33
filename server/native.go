package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/store"
)

// NativePrefix is where sandboxd's own API (openapi/native.yaml) is mounted.
// E2B's API lives below it at E2BPrefix; chi routes the longer prefix there.
const NativePrefix = "/v1/sandboxes"

// nativeAPI implements openapi/native.yaml on the lifecycle manager and on
// each sandbox's envd. Wire types stop here.
type nativeAPI struct {
	mgr *sandbox.Manager
	log *slog.Logger
	// idleTTL is the idle TTL of a create that names none; 0: none.
	idleTTL time.Duration
}

var _ nativeapi.ServerInterface = (*nativeAPI)(nil)

// newNative returns the native API's router, to be mounted at NativePrefix.
func newNative(cfg Config, lm *limitMetrics) http.Handler {
	a := &nativeAPI{mgr: cfg.Manager, log: cfg.Log, idleTTL: cfg.NativeIdleTTL}
	siw := &nativeapi.ServerInterfaceWrapper{
		Handler: a,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			writeNativeError(w, r, a.log, errdefs.New(errdefs.ErrInvalidArgument, err.Error()))
		},
	}
	r := chi.NewRouter()
	r.Use(nativeAuthenticate(cfg.Store, cfg.JWT, a.log), limitTenants(cfg.Limits, lm,
		func(w http.ResponseWriter, r *http.Request, msg string) {
			writeNativeError(w, r, a.log, errdefs.New(errdefs.ErrRateLimited, msg))
		}))
	for _, rt := range nativeRoutes(siw) {
		r.With(requireScope(rt.scope, a.log)).Method(rt.method, rt.pattern, rt.handler)
	}
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeNativeError(w, r, a.log, errdefs.New(errdefs.ErrNotFound, "no route "+r.Method+" "+r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeNativeError(w, r, a.log, errdefs.New(errdefs.ErrInvalidArgument, "method "+r.Method+" is not allowed on "+r.URL.Path))
	})
	return r
}

// nativeRoute is one endpoint of the native API with the JWT scope it needs.
type nativeRoute struct {
	method, pattern string // pattern is relative to NativePrefix
	scope           string
	operation       string // operationId in openapi/native.yaml
	handler         http.HandlerFunc
}

// nativeRoutes is the route table: every route names its scope here, and
// TestNativeRouteTable fails if one is empty or the spec has a route that
// is not in the table.
func nativeRoutes(siw *nativeapi.ServerInterfaceWrapper) []nativeRoute {
	const read, write = jwtauth.ScopeRead, jwtauth.ScopeWrite
	return []nativeRoute{
		{http.MethodPost, "/", write, "CreateSandbox", siw.CreateSandbox},
		{http.MethodGet, "/", read, "ListSandboxes", siw.ListSandboxes},
		{http.MethodGet, "/{id}", read, "GetSandbox", siw.GetSandbox},
		{http.MethodDelete, "/{id}", write, "DeleteSandbox", siw.DeleteSandbox},
		{http.MethodPost, "/{id}/exec", write, "Exec", siw.Exec},
		{http.MethodGet, "/{id}/exec/ws", write, "ExecWebsocket", siw.ExecWebsocket},
		{http.MethodPut, "/{id}/files", write, "UploadFile", siw.UploadFile},
		{http.MethodGet, "/{id}/files", write, "DownloadFile", siw.DownloadFile},
		{http.MethodDelete, "/{id}/files", write, "DeleteFile", siw.DeleteFile},
		{http.MethodGet, "/{id}/files/list", write, "ListFiles", siw.ListFiles},
	}
}

// nativeErrorCode is the stable code string of the native error shape.
func nativeErrorCode(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_argument"
	case http.StatusUnauthorized:
		return "unauthenticated"
	case http.StatusForbidden:
		return "permission_denied"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusConflict:
		return "conflict"
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return "resource_exhausted"
	case http.StatusNotImplemented:
		return "not_implemented"
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return "unavailable"
	case http.StatusGatewayTimeout:
		return "deadline_exceeded"
	}
	return "internal"
}

// writeNativeError is the native surface's one error writer: statusOf picks
// the status, the body is nativeapi.Error. As on the E2B surface, 5xx causes
// are logged and not shown unless they are errdefs.Public.
func writeNativeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	err = envdErr(err)
	status := statusOf(err)
	msg, public := errdefs.Public(err)
	reqID := middleware.GetReqID(r.Context())
	if !public {
		msg = err.Error()
		if status >= 500 {
			msg = http.StatusText(status) + " (request " + reqID + ")"
		}
	}
	if status >= 500 {
		log.ErrorContext(r.Context(), "request failed", "status", status, "err", err, "request_id", reqID,
			"method", r.Method, "path", r.URL.Path)
	}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		if w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", "1")
		}
	}
	var body nativeapi.Error
	body.Error.Code = nativeErrorCode(status)
	body.Error.Message = msg
	if reqID != "" {
		body.RequestId = &reqID
	}
	writeJSON(w, status, body)
}

// envdErr turns an error from a sandbox's envd (a Connect error or an
// envdStatusError) into an errdefs kind, keeping its message public: it
// describes the caller's own command or file, not sandboxd's internals.
func envdErr(err error) error {
	var ce *connect.Error
	var se *envdStatusError
	var kind error
	var msg string
	switch {
	case errors.As(err, &ce):
		msg = ce.Message()
		switch ce.Code() {
		case connect.CodeInvalidArgument, connect.CodeUnauthenticated, connect.CodeOutOfRange:
			kind = errdefs.ErrInvalidArgument // unknown user, bad path
		case connect.CodeNotFound:
			kind = errdefs.ErrNotFound
		case connect.CodeAlreadyExists:
			kind = errdefs.ErrAlreadyExists
		case connect.CodePermissionDenied:
			kind = errdefs.ErrPermissionDenied
		case connect.CodeFailedPrecondition, connect.CodeAborted:
			kind = errdefs.ErrConflict
		case connect.CodeResourceExhausted:
			kind = errdefs.ErrResourceExhausted
		case connect.CodeUnimplemented:
			kind = errdefs.ErrNotImplemented
		case connect.CodeDeadlineExceeded:
			kind = errdefs.ErrDeadlineExceeded
		default:
			return fmt.Errorf("%w: envd: %w", errdefs.ErrUnavailable, err)
		}
	case errors.As(err, &se):
		msg = se.msg
		switch se.status {
		case http.StatusBadRequest, http.StatusUnauthorized:
			kind = errdefs.ErrInvalidArgument
		case http.StatusNotFound:
			kind = errdefs.ErrNotFound
		case http.StatusForbidden:
			kind = errdefs.ErrPermissionDenied
		case http.StatusConflict:
			kind = errdefs.ErrConflict
		case http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage:
			kind = errdefs.ErrResourceExhausted
		default:
			return fmt.Errorf("%w: envd: %w", errdefs.ErrUnavailable, err)
		}
	default:
		return err
	}
	return errdefs.New(kind, msg)
}

// envdStatusError is a non-2xx answer of envd's /files.
type envdStatusError struct {
	status int
	msg    string
}

func (e *envdStatusError) Error() string { return fmt.Sprintf("envd: %d %s", e.status, e.msg) }

// envdConn reaches one sandbox's envd as one user, through the Manager (the
// backend's private channel), for the session; it is closed with close.
type envdConn struct {
	*envdconn.Client
	done func() // ends the activity the connection counts as
}

// envd looks the sandbox up for the caller's tenant (a foreign one is
// ErrNotFound) and returns a connection to its envd.
func (a *nativeAPI) envd(ctx context.Context, id, user string) (*envdConn, error) {
	sb, err := a.mgr.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State != store.StateRunning {
		return nil, errdefs.New(errdefs.ErrConflict, fmt.Sprintf("sandbox %q is %s", id, sb.State))
	}
	dial := func(ctx context.Context) (net.Conn, error) { return a.mgr.DialSandbox(ctx, id, runtime.EnvdPort) }
	// An exec, file or websocket call is activity for the idle TTL, for
	// as long as it lasts.
	done := a.mgr.Active(ctx, id)
	return &envdConn{Client: envdconn.NewClient(dial, sb.EnvdAccessToken, user), done: done}, nil
}

func (c *envdConn) close() {
	c.Close()
	c.done()
}

// envdStatus reads a failed /files answer into an envdStatusError.
func envdStatus(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	msg := strings.TrimSpace(string(b))
	var body struct {
		Message string `json:"message"`
	}
	if jsonUnmarshal(b, &body) == nil && body.Message != "" {
		msg = body.Message
	}
	return &envdStatusError{status: resp.StatusCode, msg: msg}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
