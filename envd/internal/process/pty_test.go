package process

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

func ptySize(cols, rows uint32) *rpc.PTY {
	return &rpc.PTY{Size: &rpc.PTY_Size{Cols: cols, Rows: rows}}
}

func TestPTYInteractiveShellEchoAndCtrlD(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{
		Process: &rpc.ProcessConfig{Cmd: "/bin/bash", Args: []string{"--norc", "--noprofile", "-i"}, Envs: map[string]string{"TERM": "dumb", "PS1": "$ "}},
		Pty:     ptySize(80, 24),
	}, nil)
	pid := ev.started()
	// Type only once the shell prompts: input that arrives while bash is
	// still setting up its terminal can be discarded, as on a real terminal.
	ev.until("$ ")
	// The terminal echoes the typed line (with the quotes); only running it
	// prints the joined word.
	e.sendPTY(t, pid, "echo hel''lo; tty\n")
	// Read up to the next prompt: Ctrl-D, too, must reach readline, not the
	// terminal while bash switches modes.
	out := ev.until("\r\n$ ")
	if !strings.Contains(out, "hel''lo") || !strings.Contains(out, "\r\nhello\r\n/dev/pts/") {
		t.Errorf("output = %q; want the echoed input line, hello, then the tty name", out)
	}
	e.sendPTY(t, pid, "\x04") // Ctrl-D on an empty line: the shell exits
	r := ev.rest()
	if r.end.GetExitCode() != 0 || !r.end.GetExited() {
		t.Fatalf("end after Ctrl-D = %v (output %q)", r.end, r.pty.String())
	}
	if r.stdout.Len() != 0 || r.stderr.Len() != 0 {
		t.Errorf("PTY output must arrive as data.pty only; got stdout %q stderr %q", r.stdout.String(), r.stderr.String())
	}
}

func TestPTYResize(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: sh("stty size; read x; stty size"), Pty: ptySize(80, 24), Tag: ptr("term")}, nil)
	pid := ev.started()
	ev.until("24 80")

	update := func(sel *rpc.ProcessSelector, p *rpc.PTY) error {
		_, err := e.client.Update(t.Context(), connect.NewRequest(&rpc.UpdateRequest{Process: sel, Pty: p}))
		return err
	}
	if err := update(byTag("term"), ptySize(100, 30)); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if err := update(byPid(pid), nil); err != nil {
		t.Fatalf("Update without pty: %v", err)
	}
	codeIs(t, "Update unknown pid", update(byPid(1<<30), ptySize(1, 1)), connect.CodeNotFound)
	codeIs(t, "Update oversized", update(byPid(pid), ptySize(1<<17, 1)), connect.CodeInvalidArgument)

	e.sendPTY(t, pid, "\n")
	ev.until("30 100")
	if r := ev.rest(); r.end.GetExitCode() != 0 {
		t.Fatalf("end = %v", r.end)
	}
}

func TestUpdateWithoutPTY(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("cat")}, nil)
	pid := ev.started()
	_, err := e.client.Update(t.Context(), connect.NewRequest(&rpc.UpdateRequest{Process: byPid(pid), Pty: ptySize(10, 10)}))
	codeIs(t, "Update on a pipe process", err, connect.CodeFailedPrecondition)
	e.kill(t, byPid(pid))
	ev.rest()
}
