package server

import (
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/go-chi/chi/v5/middleware"
	"github.com/sandboxd/sandboxd/server/httpx"
)

// recoverer turns a handler panic into E2B's JSON 500 (chi's Recoverer
// writes an empty body, which the Python SDK cannot parse) and logs the stack
// with the request id. http.ErrAbortHandler is re-raised: it is how a handler
// deliberately aborts a response, and upgraded connections get no body.
func recoverer(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				rv := recover()
				if rv == nil {
					return
				}
				if rv == http.ErrAbortHandler {
					panic(rv)
				}
				reqID := middleware.GetReqID(r.Context())
				log.ErrorContext(r.Context(), "panic serving request", "panic", rv, "request_id", reqID,
					"method", r.Method, "path", r.URL.Path, "stack", string(debug.Stack()))
				if r.Header.Get("Connection") != "Upgrade" {
					httpx.WriteErrorStatus(w, http.StatusInternalServerError, "internal error (request "+reqID+")")
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}
