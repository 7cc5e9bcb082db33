package mcp_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/jwtauth"
)

// TestTools lists every tool and drives the sandbox and file tools once
// through a sandbox's life (the workspace tools: workspace_test.go).
func TestTools(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.session("acme", nil, full...)

	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" || tl.InputSchema == nil {
			t.Errorf("tool %s: no description or input schema", tl.Name)
		}
	}
	slices.Sort(names)
	want := []string{"sandbox_changes", "sandbox_create", "sandbox_diff", "sandbox_exec", "sandbox_export", "sandbox_kill",
		"sandbox_list", "sandbox_list_files", "sandbox_publish", "sandbox_read_file", "sandbox_write_file", "template_versions"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	sb := e.create(cs, map[string]any{"metadata": map[string]string{"job": "t1"}, "env": map[string]string{"GREETING": "hi"}, "timeout": 120})
	other := e.create(cs, map[string]any{"metadata": map[string]string{"job": "t2"},
		"network": map[string]any{"allowOut": []string{"1.1.1.1"}, "denyOut": []string{"0.0.0.0/0"}}})
	var net struct {
		Sandboxes []struct {
			AllowInternet bool `json:"allow_internet"`
			Network       struct{ AllowOut, DenyOut []string }
		}
	}
	mustCall(t, cs, "sandbox_list", map[string]any{"metadata": map[string]string{"job": "t2"}}, &net)
	if len(net.Sandboxes) != 1 || !net.Sandboxes[0].AllowInternet || !slices.Equal(net.Sandboxes[0].Network.AllowOut, []string{"1.1.1.1"}) ||
		!slices.Equal(net.Sandboxes[0].Network.DenyOut, []string{"0.0.0.0/0"}) {
		t.Errorf("sandbox_create's network policy: %+v", net)
	}

	var list struct{ Sandboxes []sandboxOut }
	mustCall(t, cs, "sandbox_list", map[string]any{"metadata": map[string]string{"job": "t1"}}, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID || list.Sandboxes[0].Metadata["job"] != "t1" {
		t.Fatalf("sandbox_list by metadata: %+v", list)
	}
	mustCall(t, cs, "sandbox_list", map[string]any{"state": []string{"running"}}, &list)
	if len(list.Sandboxes) != 2 {
		t.Fatalf("sandbox_list running: %+v", list)
	}
	mustCall(t, cs, "sandbox_list", map[string]any{"state": []string{"paused"}}, &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("sandbox_list paused: %+v", list)
	}
	if msg := call(t, cs, "sandbox_list", map[string]any{"state": []string{"sleeping"}}, nil); !strings.HasPrefix(msg, "invalid_argument:") {
		t.Errorf("sandbox_list with a bad state: %q", msg)
	}

	var x execOut
	mustCall(t, cs, "sandbox_exec", map[string]any{"sandbox_id": sb.ID,
		"command": `echo "$GREETING $EXTRA from $(pwd) as $(whoami)"; echo oops >&2; exit 3`,
		"env":     map[string]string{"EXTRA": "there"}, "cwd": "/tmp"}, &x)
	if x.Stdout != "hi there from /tmp as user\n" || x.Stderr != "oops\n" || x.ExitCode != 3 || x.TimedOut {
		t.Errorf("sandbox_exec: %+v", x)
	}
	mustCall(t, cs, "sandbox_exec", map[string]any{"sandbox_id": sb.ID, "command": "whoami; echo $0", "user": "root"}, &x)
	if x.Stdout != "root\n/bin/bash\n" || x.ExitCode != 0 {
		t.Errorf("sandbox_exec as root: %+v", x)
	}
	if msg := call(t, cs, "sandbox_exec", map[string]any{"sandbox_id": sb.ID, "command": "true", "cwd": "/nonexistent"}, &x); msg == "" {
		t.Errorf("sandbox_exec in a missing cwd: %+v, want a tool error", x)
	}

	var w struct {
		Path  string
		Bytes int
	}
	mustCall(t, cs, "sandbox_write_file", map[string]any{"sandbox_id": sb.ID, "path": "notes/a.txt", "content": "héllo\n"}, &w)
	if w.Path != "/home/user/notes/a.txt" || w.Bytes != len("héllo\n") {
		t.Errorf("sandbox_write_file: %+v", w)
	}
	bin := []byte{0, 1, 2, 0xff, 'x'}
	mustCall(t, cs, "sandbox_write_file", map[string]any{"sandbox_id": sb.ID, "path": "/home/user/notes/b.bin",
		"content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"}, &w)
	if msg := call(t, cs, "sandbox_write_file", map[string]any{"sandbox_id": sb.ID, "path": "c", "content": "!!", "encoding": "base64"}, nil); !strings.HasPrefix(msg, "invalid_argument:") {
		t.Errorf("sandbox_write_file of bad base64: %q", msg)
	}

	type readOut struct {
		Encoding, Content string
		Size              int64
		Truncated         bool
	}
	var r readOut
	mustCall(t, cs, "sandbox_read_file", map[string]any{"sandbox_id": sb.ID, "path": "/home/user/notes/a.txt"}, &r)
	if r.Encoding != "text" || r.Content != "héllo\n" || r.Size != int64(len("héllo\n")) || r.Truncated {
		t.Errorf("sandbox_read_file text: %+v", r)
	}
	mustCall(t, cs, "sandbox_read_file", map[string]any{"sandbox_id": sb.ID, "path": "notes/b.bin"}, &r)
	if r.Encoding != "base64" || r.Content != base64.StdEncoding.EncodeToString(bin) {
		t.Errorf("sandbox_read_file binary: %+v", r)
	}
	// A cut inside "é" (2 bytes at offset 1) stays text: the cut drops it.
	mustCall(t, cs, "sandbox_read_file", map[string]any{"sandbox_id": sb.ID, "path": "notes/a.txt", "max_bytes": 2}, &r)
	if r.Encoding != "text" || r.Content != "h" || !r.Truncated || r.Size != 7 {
		t.Errorf("sandbox_read_file max_bytes 2: %+v", r)
	}
	if msg := call(t, cs, "sandbox_read_file", map[string]any{"sandbox_id": sb.ID, "path": "/nope"}, nil); !strings.HasPrefix(msg, "not_found:") {
		t.Errorf("sandbox_read_file of a missing file: %q", msg)
	}

	var ls struct {
		Entries []struct{ Name, Path, Type string }
	}
	mustCall(t, cs, "sandbox_list_files", map[string]any{"sandbox_id": sb.ID, "path": "/home/user", "depth": 2}, &ls)
	var paths []string
	for _, en := range ls.Entries {
		paths = append(paths, en.Type+" "+en.Path)
	}
	for _, p := range []string{"dir /home/user/notes", "file /home/user/notes/a.txt", "file /home/user/notes/b.bin"} {
		if !slices.Contains(paths, p) {
			t.Errorf("sandbox_list_files depth 2: no %q in %v", p, paths)
		}
	}

	var k struct{ Killed bool }
	mustCall(t, cs, "sandbox_kill", map[string]any{"sandbox_id": other.ID}, &k)
	if !k.Killed {
		t.Errorf("sandbox_kill: %+v", k)
	}
	if msg := call(t, cs, "sandbox_exec", map[string]any{"sandbox_id": other.ID, "command": "true"}, nil); !strings.HasPrefix(msg, "not_found:") {
		t.Errorf("sandbox_exec in a killed sandbox: %q", msg)
	}
	if msg := call(t, cs, "sandbox_kill", map[string]any{"sandbox_id": other.ID}, nil); !strings.HasPrefix(msg, "not_found:") {
		t.Errorf("sandbox_kill twice: %q", msg)
	}
}

// TestScopes: a tool without its scope is a tool error naming the scope,
// and does nothing.
func TestScopes(t *testing.T) {
	e := newEnv(t, nil)
	full := e.session("acme", nil, full...)
	sb := e.create(full, nil)

	ro := e.session("acme", nil, jwtauth.ScopeRead)
	for name, args := range map[string]map[string]any{
		"sandbox_create":     nil,
		"sandbox_exec":       {"sandbox_id": sb.ID, "command": "touch /tmp/ran"},
		"sandbox_write_file": {"sandbox_id": sb.ID, "path": "/tmp/ran", "content": "x"},
		"sandbox_kill":       {"sandbox_id": sb.ID},
		"sandbox_read_file":  {"sandbox_id": sb.ID, "path": "/etc/hostname"},
		"sandbox_list_files": {"sandbox_id": sb.ID, "path": "/tmp"},
	} {
		if msg := call(t, ro, name, args, nil); msg != "permission_denied: missing scope sandboxes:write" {
			t.Errorf("%s with sandboxes:read only: %q", name, msg)
		}
	}
	var list struct{ Sandboxes []sandboxOut }
	mustCall(t, ro, "sandbox_list", nil, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Errorf("sandbox_list with sandboxes:read: %+v (the refused create made one?)", list)
	}

	wo := e.session("acme", nil, jwtauth.ScopeWrite)
	for name, args := range map[string]map[string]any{
		"sandbox_list": nil,
	} {
		if msg := call(t, wo, name, args, nil); msg != "permission_denied: missing scope sandboxes:read" {
			t.Errorf("%s with sandboxes:write only: %q", name, msg)
		}
	}
	var x execOut
	mustCall(t, full, "sandbox_exec", map[string]any{"sandbox_id": sb.ID, "command": "test -e /tmp/ran; echo $?"}, &x)
	if x.Stdout != "1\n" {
		t.Errorf("a refused call ran: /tmp/ran exists (%+v)", x)
	}
}

// TestTenantIsolation: another tenant's sandbox is not found by any tool.
func TestTenantIsolation(t *testing.T) {
	e := newEnv(t, nil)
	acme := e.session("acme", nil, full...)
	sb := e.create(acme, nil)

	other := e.session("other", nil, full...)
	for name, args := range map[string]map[string]any{
		"sandbox_exec":       {"sandbox_id": sb.ID, "command": "true"},
		"sandbox_write_file": {"sandbox_id": sb.ID, "path": "/tmp/x", "content": "x"},
		"sandbox_read_file":  {"sandbox_id": sb.ID, "path": "/etc/hostname"},
		"sandbox_list_files": {"sandbox_id": sb.ID, "path": "/"},
		"sandbox_kill":       {"sandbox_id": sb.ID},
	} {
		if msg := call(t, other, name, args, nil); !strings.HasPrefix(msg, "not_found:") {
			t.Errorf("%s on another tenant's sandbox: %q, want not_found", name, msg)
		}
	}
	var list struct{ Sandboxes []sandboxOut }
	mustCall(t, other, "sandbox_list", nil, &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("sandbox_list shows another tenant's sandboxes: %+v", list)
	}
	mustCall(t, acme, "sandbox_exec", map[string]any{"sandbox_id": sb.ID, "command": "true"}, nil) // still there
}

// TestExecTruncation: each stream keeps its first 16 KiB and last 48 KiB,
// with a note saying how much was cut.
func TestExecTruncation(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.session("acme", nil, full...)
	sb := e.create(cs, nil)
	var x execOut
	mustCall(t, cs, "sandbox_exec", map[string]any{"sandbox_id": sb.ID,
		"command": `printf 'A%.0s' $(seq 16384); head -c 100000 /dev/zero | tr '\0' m; printf 'Z%.0s' $(seq 49152); seq 1000 >&2`}, &x)
	const total = 16384 + 100000 + 49152
	if x.StdoutBytes != total || x.ExitCode != 0 {
		t.Fatalf("stdout_bytes %d exit %d, want %d and 0", x.StdoutBytes, x.ExitCode, total)
	}
	note := fmt.Sprintf("\n[sandboxd: 100000 bytes of stdout cut here; it wrote %d bytes, of which the first 16384 and the last 49152 are shown]\n", total)
	want := strings.Repeat("A", 16384) + note + strings.Repeat("Z", 49152)
	if x.Stdout != want {
		t.Errorf("stdout: %d bytes, starts %.40q, want the head, the note %q and the tail", len(x.Stdout), x.Stdout, note)
	}
	if !strings.HasPrefix(x.Stderr, "1\n2\n") || !strings.HasSuffix(x.Stderr, "999\n1000\n") || strings.Contains(x.Stderr, "cut") {
		t.Errorf("stderr (small, whole): %.60q", x.Stderr)
	}
}

// TestExecProgress: a long command sends progress notifications that carry
// its output as it comes, increasing, with the timeout as total.
func TestExecProgress(t *testing.T) {
	e := newEnv(t, nil)
	pl := newProgressLog()
	cs := e.session("acme", pl, full...)
	sb := e.create(cs, nil)
	p := &sdk.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"sandbox_id": sb.ID, "timeout": 30,
		"command": "for i in 1 2 3; do echo line$i; sleep 1; done; sleep 2.5; echo done"}}
	p.SetProgressToken("tok-1")
	res, err := cs.CallTool(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	var x execOut
	if msg := decode(t, "sandbox_exec", res, &x); msg != "" || x.Stdout != "line1\nline2\nline3\ndone\n" {
		t.Fatalf("sandbox_exec: %q %+v", msg, x)
	}
	got := pl.all()
	var msgs string
	last := -1.0
	heartbeat := false
	for _, n := range got {
		if n.ProgressToken != "tok-1" || n.Total != 30 || n.Progress <= last {
			t.Errorf("notification %+v (previous progress %v)", n, last)
		}
		last = n.Progress
		msgs += n.Message
		heartbeat = heartbeat || strings.HasPrefix(n.Message, "running for ")
	}
	for _, l := range []string{"line1\n", "line2\n", "line3\n"} {
		if !strings.Contains(msgs, l) {
			t.Errorf("no progress notification carried %q; got %d: %q", l, len(got), msgs)
		}
	}
	if !heartbeat {
		t.Errorf("no heartbeat through 2.5 s of silence: %q", msgs)
	}
}

// TestExecCancel: cancelling the call kills the command in the sandbox.
func TestExecCancel(t *testing.T) {
	e := newEnv(t, nil)
	pl := newProgressLog()
	cs := e.session("acme", pl, full...)
	sb := e.create(cs, nil)
	execCancelKills(t, cs, pl, sb.ID)
}

// execCancelKills starts a long command, cancels the call once it printed,
// and checks the command is gone from the sandbox.
func execCancelKills(t *testing.T, cs *sdk.ClientSession, pl *progressLog, id string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &sdk.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"sandbox_id": id, "timeout": 600,
		"command": "echo $$ > /tmp/pid; echo started; exec sleep 600"}}
	p.SetProgressToken("cancel-me")
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, p)
		errc <- err
	}()
	deadline := time.After(30 * time.Second)
	for started := false; !started; {
		select {
		case <-pl.seen:
			for _, n := range pl.all() {
				started = started || strings.Contains(n.Message, "started")
			}
		case <-deadline:
			t.Fatal("no progress notification with the command's output")
		}
	}
	cancel()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a cancelled call returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled call did not return")
	}
	var x execOut
	for end := time.Now().Add(10 * time.Second); ; {
		mustCall(t, cs, "sandbox_exec", map[string]any{"sandbox_id": id, "command": "kill -0 $(cat /tmp/pid) 2>/dev/null && echo alive || echo gone"}, &x)
		if x.Stdout == "gone\n" {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the command of the cancelled call still runs: %+v", x)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestExecTimeout: the timeout kills the command and says so.
func TestExecTimeout(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.session("acme", nil, full...)
	sb := e.create(cs, nil)
	var x execOut
	start := time.Now()
	mustCall(t, cs, "sandbox_exec", map[string]any{"sandbox_id": sb.ID, "timeout": 1, "command": "echo before; sleep 30"}, &x)
	if !x.TimedOut || x.ExitCode != -1 || x.Stdout != "before\n" || time.Since(start) > 10*time.Second {
		t.Errorf("sandbox_exec past its timeout: %+v after %v", x, time.Since(start))
	}
}

// bearerClient sends token as a bearer on every request.
func bearerClient(token string) *http.Client {
	return &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+token)
		return http.DefaultTransport.RoundTrip(r)
	})}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
