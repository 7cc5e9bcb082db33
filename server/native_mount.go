package server

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/server/native"
)

// NativePrefix is where sandboxd's own API (openapi/native.yaml) is mounted.
// E2B's API lives below it at E2BPrefix; chi routes the longer prefix there.
const NativePrefix = "/v1/sandboxes"

// newNative returns the native API's router, to be mounted at NativePrefix:
// auth and the tenant's limits first, then each route's scope.
func newNative(cfg Config, lm *limitMetrics, a *native.API) http.Handler {
	log := cfg.Log
	siw := &nativeapi.ServerInterfaceWrapper{
		Handler: a,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			native.WriteError(w, r, log, errdefs.New(errdefs.ErrInvalidArgument, err.Error()))
		},
	}
	r := chi.NewRouter()
	r.Use(nativeAuthenticate(cfg.Store, cfg.JWT, log), limitTenants(cfg.Limits, lm,
		func(w http.ResponseWriter, r *http.Request, msg string) {
			native.WriteError(w, r, log, errdefs.New(errdefs.ErrRateLimited, msg))
		}))
	for _, rt := range native.Routes(siw) {
		r.With(requireScope(rt.Scope, log)).Method(rt.Method, rt.Pattern, rt.Handler)
	}
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		native.WriteError(w, r, log, errdefs.New(errdefs.ErrNotFound, "no route "+r.Method+" "+r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		httpx.SetAllow(w, req, r)
		native.WriteError(w, req, log, errdefs.New(httpx.ErrMethodNotAllowed, "method "+req.Method+" is not allowed on "+req.URL.Path))
	})
	return r
}
