package telemetry

import (
	"context"
	"net/http"
	"testing"
)

func TestSetupOff(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	shutdown, err := Setup(context.Background(), Options{ServiceName: "test"})
	if err != nil || Enabled() {
		t.Fatalf("Setup without an endpoint: enabled %v, err %v; want off", Enabled(), err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Off, a caller's traceparent is not taken up, and none goes on.
	in := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	out := http.Header{}
	Inject(Extract(context.Background(), in), out)
	if out.Get("Traceparent") != "" {
		t.Errorf("off: traceparent %q sent on; want none", out.Get("Traceparent"))
	}
}

func TestSetupBadRatio(t *testing.T) {
	for _, r := range []float64{-0.1, 1.5} {
		if _, err := Setup(context.Background(), Options{Endpoint: "http://127.0.0.1:1", SampleRatio: r}); err == nil || Enabled() {
			t.Errorf("ratio %v: err %v, enabled %v; want an error, off", r, err, Enabled())
		}
	}
}
