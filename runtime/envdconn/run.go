package envdconn

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

// Command is a process for envd to start: Cmd with Args, Env on top of
// envd's defaults, in Cwd (envd's default when empty), tagged Tag (none
// when empty) so that it can be found again by List.
type Command struct {
	Cmd  string
	Args []string
	Env  map[string]string
	Cwd  string
	Tag  string
	// Started, when set, is given the process's pid as soon as envd has
	// started it, so that a caller that gives up on Run can Kill it: envd
	// does not end a process whose client went away.
	Started func(pid uint32)
}

// Exit is how a process ended: ExitCode is -1 for a death by signal, and
// Status is envd's description ("exit status 1", "signal: killed").
type Exit struct {
	ExitCode int
	Status   string
}

// ErrNoEnd: envd's stream ended without telling how the process ended (the
// connection broke, or envd died).
var ErrNoEnd = errors.New("process stream ended without an end event")

func (c *Client) start(ctx context.Context, cmd Command) (*connect.ServerStreamForClient[rpc.StartResponse], error) {
	no := false
	req := connect.NewRequest(&rpc.StartRequest{
		Process: &rpc.ProcessConfig{Cmd: cmd.Cmd, Args: cmd.Args, Envs: cmd.Env},
		Stdin:   &no,
	})
	if cmd.Cwd != "" {
		req.Msg.Process.Cwd = &cmd.Cwd
	}
	if cmd.Tag != "" {
		req.Msg.Tag = &cmd.Tag
	}
	c.Auth(req.Header())
	return c.Process().Start(ctx, req)
}

// Run starts cmd and waits for it to end. out, when not nil, gets its
// output as it comes, a chunk at a time. An error means envd could not
// start it or the stream broke; a command that ran and failed is an Exit
// with a non-zero code and a nil error.
func (c *Client) Run(ctx context.Context, cmd Command, out func(stdout, stderr []byte)) (Exit, error) {
	o, err := c.StartOutput(ctx, cmd)
	if err != nil {
		return Exit{}, err
	}
	defer o.Close()
	if cmd.Started != nil {
		cmd.Started(o.Pid)
	}
	x, err := o.Follow(out)
	if err != nil {
		return Exit{}, fmt.Errorf("run %s: %w", cmd.Cmd, err)
	}
	return x, nil
}

// Start starts cmd and returns its pid once envd has it running, leaving
// it to run on its own: envd does not end a process whose client went away.
func (c *Client) Start(ctx context.Context, cmd Command) (pid uint32, err error) {
	o, err := c.StartOutput(ctx, cmd)
	if err != nil {
		return 0, err
	}
	o.Close()
	return o.Pid, nil
}

// Kill sends SIGKILL to process pid's group (envd signals the group); a
// process already gone is not an error.
func (c *Client) Kill(ctx context.Context, pid uint32) error {
	req := connect.NewRequest(&rpc.SendSignalRequest{
		Process: &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Pid{Pid: pid}},
		Signal:  rpc.Signal_SIGNAL_SIGKILL,
	})
	c.Auth(req.Header())
	_, err := c.Process().SendSignal(ctx, req)
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil // already gone
	}
	return err
}

// Running reports whether a process tagged tag is still running.
func (c *Client) Running(ctx context.Context, tag string) (bool, error) {
	req := connect.NewRequest(&rpc.ListRequest{})
	c.Auth(req.Header())
	resp, err := c.Process().List(ctx, req)
	if err != nil {
		return false, fmt.Errorf("list processes: %w", err)
	}
	for _, p := range resp.Msg.GetProcesses() {
		if p.GetTag() == tag {
			return true, nil
		}
	}
	return false, nil
}
