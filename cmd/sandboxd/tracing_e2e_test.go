package main

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace endpoint: it decodes what sandboxd's
// real exporter sends (protobuf ExportTraceServiceRequest) and keeps the
// spans with their service name.
type otlpReceiver struct {
	mu       sync.Mutex
	spans    []*tracepb.Span
	services map[string]bool
	bad      []string
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
		o.bad = append(o.bad, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				o.services[a.GetValue().GetStringValue()] = true
			}
		}
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// byName returns the spans named name of trace traceID.
func (o *otlpReceiver) byName(traceID []byte, name string) []*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range o.spans {
		if s.Name == name && string(s.TraceId) == string(traceID) {
			out = append(out, s)
		}
	}
	return out
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			if v, ok := a.Value.Value.(*commonpb.AnyValue_IntValue); ok {
				return strconv.FormatInt(v.IntValue, 10)
			}
			return a.Value.GetStringValue()
		}
	}
	return ""
}

// TestTracingE2E: with --otel-endpoint, sandboxd exports OTLP/HTTP spans
// that continue the caller's traceparent: the API request's server span,
// the create under it with one span per step, and a proxied request's span,
// in the same trace.
func TestTracingE2E(t *testing.T) {
	recv := &otlpReceiver{services: map[string]bool{}}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)

	e := newE2EEnv(t, "acme")
	e.serveArgs = append(e.serveArgs, "--otel-endpoint", srv.URL)
	s := e.start()
	key := e.keys["acme"]

	const traceHex = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceID, _ := hex.DecodeString(traceHex)
	parent := http.Header{"Traceparent": {"00-" + traceHex + "-00f067aa0ba902b7-01"}}
	r, err := s.tryDo(http.MethodPost, e2eAPIPrefix+"/sandboxes", key, map[string]any{"templateID": "base", "allow_internet_access": false}, parent)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "POST /sandboxes", r, http.StatusCreated)
	sb := wantSandboxBody(t, "POST /sandboxes", r.body)
	e.track(sb.SandboxID, key)

	// A request through the proxy, in the same trace.
	req, _ := http.NewRequest(http.MethodGet, s.base+"/health", nil)
	req.Header.Set("Traceparent", "00-"+traceHex+"-00f067aa0ba902b7-01")
	resp, err := s.envdHTTP(sb.SandboxID, "").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("envd /health through the proxy: %s", resp.Status)
	}

	// The exporter sends a batch within a second (--otel-endpoint's batch
	// timeout); every span of the create has ended by its answer.
	// (envd.init too where envd is not initialised by the backend's create:
	// Incus, a warm member's claim.)
	const serverSpan = "POST " + e2eAPIPrefix + "/sandboxes"
	want := []string{serverSpan, "sandbox.create", "sandbox.admit", "backend.create", "GET", "sandbox.proxy"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing := []string{}
		for _, n := range want {
			if len(recv.byName(traceID, n)) == 0 {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			recv.mu.Lock()
			names := []string{}
			for _, sp := range recv.spans {
				names = append(names, sp.Name+"@"+hex.EncodeToString(sp.TraceId))
			}
			recv.mu.Unlock()
			t.Fatalf("spans of trace %s missing: %v; received %v (bad exports: %v)", traceHex, missing, names, recv.bad)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The tree: server span under the caller's span, create under it, the
	// steps under the create.
	server := recv.byName(traceID, serverSpan)[0]
	if hex.EncodeToString(server.ParentSpanId) != "00f067aa0ba902b7" || server.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("server span: parent %x kind %v; want the caller's span, server", server.ParentSpanId, server.Kind)
	}
	if got := spanAttr(server, "http.route"); got != e2eAPIPrefix+"/sandboxes" {
		t.Errorf("server span http.route = %q", got)
	}
	create := recv.byName(traceID, "sandbox.create")[0]
	if string(create.ParentSpanId) != string(server.SpanId) {
		t.Errorf("sandbox.create's parent is not the request's span")
	}
	if spanAttr(create, "sandbox.id") != sb.SandboxID || spanAttr(create, "tenant") != "acme" || spanAttr(create, "sandbox.served_from") != "cold" {
		t.Errorf("sandbox.create attributes: %v", create.Attributes)
	}
	for _, step := range []string{"sandbox.admit", "backend.create"} {
		sp := recv.byName(traceID, step)[0]
		if string(sp.ParentSpanId) != string(create.SpanId) {
			t.Errorf("%s is not under sandbox.create", step)
		}
		if sp.StartTimeUnixNano < create.StartTimeUnixNano || sp.EndTimeUnixNano > create.EndTimeUnixNano {
			t.Errorf("%s [%d, %d] outside sandbox.create [%d, %d]", step, sp.StartTimeUnixNano, sp.EndTimeUnixNano, create.StartTimeUnixNano, create.EndTimeUnixNano)
		}
	}
	px := recv.byName(traceID, "sandbox.proxy")[0]
	if spanAttr(px, "sandbox.id") != sb.SandboxID || spanAttr(px, "sandbox.port") != "49983" || spanAttr(px, "http.response.status_code") != "204" {
		t.Errorf("sandbox.proxy attributes: %v", px.Attributes)
	}
	recv.mu.Lock()
	if !recv.services["sandboxd"] || len(recv.bad) > 0 {
		t.Errorf("services %v, bad exports %v; want sandboxd's, none bad", recv.services, recv.bad)
	}
	recv.mu.Unlock()
}
