// Package native implements sandboxd's own API (openapi/native.yaml) on
// the lifecycle manager and on each sandbox's envd: sandboxes, exec (one
// shot and over a websocket) and files. The server mounts its Routes behind
// its auth and limits.
package native

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/server/proxy"
	"github.com/sandboxd/sandboxd/workspace"
)

// API implements openapi/native.yaml on the lifecycle manager and on
// each sandbox's envd. Wire types stop here.
type API struct {
	mgr *sandbox.Manager
	ws  *workspace.Service
	log *slog.Logger
	// idleTTL is the idle TTL of a create that names none; 0: none.
	idleTTL time.Duration
	// wsWriteWait is how long a websocket write may wait on its client.
	wsWriteWait time.Duration
	// wsPingPeriod is how often exec/ws pings an idle client.
	wsPingPeriod time.Duration
	// up carries every call to every sandbox's envd, so that calls reuse
	// connections (each a stream over the backend's private channel)
	// instead of dialing afresh; client sends through it.
	up     *proxy.Upstream
	client *http.Client
}

var _ nativeapi.ServerInterface = (*API)(nil)

// Config configures an API.
type Config struct {
	Manager *sandbox.Manager
	// Workspace serves changes, diff, export, publish and versions.
	Workspace *workspace.Service
	Log       *slog.Logger
	// IdleTTL is the idle TTL of creates that name none; 0: none.
	IdleTTL time.Duration
	// WSWriteWait is how long exec/ws waits for a client that takes no
	// output before it ends the session (and kills the process unless it
	// is detached); 0: 30 s.
	WSWriteWait time.Duration
	// WSPingPeriod is how often exec/ws pings its client, so that proxies
	// keep an idle websocket open; 0: 20 s.
	WSPingPeriod time.Duration
}

// New returns the native API on cfg.Manager. Routes lists its endpoints;
// the caller routes them, authenticates (WithScopes) and answers its own
// errors with WriteError.
func New(cfg Config) *API {
	a := &API{mgr: cfg.Manager, ws: cfg.Workspace, log: cfg.Log, idleTTL: cfg.IdleTTL,
		wsWriteWait: cfg.WSWriteWait, wsPingPeriod: cfg.WSPingPeriod}
	if a.wsWriteWait <= 0 {
		a.wsWriteWait = wsWriteWait
	}
	if a.wsPingPeriod <= 0 {
		a.wsPingPeriod = wsPingPeriod
	}
	a.up = proxy.NewUpstream(cfg.Manager.DialSandbox, nil)
	a.client = &http.Client{Transport: a.up.Transport()}
	// A connection pooled across a pause would hang; see proxy.Upstream.
	cfg.Manager.OnStop(a.up.CloseSandbox)
	return a
}

type scopesKey struct{}

// WithScopes records the scopes granted to the caller in ctx.
func WithScopes(ctx context.Context, scopes []string) context.Context {
	return context.WithValue(ctx, scopesKey{}, scopes)
}

// HasScope reports whether the caller in ctx was granted scope.
func HasScope(ctx context.Context, scope string) bool {
	granted, _ := ctx.Value(scopesKey{}).([]string)
	return slices.Contains(granted, scope)
}

// Route is one endpoint of the native API with the JWT scope it needs.
type Route struct {
	Method, Pattern string // Pattern is relative to where the API is mounted
	Scope           string
	Operation       string // operationId in openapi/native.yaml
	Handler         http.HandlerFunc
}

// Routes is the route table: every route names its scope here, and
// TestNativeRouteTable fails if one is empty or the spec has a route that
// is not in the table.
func Routes(siw *nativeapi.ServerInterfaceWrapper) []Route {
	const read, write = jwtauth.ScopeRead, jwtauth.ScopeWrite
	return []Route{
		{http.MethodPost, "/", write, "CreateSandbox", siw.CreateSandbox},
		{http.MethodGet, "/", read, "ListSandboxes", siw.ListSandboxes},
		{http.MethodGet, "/{id}", read, "GetSandbox", siw.GetSandbox},
		{http.MethodDelete, "/{id}", write, "DeleteSandbox", siw.DeleteSandbox},
		{http.MethodPut, "/{id}/network", write, "PutSandboxNetwork", siw.PutSandboxNetwork},
		{http.MethodPost, "/{id}/exec", write, "Exec", siw.Exec},
		{http.MethodGet, "/{id}/exec/ws", write, "ExecWebsocket", siw.ExecWebsocket},
		{http.MethodPut, "/{id}/files", write, "UploadFile", siw.UploadFile},
		{http.MethodGet, "/{id}/files", write, "DownloadFile", siw.DownloadFile},
		{http.MethodDelete, "/{id}/files", write, "DeleteFile", siw.DeleteFile},
		{http.MethodGet, "/{id}/files/list", write, "ListFiles", siw.ListFiles},
		{http.MethodGet, "/{id}/changes", read, "GetChanges", siw.GetChanges},
		{http.MethodGet, "/{id}/diff", read, "GetDiff", siw.GetDiff},
		{http.MethodGet, "/{id}/export", write, "ExportChanges", siw.ExportChanges},
		{http.MethodPost, "/{id}/publish", write, "Publish", siw.Publish},
		{http.MethodGet, "/{id}/versions", read, "ListVersions", siw.ListVersions},
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
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
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

// WriteError is the native surface's one error writer: Describe says what
// to answer, the body is nativeapi.Error. As on the E2B surface, 5xx causes
// are logged and not shown unless they are errdefs.Public.
func WriteError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status, code, msg, public := Describe(err)
	reqID := middleware.GetReqID(r.Context())
	if !public && status >= 500 {
		msg += " (request " + reqID + ")"
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
	body.Error.Code = code
	body.Error.Message = msg
	if reqID != "" {
		body.RequestId = &reqID
	}
	httpx.WriteJSON(w, status, body)
}

// Describe is what the native surfaces tell a caller of err: its status,
// the stable code of the native error shape and a message, err's own when
// public or of a 4xx kind, else the status text. An error of a sandbox's
// envd is described by its kind (see envdErr). WriteError answers with it;
// so does the MCP server, whose tools work on the same sandboxes.
func Describe(err error) (status int, code, msg string, public bool) {
	err = envdErr(err)
	status = httpx.StatusOf(err)
	msg, public = errdefs.Public(err)
	if !public {
		msg = err.Error()
		if status >= 500 {
			msg = http.StatusText(status)
		}
	}
	return status, nativeErrorCode(status), msg, public
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

// envdConn reaches one sandbox's envd as one user, through the API's shared
// client; close ends the activity it counts as.
type envdConn struct {
	*envdconn.Client
	done func() // ends the activity the connection counts as
}

// envd looks the sandbox up for the caller's tenant (a foreign one is
// ErrNotFound) and returns a connection to its envd.
func (a *API) envd(ctx context.Context, id, user string) (*envdConn, error) {
	sb, err := a.mgr.GetView(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State != sandbox.StateRunning {
		return nil, errdefs.New(errdefs.ErrConflict, fmt.Sprintf("sandbox %q is %s", id, sb.State))
	}
	// An exec, file or websocket call is activity for the idle TTL, for
	// as long as it lasts.
	done := a.mgr.Active(ctx, id)
	c := envdconn.NewSharedClient(a.client, a.up.BaseURL(id, runtime.EnvdPort), sb.EnvdAccessToken, user)
	return &envdConn{Client: c, done: done}, nil
}

func (c *envdConn) close() { c.done() }

// Envd connects to sandbox id's envd as user (envd's default when empty),
// through the API's shared connections, for another surface of the same
// sandboxes (MCP): the sandbox is looked up for the tenant in ctx (a foreign
// one is ErrNotFound) and must be running, and the call counts as activity
// for the idle TTL until done is called.
func (a *API) Envd(ctx context.Context, id, user string) (c *envdconn.Client, done func(), err error) {
	ec, err := a.envd(ctx, id, user)
	if err != nil {
		return nil, nil, err
	}
	return ec.Client, ec.done, nil
}

// EnvdStatus reads a failed answer of envd's /files into an error that
// Describe and WriteError map by its status.
func EnvdStatus(resp *http.Response) error {
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

func ptr[T any](v T) *T { return &v }
