package process

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

func TestSendSignal(t *testing.T) {
	e := newTestEnv(t)
	tests := []struct {
		name   string
		signal rpc.Signal
		status string
	}{
		{"SIGKILL", rpc.Signal_SIGNAL_SIGKILL, "signal: killed"},
		{"SIGTERM", rpc.Signal_SIGNAL_SIGTERM, "signal: terminated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("sleep", "100"), Stdin: ptr(false)}, nil)
			pid := ev.started()
			if _, err := e.client.SendSignal(t.Context(), connect.NewRequest(&rpc.SendSignalRequest{Process: byPid(pid), Signal: tt.signal})); err != nil {
				t.Fatalf("SendSignal: %v", err)
			}
			end := ev.rest().end
			if end.GetStatus() != tt.status || end.GetExitCode() != -1 || end.GetExited() {
				t.Fatalf("end = %v; want %q, exitCode -1", end, tt.status)
			}
		})
	}
}

func TestSendSignalErrors(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: cmd("sleep", "100"), Stdin: ptr(false)}, nil)
	pid := ev.started()
	tests := []struct {
		name   string
		sel    *rpc.ProcessSelector
		signal rpc.Signal
		want   connect.Code
	}{
		{"unknown pid", byPid(1 << 30), rpc.Signal_SIGNAL_SIGKILL, connect.CodeNotFound},
		{"unknown tag", byTag("nope"), rpc.Signal_SIGNAL_SIGKILL, connect.CodeNotFound},
		{"unspecified signal", byPid(pid), rpc.Signal_SIGNAL_UNSPECIFIED, connect.CodeInvalidArgument},
		{"unknown signal number", byPid(pid), rpc.Signal(2), connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.client.SendSignal(t.Context(), connect.NewRequest(&rpc.SendSignalRequest{Process: tt.sel, Signal: tt.signal}))
			codeIs(t, "SendSignal", err, tt.want)
		})
	}
	e.kill(t, byPid(pid))
	ev.rest()
}

// A kill reaches the whole process group: children a shell started in the
// background die with it, so they cannot hold the output open either.
func TestSendSignalKillsProcessGroup(t *testing.T) {
	e := newTestEnv(t)
	ev := e.start(t, t.Context(), &rpc.StartRequest{Process: sh("sleep 1000 & echo $!; wait"), Stdin: ptr(false)}, nil)
	pid := ev.started()
	child, err := strconv.Atoi(strings.TrimSpace(ev.until("\n")))
	if err != nil {
		t.Fatal(err)
	}
	e.kill(t, byPid(pid))
	if end := ev.rest().end; end.GetStatus() != "signal: killed" {
		t.Fatalf("end = %v", end)
	}
	// The orphaned child is reparented; it is dead once it is gone or a zombie.
	eventually(t, "background child to die", func() bool { return deadOrZombie(child) })
}

func deadOrZombie(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// Fields after the parenthesised command: state is the first.
	s := string(stat)
	rest := s[strings.LastIndexByte(s, ')')+1:]
	return strings.HasPrefix(strings.TrimSpace(rest), "Z")
}
