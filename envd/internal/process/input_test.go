package process

import (
	"testing"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

func TestStdinRoundTripAndCloseStdin(t *testing.T) {
	e := newTestEnv(t)
	// stdin absent means open, for clients older than envd 0.3.0.
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("cat")}, nil)
	pid := ev.started()
	e.sendStdin(t, pid, "hello\n")
	if got := ev.until("hello\n"); got != "hello\n" {
		t.Fatalf("echo = %q", got)
	}
	e.sendStdin(t, pid, "world")
	ev.until("world")
	if _, err := e.client.CloseStdin(t.Context(), connect.NewRequest(&rpc.CloseStdinRequest{Process: byPid(pid)})); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	r := ev.rest()
	if r.end.GetExitCode() != 0 || r.stdout.Len() != 0 {
		t.Fatalf("after CloseStdin: end %v, stdout %q; want cat to exit 0", r.end, r.stdout.String())
	}
}

func TestCloseStdinIsIdempotent(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: sh("cat; echo eof; exec sleep 100"), Stdin: ptr(true)}, nil)
	pid := ev.started()
	for i := range 2 {
		if _, err := e.client.CloseStdin(t.Context(), connect.NewRequest(&rpc.CloseStdinRequest{Process: byPid(pid)})); err != nil {
			t.Fatalf("CloseStdin #%d: %v", i+1, err)
		}
		if i == 0 {
			ev.until("eof\n")
		}
	}
	_, err := e.client.SendInput(t.Context(), connect.NewRequest(&rpc.SendInputRequest{
		Process: byPid(pid), Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte("late")}},
	}))
	codeIs(t, "SendInput after CloseStdin", err, connect.CodeFailedPrecondition)
	e.kill(t, byPid(pid))
	ev.rest()
}

func TestStreamInput(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("cat"), Stdin: ptr(true)}, nil)
	pid := ev.started()

	in := e.client.StreamInput(t.Context())
	msgs := []*rpc.StreamInputRequest{
		{Event: &rpc.StreamInputRequest_Start{Start: &rpc.StreamInputRequest_StartEvent{Process: byPid(pid)}}},
		{Event: &rpc.StreamInputRequest_Keepalive{Keepalive: &rpc.StreamInputRequest_KeepAlive{}}},
		{Event: &rpc.StreamInputRequest_Data{Data: &rpc.StreamInputRequest_DataEvent{Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte("a")}}}}},
		{Event: &rpc.StreamInputRequest_Data{Data: &rpc.StreamInputRequest_DataEvent{Input: &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte("b\n")}}}}},
	}
	for _, m := range msgs {
		if err := in.Send(m); err != nil {
			t.Fatalf("StreamInput send: %v", err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatalf("StreamInput: %v", err)
	}
	if got := ev.until("ab\n"); got != "ab\n" {
		t.Fatalf("output = %q", got)
	}

	// Data before start, and an unknown process, are refused.
	bad := e.client.StreamInput(t.Context())
	_ = bad.Send(msgs[2])
	_, err := bad.CloseAndReceive()
	codeIs(t, "StreamInput without start", err, connect.CodeInvalidArgument)
	unknown := e.client.StreamInput(t.Context())
	_ = unknown.Send(&rpc.StreamInputRequest{Event: &rpc.StreamInputRequest_Start{Start: &rpc.StreamInputRequest_StartEvent{Process: byPid(1 << 30)}}})
	_, err = unknown.CloseAndReceive()
	codeIs(t, "StreamInput to unknown pid", err, connect.CodeNotFound)

	e.kill(t, byPid(pid))
	ev.rest()
}

func TestInputErrors(t *testing.T) {
	e := newTestEnv(t)
	noStdin := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("sleep", "100"), Stdin: ptr(false)}, nil)
	noStdinPid := noStdin.started()
	withPTY := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("sleep", "100"), Pty: &rpc.PTY{Size: &rpc.PTY_Size{Cols: 80, Rows: 24}}}, nil)
	ptyPid := withPTY.started()

	stdin := &rpc.ProcessInput{Input: &rpc.ProcessInput_Stdin{Stdin: []byte("x")}}
	ptyIn := &rpc.ProcessInput{Input: &rpc.ProcessInput_Pty{Pty: []byte("x")}}
	sendTests := []struct {
		name string
		sel  *rpc.ProcessSelector
		in   *rpc.ProcessInput
		want connect.Code
	}{
		{"unknown pid", byPid(1 << 30), stdin, connect.CodeNotFound},
		{"unknown tag", byTag("nope"), stdin, connect.CodeNotFound},
		{"no selector", nil, stdin, connect.CodeInvalidArgument},
		{"stdin disabled", byPid(noStdinPid), stdin, connect.CodeFailedPrecondition},
		{"pty bytes without a pty", byPid(noStdinPid), ptyIn, connect.CodeFailedPrecondition},
		{"stdin bytes to a pty", byPid(ptyPid), stdin, connect.CodeFailedPrecondition},
		{"empty input", byPid(ptyPid), &rpc.ProcessInput{}, connect.CodeInvalidArgument},
		{"nil input", byPid(ptyPid), nil, connect.CodeInvalidArgument},
	}
	for _, tt := range sendTests {
		t.Run("SendInput "+tt.name, func(t *testing.T) {
			_, err := e.client.SendInput(t.Context(), connect.NewRequest(&rpc.SendInputRequest{Process: tt.sel, Input: tt.in}))
			codeIs(t, "SendInput", err, tt.want)
		})
	}

	closeTests := []struct {
		name string
		sel  *rpc.ProcessSelector
		want connect.Code // CodeOK-like zero means success
	}{
		{"unknown pid", byPid(1 << 30), connect.CodeNotFound},
		{"pty", byPid(ptyPid), connect.CodeFailedPrecondition},
		{"stdin disabled is a no-op", byPid(noStdinPid), 0},
	}
	for _, tt := range closeTests {
		t.Run("CloseStdin "+tt.name, func(t *testing.T) {
			_, err := e.client.CloseStdin(t.Context(), connect.NewRequest(&rpc.CloseStdinRequest{Process: tt.sel}))
			if tt.want == 0 {
				if err != nil {
					t.Errorf("CloseStdin: %v", err)
				}
				return
			}
			codeIs(t, "CloseStdin", err, tt.want)
		})
	}

	e.kill(t, byPid(noStdinPid))
	e.kill(t, byPid(ptyPid))
	noStdin.rest()
	withPTY.rest()
}
