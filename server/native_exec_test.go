package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
	"github.com/sandboxd/sandboxd/server/httpx"
)

func TestNativeExec(t *testing.T) {
	e := newNativeEnv(t, true)
	tok := e.full()
	sb := e.create(tok, nil)

	for _, tc := range []struct {
		name                   string
		body                   map[string]any
		stdout, stderr, signal string
		exit                   int
		truncated, timedOut    bool
	}{
		{name: "cmd", body: map[string]any{"cmd": "echo out; echo err >&2; exit 3"}, stdout: "out\n", stderr: "err\n", exit: 3},
		{name: "argv", body: map[string]any{"argv": []string{"printf", "%s|", "a b", "c"}}, stdout: "a b|c|"},
		{name: "env and cwd", body: map[string]any{"cmd": "echo $FOO; pwd", "env": map[string]string{"FOO": "bar"}, "cwd": "/tmp"}, stdout: "bar\n/tmp\n"},
		{name: "stdin", body: map[string]any{"argv": []string{"cat"}, "stdin": "hello\nworld"}, stdout: "hello\nworld"},
		{name: "empty stdin is EOF", body: map[string]any{"argv": []string{"wc", "-c"}, "stdin": ""}, stdout: "0\n"},
		{name: "stdin unread", body: map[string]any{"cmd": "exit 4", "stdin": strings.Repeat("x", 4<<20)}, exit: 4},
		{name: "user", body: map[string]any{"cmd": "id -un", "user": "root"}, stdout: "root\n"},
		{name: "output cap", body: map[string]any{"cmd": "head -c 100000 /dev/zero | tr '\\0' a; echo done >&2", "max_output_bytes": 1000},
			stdout: strings.Repeat("a", 1000), stderr: "done\n", truncated: true},
		{name: "timeout", body: map[string]any{"cmd": "echo started; sleep 100", "timeout": 1}, stdout: "started\n", exit: -1, signal: "killed", timedOut: true},
		{name: "killed by signal", body: map[string]any{"cmd": "kill -TERM $$"}, exit: -1, signal: "terminated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := e.exec(sb.Id, tok, tc.body)
			if got.Stdout != tc.stdout || got.Stderr != tc.stderr || got.ExitCode != tc.exit ||
				got.Truncated != tc.truncated || got.TimedOut != tc.timedOut || httpx.Deref(got.Signal) != tc.signal || got.Error != nil {
				t.Errorf("exec = stdout %q stderr %q exit %d signal %q truncated %v timed_out %v error %q; want %q %q %d %q %v %v no error",
					got.Stdout, got.Stderr, got.ExitCode, httpx.Deref(got.Signal), got.Truncated, got.TimedOut, httpx.Deref(got.Error),
					tc.stdout, tc.stderr, tc.exit, tc.signal, tc.truncated, tc.timedOut)
			}
		})
	}
	// The timed-out process is gone, not left running in the sandbox.
	if n := countProcs(t, e, sb.Id, tok, "sleep 100"); n != 0 {
		t.Errorf("%d sleep processes after the timeout; want 0", n)
	}

	for _, tc := range []struct {
		body   string
		status int
		code   string
	}{
		{`{}`, 400, "invalid_argument"},
		{`{"cmd": "true", "argv": ["true"]}`, 400, "invalid_argument"},
		{`{"cmd": "true", "timeout": -1}`, 400, "invalid_argument"},
		{`{"cmd": "true", "max_output_bytes": -1}`, 400, "invalid_argument"},
		{`{"cmd": "true", "user": "nosuchuser"}`, 400, "invalid_argument"},
		{`{"argv": ["/no/such/binary"]}`, 400, "invalid_argument"},
		{`{"cmd": "true", "cwd": "/nonexistent"}`, 400, "invalid_argument"},
	} {
		r := e.do(http.MethodPost, "/v1/sandboxes/"+sb.Id+"/exec", tok, strings.NewReader(tc.body))
		if r.status != tc.status || r.errCode() != tc.code {
			t.Errorf("exec %s = %s; want %d %s", tc.body, r, tc.status, tc.code)
		}
	}
}

// procsScript prints each process's command line, one per line.
const procsScript = `for p in /proc/[0-9]*; do [ -r $p/cmdline ] && tr '\0' ' ' < $p/cmdline && echo; done`

// countProcs counts the sandbox's processes whose command line starts with
// prefix.
func countProcs(t testing.TB, e *nativeEnv, id, tok, prefix string) int {
	t.Helper()
	res := e.exec(id, tok, map[string]any{"cmd": procsScript})
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "/bin/sh -c") {
		t.Fatalf("listing processes: %+v", res)
	}
	n := 0
	for _, l := range strings.Split(res.Stdout, "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// TestNativeExecReusesConnections: execs one after another share the API's
// keep-alive connections to envd rather than each dialing its own.
func TestNativeExecReusesConnections(t *testing.T) {
	dc := &runtimetest.EnvdDialCounter{}
	e := newNativeEnvWith(t, true, func(be runtime.Backend) runtime.Backend { dc.Backend = be; return dc }, nil)
	tok := e.full()
	sb := e.create(tok, nil)
	run := func() {
		t.Helper()
		if got := e.exec(sb.Id, tok, map[string]any{"cmd": "echo hi", "stdin": "x"}); got.Stdout != "hi\n" || got.ExitCode != 0 {
			t.Fatalf("exec = %+v; want hi, exit 0", got)
		}
	}
	run() // warms the pool
	before := dc.Dials.Load()
	const n = 5
	for range n {
		run()
	}
	// Each exec opens a stream for Start and one for stdin; a transport per
	// call dials both every time.
	if dials := dc.Dials.Load() - before; dials >= n {
		t.Errorf("%d execs dialed envd %d times; want their connections reused", n, dials)
	}
}
