// Package files serves envd's GET and POST /files: downloads and uploads as a
// chosen user, authorised by the access token or a v1 URL signature.
//
// The contract is E2B's (wire doc §3.4-3.6): `path` and `username` query
// parameters, raw bytes out (Range, conditional requests, optional gzip),
// multipart/form-data or application/octet-stream in, a JSON array of
// written entries back, and errors as {"code": status, "message": ...}.
package files

import (
	"errors"
	"fmt"
	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/sandboxd/sandboxd/envd/internal/auth"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// Handler serves /files.
type Handler struct {
	log      *slog.Logger
	defaults *execctx.Defaults
	token    *auth.Token
}

// New returns the /files handler. token may be nil (no auth, as with an
// unset token).
func New(log *slog.Logger, defaults *execctx.Defaults, token *auth.Token) *Handler {
	if log == nil {
		log = slog.Default()
	}
	return &Handler{log: log, defaults: defaults, token: token}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		h.download(w, r)
	case http.MethodPost:
		h.upload(w, r)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		rpcerr.WriteJSON(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on /files", r.Method))
	}
}

// query parses the query strictly: a malformed query would otherwise be
// dropped silently and, say, an upload land in the wrong place.
func query(r *http.Request) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: malformed query: %v", rpcerr.ErrInvalidArgument, err)
	}
	return q, nil
}

// errBadToken is returned when X-Access-Token is present but wrong.
var errBadToken = errors.New("access token present in header but does not match")

// authorize enforces the access token for /files, which the server's
// middleware leaves to us because a signed URL may stand in for the token.
// A present X-Access-Token decides on its own (as in E2B's envd): a wrong
// header is not rescued by a signature. The signature covers the raw `path`
// and `username` query values, not the resolved ones, exactly as the SDKs
// sign them.
func (h *Handler) authorize(r *http.Request, q url.Values, op string) error {
	if h.token == nil || !h.token.IsSet() {
		return nil
	}
	if v := r.Header.Get(envdapi.AccessTokenHeader); v != "" {
		if h.token.Equal(v) {
			return nil
		}
		return errBadToken
	}
	return h.token.VerifySignature(q.Get("signature"), q.Get("path"), op, q.Get("username"),
		q.Get("signature_expiration"), time.Now())
}

// unauthorized answers a failed authorize. Every such failure is 401 by
// contract (wire doc §3.5), whatever the reason.
func (h *Handler) unauthorized(w http.ResponseWriter, r *http.Request, err error) {
	h.log.Warn("unauthorized /files request", "method", r.Method, "err", err)
	rpcerr.WriteJSON(w, http.StatusUnauthorized, err.Error())
}

// fail answers err with the status rpcerr maps it to; server-side failures
// are logged at error level, client mistakes only at debug.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := rpcerr.HTTPStatus(err)
	level := slog.LevelDebug
	if status >= 500 {
		level = slog.LevelError
	}
	h.log.Log(r.Context(), level, "/files request failed", "method", r.Method, "status", status, "err", err)
	rpcerr.WriteJSON(w, status, err.Error())
}
