package process

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/api/process/processconnect"
	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
)

// testEnv is a real Service behind a real HTTP server (h2c and HTTP/1.1),
// reached through the generated Connect client with the JSON codec, as E2B's
// SDKs speak it; or, with ENVD_TEST_BINARY set, an agent binary serving it
// (package agenttest).
type testEnv struct {
	svc      *Service          // in process only: use service
	defaults *execctx.Defaults // in process only: use setWorkdir, mergeEnvs
	agent    *agenttest.Agent  // against a binary only
	client   processconnect.ProcessClient
	url      string
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	return newTestEnvOver(t, "h2c")
}

// newTestEnvOver picks the client transport: "h2c" (as Node's undici may) or
// "http1" (as the Python SDK always does on plaintext).
func newTestEnvOver(t *testing.T, proto string) *testEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("process tests switch users and must run as root")
	}
	e := &testEnv{}
	if agenttest.Enabled() {
		e.agent = agenttest.Start(t, agenttest.Options{DefaultUser: "root"})
		e.url = e.agent.URL
	} else {
		e.defaults = execctx.New("root")
		e.svc = New(slog.New(slog.NewTextHandler(t.Output(), nil)), e.defaults)

		mux := http.NewServeMux()
		mux.Handle(e.svc.Handler())
		srv := httptest.NewUnstartedServer(mux)
		srv.Config.Protocols = new(http.Protocols)
		srv.Config.Protocols.SetHTTP1(true)
		srv.Config.Protocols.SetUnencryptedHTTP2(true)
		srv.Start()
		t.Cleanup(srv.Close)
		// Runs before srv.Close (cleanups are LIFO): killing the processes ends
		// the streams the server would otherwise wait for.
		t.Cleanup(e.svc.Close)
		e.url = srv.URL
	}

	tr := &http.Transport{Protocols: new(http.Protocols)}
	if proto == "http1" {
		tr.Protocols.SetHTTP1(true)
	} else {
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	t.Cleanup(tr.CloseIdleConnections)
	e.client = processconnect.NewProcessClient(&http.Client{Transport: tr}, e.url, connect.WithProtoJSON())
	return e
}

// service is the in-process Service, for what a test does to its Go
// internals; against a binary, which has none, it skips t (why says what
// the test needs them for).
func (e *testEnv) service(t *testing.T, why string) *Service {
	t.Helper()
	agenttest.InProcessOnly(t, why)
	return e.svc
}

// inProcess says whether the service runs in this process, where a test
// may also check its internal state; over the wire there is none to check.
func (e *testEnv) inProcess() bool { return e.svc != nil }

// setWorkdir sets the default working directory ("" for none): in process
// on the defaults, against a binary through POST /init, as sandboxd does.
// A fresh agent has none, so "" there is nothing to send.
func (e *testEnv) setWorkdir(t *testing.T, dir string) {
	t.Helper()
	switch {
	case e.agent == nil:
		e.defaults.SetWorkdir(dir)
	case dir != "":
		e.agent.Init(t, map[string]any{"defaultWorkdir": dir})
	}
}

// mergeEnvs adds sandbox-wide environment variables: in process on the
// defaults, against a binary through POST /init (envVars), as sandboxd does.
func (e *testEnv) mergeEnvs(t *testing.T, envs map[string]string) {
	t.Helper()
	if e.agent != nil {
		e.agent.Init(t, map[string]any{"envVars": envs})
		return
	}
	e.defaults.MergeEnvs(envs)
}

// running lists the processes the service holds as running: in process
// from the Service, against a binary from List, which answers from it.
func (e *testEnv) running(t *testing.T) []*rpc.ProcessInfo {
	t.Helper()
	if e.inProcess() {
		var out []*rpc.ProcessInfo
		for _, p := range e.svc.running() {
			out = append(out, &rpc.ProcessInfo{Pid: p.pid})
		}
		return out
	}
	res, err := e.client.List(t.Context(), connect.NewRequest(&rpc.ListRequest{}))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return res.Msg.GetProcesses()
}

// header values for a request; "user" becomes the Basic auth header.
type hdr map[string]string

func newReq[T any](msg *T, h hdr) *connect.Request[T] {
	r := connect.NewRequest(msg)
	for k, v := range h {
		if k == "user" {
			r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(v+":")))
			continue
		}
		r.Header().Set(k, v)
	}
	return r
}

// events reads a Start or Connect stream.
type events struct {
	t       *testing.T
	receive func() bool
	msg     func() *rpc.ProcessEvent
	err     func() error
	close   func() error
}

func (e *testEnv) start(t *testing.T, ctx context.Context, msg *rpc.StartRequest, h hdr) *events {
	t.Helper()
	s, err := e.client.Start(ctx, newReq(msg, h))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &events{t, s.Receive, func() *rpc.ProcessEvent { return s.Msg().GetEvent() }, s.Err, s.Close}
}

func (e *testEnv) connect(t *testing.T, ctx context.Context, sel *rpc.ProcessSelector, h hdr) *events {
	t.Helper()
	s, err := e.client.Connect(ctx, newReq(&rpc.ConnectRequest{Process: sel}, h))
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &events{t, s.Receive, func() *rpc.ProcessEvent { return s.Msg().GetEvent() }, s.Err, s.Close}
}

// next returns the next event, failing the test if the stream ended.
func (ev *events) next() *rpc.ProcessEvent {
	ev.t.Helper()
	if !ev.receive() {
		ev.t.Fatalf("stream ended early: %v", ev.err())
	}
	return ev.msg()
}

// started reads the first event, which must be start, and returns the pid.
func (ev *events) started() uint32 {
	ev.t.Helper()
	e := ev.next()
	if e.GetStart() == nil {
		ev.t.Fatalf("first event = %v; want start", e)
	}
	return e.GetStart().GetPid()
}

// until reads data events until the accumulated output contains want.
func (ev *events) until(want string) string {
	ev.t.Helper()
	var out strings.Builder
	for !strings.Contains(out.String(), want) {
		e := ev.next()
		if e.GetEnd() != nil {
			ev.t.Fatalf("process ended (%v) before output %q; got %q", e.GetEnd(), want, out.String())
		}
		d := e.GetData()
		out.Write(d.GetStdout())
		out.Write(d.GetStderr())
		out.Write(d.GetPty())
	}
	return out.String()
}

// result is everything after the start event.
type result struct {
	stdout, stderr, pty bytes.Buffer
	kinds               []string // event kinds in order, data collapsed per run
	end                 *rpc.ProcessEvent_EndEvent
}

// rest reads to the end of the stream, which must carry exactly one end event
// as its last event, and then end cleanly.
func (ev *events) rest() *result {
	ev.t.Helper()
	r := &result{}
	for ev.receive() {
		e := ev.msg()
		if r.end != nil {
			ev.t.Fatalf("event after end: %v", e)
		}
		kind := ""
		switch x := e.GetEvent().(type) {
		case *rpc.ProcessEvent_Start:
			ev.t.Fatalf("second start event: %v", x)
		case *rpc.ProcessEvent_Data:
			kind = "data"
			r.stdout.Write(x.Data.GetStdout())
			r.stderr.Write(x.Data.GetStderr())
			r.pty.Write(x.Data.GetPty())
		case *rpc.ProcessEvent_End:
			kind = "end"
			r.end = x.End
		case *rpc.ProcessEvent_Keepalive:
			kind = "keepalive"
		default:
			ev.t.Fatalf("empty event")
		}
		if n := len(r.kinds); n == 0 || r.kinds[n-1] != kind || kind != "data" {
			r.kinds = append(r.kinds, kind)
		}
	}
	if err := ev.err(); err != nil {
		ev.t.Fatalf("stream error: %v", err)
	}
	if r.end == nil {
		ev.t.Fatalf("stream ended without an end event; kinds %v", r.kinds)
	}
	return r
}

// run starts msg and returns its pid and everything after start.
func (e *testEnv) run(t *testing.T, msg *rpc.StartRequest, h hdr) (uint32, *result) {
	t.Helper()
	ev := e.start(t, t.Context(), msg, h)
	pid := ev.started()
	return pid, ev.rest()
}

// startCode returns the Connect code a Start fails with (before any event).
func (e *testEnv) startCode(t *testing.T, msg *rpc.StartRequest, h hdr) connect.Code {
	t.Helper()
	ev := e.start(t, t.Context(), msg, h)
	if ev.receive() {
		t.Fatalf("Start succeeded with %v; want an error", ev.msg())
	}
	return connect.CodeOf(ev.err())
}

// connectCode returns the Connect code a Connect fails with.
func (e *testEnv) connectCode(t *testing.T, sel *rpc.ProcessSelector) connect.Code {
	t.Helper()
	ev := e.connect(t, t.Context(), sel, nil)
	if ev.receive() {
		t.Fatalf("Connect succeeded with %v; want an error", ev.msg())
	}
	return connect.CodeOf(ev.err())
}

func (e *testEnv) kill(t *testing.T, sel *rpc.ProcessSelector) {
	t.Helper()
	_, err := e.client.SendSignal(t.Context(), connect.NewRequest(&rpc.SendSignalRequest{Process: sel, Signal: rpc.Signal_SIGNAL_SIGKILL}))
	if err != nil {
		t.Fatalf("SendSignal: %v", err)
	}
}

func (e *testEnv) sendStdin(t *testing.T, pid uint32, data string) {
	t.Helper()
	_, err := e.client.SendInput(t.Context(), connect.NewRequest(&rpc.SendInputRequest{
		Process: byPid(pid), Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte(data)}},
	}))
	if err != nil {
		t.Fatalf("SendInput(%q): %v", data, err)
	}
}

func (e *testEnv) sendPTY(t *testing.T, pid uint32, data string) {
	t.Helper()
	_, err := e.client.SendInput(t.Context(), connect.NewRequest(&rpc.SendInputRequest{
		Process: byPid(pid), Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Pty{Pty: []byte(data)}},
	}))
	if err != nil {
		t.Fatalf("SendInput(pty %q): %v", data, err)
	}
}

func cmd(name string, args ...string) *rpc.ProcessConfig {
	return &rpc.ProcessConfig{Cmd: name, Args: args}
}

func sh(script string) *rpc.ProcessConfig { return cmd("/bin/sh", "-c", script) }

func byPid(pid uint32) *rpc.ProcessSelector {
	return &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: pid}}
}

func byTag(tag string) *rpc.ProcessSelector {
	return &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Tag{Tag: tag}}
}

func ptr[T any](v T) *T { return &v }

// eventually polls cond until it holds or a generous deadline passes; used
// only where there is no event to wait on (timers, the kernel, goroutines
// unwinding).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// packageGoroutines returns the stacks of goroutines running this package's
// non-test code.
func packageGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "envd/internal/process.(") { // methods: the service's, not Test functions
			out = append(out, g)
		}
	}
	return out
}

func codeIs(t *testing.T, what string, err error, want connect.Code) {
	t.Helper()
	if got := connect.CodeOf(err); err == nil || got != want {
		t.Errorf("%s: error %v (code %v); want code %v", what, err, got, want)
	}
}

// contextWithCancel is a context the test can cancel early.
func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	return ctx, cancel
}
