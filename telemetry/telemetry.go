// Package telemetry owns sandboxd's OpenTelemetry set-up: the OTLP/HTTP
// trace exporter, off unless an endpoint is configured, and the W3C
// traceparent propagation. Spans are started where the work is done (the
// server's per request, a sandbox's create, a proxied request) with the
// global tracer provider that Setup installs; without Setup they cost a
// no-op.
package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Options configure the exporter.
type Options struct {
	// Endpoint is the OTLP/HTTP base URL (e.g. http://localhost:4318;
	// traces go to its /v1/traces). Empty: the standard
	// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
	// and without them tracing stays off.
	Endpoint string
	// SampleRatio of new traces, 0..1 (0: 1); a caller's sampled
	// traceparent is followed whatever it is.
	SampleRatio float64
	// ServiceName and Version describe this process (service.name,
	// service.version).
	ServiceName, Version string
	// BatchTimeout bounds how long a finished span waits to be sent
	// (0: the SDK's 5 s).
	BatchTimeout time.Duration
}

var enabled atomic.Bool

// Enabled reports whether Setup turned tracing on.
func Enabled() bool { return enabled.Load() }

// Setup turns tracing on when an endpoint is configured and returns the
// function that flushes and stops it; otherwise it does nothing and
// returns a shutdown that does nothing.
func Setup(ctx context.Context, o Options) (shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	if o.Endpoint == "" && os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return noop, nil
	}
	if o.SampleRatio < 0 || o.SampleRatio > 1 {
		return noop, fmt.Errorf("trace sample ratio %v: want 0..1", o.SampleRatio)
	}
	var opts []otlptracehttp.Option
	if o.Endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(o.Endpoint+"/v1/traces"))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return noop, fmt.Errorf("OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", o.ServiceName), attribute.String("service.version", o.Version)))
	if err != nil {
		return noop, fmt.Errorf("trace resource: %w", err)
	}
	ratio := o.SampleRatio
	if ratio == 0 {
		ratio = 1
	}
	var bopts []sdktrace.BatchSpanProcessorOption
	if o.BatchTimeout > 0 {
		bopts = append(bopts, sdktrace.WithBatchTimeout(o.BatchTimeout))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, bopts...),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	enabled.Store(true)
	return func(ctx context.Context) error {
		enabled.Store(false)
		return tp.Shutdown(ctx)
	}, nil
}

// Extract returns ctx with the span context h carries (a caller's
// traceparent), when tracing is on.
func Extract(ctx context.Context, h http.Header) context.Context {
	if !enabled.Load() {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject writes the span context of ctx into h (W3C traceparent), for a
// request that goes on to a sandbox.
func Inject(ctx context.Context, h http.Header) {
	if enabled.Load() {
		otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// End ends span, recording err (nil: ok) as its status.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
