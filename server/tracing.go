package server

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/telemetry"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracer is the server's: the span of every request.
var tracer = otel.Tracer("github.com/sandboxd/sandboxd/server")

// traceRequests starts the server span of each request (API and data
// plane), continuing the caller's traceparent, named by the chi route it
// matched (the routing context is supplied here, the router being inside)
// or, for the data plane, by its method. Off, it is next itself.
func traceRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !telemetry.Enabled() {
			next.ServeHTTP(w, r)
			return
		}
		ctx, span := tracer.Start(telemetry.Extract(r.Context(), r.Header), r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
		defer span.End()
		rctx := chi.RouteContext(ctx)
		if rctx == nil {
			rctx = chi.NewRouteContext()
			ctx = context.WithValue(ctx, chi.RouteCtxKey, rctx)
		}
		rec := &httpx.StatusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r.WithContext(ctx))
		if route := rctx.RoutePattern(); route != "" {
			span.SetName(r.Method + " " + route)
			span.SetAttributes(attribute.String("http.route", route))
		}
		code := rec.Status
		if code == 0 {
			code = http.StatusOK
		}
		span.SetAttributes(attribute.Int("http.response.status_code", code))
		if code >= 500 {
			span.SetStatus(codes.Error, http.StatusText(code))
		}
	})
}
