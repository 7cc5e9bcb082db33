package process

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

func TestStartExit(t *testing.T) {
	e := newTestEnv(t)
	tests := []struct {
		name       string
		cfg        *rpc.ProcessConfig
		stdout     string
		stderr     string
		code       int32
		exited     bool
		status     string
		wantErrMsg bool
	}{
		{"success", sh("echo out"), "out\n", "", 0, true, "exit status 0", false},
		{"interleaved with exit code", sh("echo o1; echo e1 >&2; echo o2; echo e2 >&2; exit 3"), "o1\no2\n", "e1\ne2\n", 3, true, "exit status 3", true},
		{"non-zero", cmd("false"), "", "", 1, true, "exit status 1", true},
		{"killed by signal", sh("echo bye; kill -KILL $$"), "bye\n", "", -1, false, "signal: killed", true},
		{"terminated by signal", sh("kill -TERM $$"), "", "", -1, false, "signal: terminated", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, r := e.run(t, &rpc.StartRequest{Process: tt.cfg, Stdin: ptr(false)}, nil)
			if got := r.stdout.String(); got != tt.stdout {
				t.Errorf("stdout = %q; want %q", got, tt.stdout)
			}
			if got := r.stderr.String(); got != tt.stderr {
				t.Errorf("stderr = %q; want %q", got, tt.stderr)
			}
			end := r.end
			if end.GetExitCode() != tt.code || end.GetExited() != tt.exited || end.GetStatus() != tt.status {
				t.Errorf("end = %v; want exitCode %d exited %v status %q", end, tt.code, tt.exited, tt.status)
			}
			if got := end.Error != nil; got != tt.wantErrMsg || (got && end.GetError() != tt.status) {
				t.Errorf("end.error = %v; want set=%v (%q)", end.Error, tt.wantErrMsg, tt.status)
			}
			if k := r.kinds; k[len(k)-1] != "end" || slices.Contains(k[:len(k)-1], "end") {
				t.Errorf("event kinds = %v; want data... then one end", k)
			}
		})
	}
}

func TestStartLargeOutputIntact(t *testing.T) {
	e := newTestEnv(t)
	want := make([]byte, 2<<20)
	_, _ = rand.Read(want)
	file := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(file, want, 0o644); err != nil {
		t.Fatal(err)
	}
	_, r := e.run(t, &rpc.StartRequest{Process: cmd("cat", file), Stdin: ptr(false)}, nil)
	if !bytes.Equal(r.stdout.Bytes(), want) {
		t.Fatalf("stdout: got %d bytes, want %d identical bytes", r.stdout.Len(), len(want))
	}
	if r.end.GetExitCode() != 0 {
		t.Fatalf("end = %v", r.end)
	}
}

func TestStartUserAndCredentials(t *testing.T) {
	e := newTestEnv(t)
	tests := []struct {
		name   string
		user   string // "" = default user (root here)
		want   string
		groups string
	}{
		{"default user", "", "0 root root root /root", ""},
		{"root", "root", "0 root root root /root", ""},
		{"nobody", "nobody", "65534 nobody nobody nobody /nonexistent", "65534"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hdr{}
			if tt.user != "" {
				h["user"] = tt.user
			}
			_, r := e.run(t, &rpc.StartRequest{
				Process: &rpc.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `echo "$(id -u) $(id -un) $USER $LOGNAME $HOME"; id -G`}, Cwd: ptr("/tmp")},
				Stdin:   ptr(false),
			}, h)
			lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
			if lines[0] != tt.want {
				t.Errorf("identity = %q; want %q (stderr %q)", lines[0], tt.want, r.stderr.String())
			}
			if tt.groups != "" && (len(lines) < 2 || lines[1] != tt.groups) {
				t.Errorf("groups = %q; want %q", lines[1:], tt.groups)
			}
		})
	}
}

func TestStartEnvMergeOrder(t *testing.T) {
	e := newTestEnv(t)
	e.mergeEnvs(t, map[string]string{"A": "sandbox", "B": "sandbox", "USER": "sandbox-user"})
	_, r := e.run(t, &rpc.StartRequest{
		Process: &rpc.ProcessConfig{
			Cmd:  "/bin/sh",
			Args: []string{"-c", `echo "$A $B $C $USER $LOGNAME $HOME"; echo "$PATH"`},
			Envs: map[string]string{"B": "request", "C": "request", "HOME": "/override"},
		},
		Stdin: ptr(false),
	}, hdr{"user": "root"})
	lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
	if want := "sandbox request request sandbox-user root /override"; lines[0] != want {
		t.Errorf("env = %q; want %q", lines[0], want)
	}
	wantPath := os.Getenv("PATH")
	if wantPath == "" {
		wantPath = defaultPath
	}
	if len(lines) < 2 || lines[1] != wantPath {
		t.Errorf("PATH = %q; want %q", lines[1:], wantPath)
	}
}

func TestStartRequestPathUsedForLookup(t *testing.T) {
	e := newTestEnv(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "my-tool"), []byte("#!/bin/sh\necho tool ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, r := e.run(t, &rpc.StartRequest{
		Process: &rpc.ProcessConfig{Cmd: "my-tool", Envs: map[string]string{"PATH": dir + ":/usr/bin:/bin"}},
		Stdin:   ptr(false),
	}, nil)
	if got := r.stdout.String(); got != "tool ran\n" {
		t.Fatalf("stdout = %q", got)
	}
}

func TestStartCwd(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		cwd     *string
		workdir string
		want    string
	}{
		{"request cwd", ptr(dir), "", dir},
		{"default workdir", nil, dir, dir},
		{"home when nothing set", nil, "", "/root"},
		{"tilde", ptr("~"), dir, "/root"},
		{"relative to home", ptr("."), dir, "/root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t)
			e.setWorkdir(t, tt.workdir)
			_, r := e.run(t, &rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: "pwd", Cwd: tt.cwd}, Stdin: ptr(false)}, hdr{"user": "root"})
			if got := strings.TrimSpace(r.stdout.String()); got != tt.want {
				t.Errorf("pwd = %q; want %q", got, tt.want)
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	e := newTestEnv(t)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		msg  *rpc.StartRequest
		h    hdr
		want connect.Code
	}{
		{"unknown user", &rpc.StartRequest{Process: cmd("true")}, hdr{"user": "no-such-user"}, connect.CodeUnauthenticated},
		{"malformed basic auth", &rpc.StartRequest{Process: cmd("true")}, hdr{"Authorization": "Basic %%%"}, connect.CodeUnauthenticated},
		{"missing cwd", &rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: "true", Cwd: ptr("/no/such/dir")}}, nil, connect.CodeInvalidArgument},
		{"cwd is a file", &rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: "true", Cwd: ptr(file)}}, nil, connect.CodeInvalidArgument},
		{"cwd of another user's home", &rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: "true", Cwd: ptr("~nobody")}}, nil, connect.CodeInvalidArgument},
		{"nil process", &rpc.StartRequest{}, nil, connect.CodeInvalidArgument},
		{"empty cmd", &rpc.StartRequest{Process: cmd("")}, nil, connect.CodeInvalidArgument},
		{"NUL in arg", &rpc.StartRequest{Process: cmd("echo", "a\x00b")}, nil, connect.CodeInvalidArgument},
		{"bad env key", &rpc.StartRequest{Process: &rpc.ProcessConfig{Cmd: "true", Envs: map[string]string{"A=B": "x"}}}, nil, connect.CodeInvalidArgument},
		{"binary not in PATH", &rpc.StartRequest{Process: cmd("no-such-binary-xyz")}, nil, connect.CodeNotFound},
		{"absolute binary missing", &rpc.StartRequest{Process: cmd("/no/such/binary")}, nil, connect.CodeNotFound},
		{"not executable", &rpc.StartRequest{Process: cmd(file)}, nil, connect.CodePermissionDenied},
		{"pty too large", &rpc.StartRequest{Process: cmd("true"), Pty: &rpc.PTY{Size: &rpc.PTY_Size{Cols: 1 << 20, Rows: 1}}}, nil, connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := e.startCode(t, tt.msg, tt.h); got != tt.want {
				t.Errorf("Start code = %v; want %v", got, tt.want)
			}
		})
	}
	if ps := e.running(t); len(ps) != 0 {
		t.Errorf("failed starts left %d processes behind", len(ps))
	}
}

func TestStartNilPTYSizeStillStarts(t *testing.T) {
	e := newTestEnv(t)
	_, r := e.run(t, &rpc.StartRequest{Process: cmd("echo", "hi"), Pty: &rpc.PTY{}}, nil)
	if got := r.pty.String(); got != "hi\r\n" {
		t.Fatalf("pty output = %q", got)
	}
}

func TestStartKeepalive(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("cat")}, hdr{"Keepalive-Ping-Interval": "1"})
	pid := ev.started()
	if got := ev.next(); got.GetKeepalive() == nil {
		t.Fatalf("event after start on an idle process = %v; want keepalive", got)
	}
	// Data resets the idle timer and is delivered as is.
	e.sendStdin(t, pid, "ping\n")
	if got := ev.until("ping\n"); got != "ping\n" {
		t.Fatalf("output = %q", got)
	}
	if got := ev.next(); got.GetKeepalive() == nil {
		t.Fatalf("event after idle data = %v; want keepalive", got)
	}
	e.kill(t, byPid(pid))
	if r := ev.rest(); r.end.GetStatus() != "signal: killed" {
		t.Fatalf("end = %v", r.end)
	}
}

func TestStartTimeoutKillsProcess(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("sleep", "100"), Stdin: ptr(false)}, hdr{"Connect-Timeout-Ms": "300"})
	pid := ev.started()
	// The deadline also bounds the RPC, and it wins over the end event
	// that the kill produces: the SDKs raise their timeout error on it.
	for ev.receive() {
	}
	if err := ev.err(); connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("stream error = %v; want deadline_exceeded", err)
	}
	// Retention tells what happened to the process.
	r := e.connect(t, t.Context(), byPid(pid), nil)
	r.started()
	if end := r.rest().end; end.GetStatus() != "signal: killed" || end.GetExitCode() != -1 {
		t.Fatalf("end = %v; want killed by the timeout", end)
	}
}

func TestDisconnectDoesNotKillProcess(t *testing.T) {
	for _, proto := range []string{"h2c", "http1"} {
		t.Run(proto, func(t *testing.T) {
			e := newTestEnvOver(t, proto)
			ctx, cancel := contextWithCancel(t)
			ev := e.start(t, ctx, &rpc.StartRequest{Process: sh(`echo before; read line; echo "got $line"`)}, nil)
			pid := ev.started()
			ev.until("before")
			cancel() // the client goes away mid-stream

			// The server notices: the Start handler returns while the
			// process keeps running. (Seen in process only: it looks for
			// the handler's goroutine.)
			eventually(t, "the Start handler to return", func() bool {
				if !e.inProcess() {
					return true
				}
				for _, g := range packageGoroutines() {
					if strings.Contains(g, "process.(*Service).Start(") {
						return false
					}
				}
				return true
			})

			re := e.connect(t, t.Context(), byPid(pid), nil)
			if got := re.started(); got != pid {
				t.Fatalf("reconnect start pid = %d; want %d", got, pid)
			}
			e.sendStdin(t, pid, "x\n")
			r := re.rest()
			if got := r.stdout.String(); got != "got x\n" {
				t.Fatalf("output after reconnect = %q", got)
			}
			if r.end.GetExitCode() != 0 {
				t.Fatalf("end = %v", r.end)
			}
		})
	}
}

func TestStartOverHTTP1(t *testing.T) {
	e := newTestEnvOver(t, "http1")
	_, r := e.run(t, &rpc.StartRequest{Process: sh("echo one; echo two >&2"), Stdin: ptr(false)}, hdr{"Keepalive-Ping-Interval": "50"})
	if r.stdout.String() != "one\n" || r.stderr.String() != "two\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("stdout %q stderr %q end %v", r.stdout.String(), r.stderr.String(), r.end)
	}
}

// Processes envd starts are the preferred OOM victims, so that envd, the
// sandbox's way in, outlives a workload that exhausts memory.
func TestStartedProcessesArePreferredOOMVictims(t *testing.T) {
	e := newTestEnv(t)
	// The score is written right after the fork, before the start event:
	// wait for a line on stdin so the shell reads it after that.
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: sh("read x; cat /proc/$$/oom_score_adj"), Stdin: ptr(true)}, nil)
	pid := ev.started()
	e.sendStdin(t, pid, "go\n")
	res := ev.rest()
	if got := strings.TrimSpace(res.stdout.String()); got != childOOMScoreAdj {
		t.Errorf("oom_score_adj of a started process = %q; want %q", got, childOOMScoreAdj)
	}
}
