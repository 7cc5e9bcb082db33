package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
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
	// Off, the middleware is a pass-through that adds no header.
	h := Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Inject(r.Context(), w.Header())
		w.WriteHeader(http.StatusTeapot)
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/x", nil))
	if rec.Code != http.StatusTeapot || rec.Header().Get("Traceparent") != "" {
		t.Errorf("off: status %d, traceparent %q; want the handler's answer alone", rec.Code, rec.Header().Get("Traceparent"))
	}
}

func TestSetupBadRatio(t *testing.T) {
	for _, r := range []float64{-0.1, 1.5} {
		if _, err := Setup(context.Background(), Options{Endpoint: "http://127.0.0.1:1", SampleRatio: r}); err == nil || Enabled() {
			t.Errorf("ratio %v: err %v, enabled %v; want an error, off", r, err, Enabled())
		}
	}
}
