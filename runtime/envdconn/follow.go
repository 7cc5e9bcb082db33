package envdconn

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

// Output is the event stream of a process started (StartOutput) or
// attached to (Attach), read by Follow. Close it when done; closing ends
// the stream, not the process (envd keeps a process whose client went).
type Output struct {
	Pid    uint32
	stream eventStream
	event  func() *rpc.ProcessEvent // the current message's event
}

// eventStream is what Start's and Connect's server streams share.
type eventStream interface {
	Receive() bool
	Err() error
	Close() error
}

// newOutput reads s up to the start event, which every stream opens with.
func newOutput(s eventStream, event func() *rpc.ProcessEvent) (*Output, error) {
	for s.Receive() {
		if st := event().GetStart(); st != nil {
			return &Output{Pid: st.GetPid(), stream: s, event: event}, nil
		}
	}
	_ = s.Close()
	if err := s.Err(); err != nil {
		return nil, err
	}
	return nil, ErrNoEnd
}

// StartOutput starts cmd and returns once envd has it running, its output
// left to Follow.
func (c *Client) StartOutput(ctx context.Context, cmd Command) (*Output, error) {
	stream, err := c.start(ctx, cmd)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Cmd, err)
	}
	o, err := newOutput(stream, func() *rpc.ProcessEvent { return stream.Msg().GetEvent() })
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Cmd, err)
	}
	return o, nil
}

// Attach follows the running process tagged tag (envd's Connect): its
// output from now on is left to Follow. A process that is not running is
// connect.CodeNotFound.
func (c *Client) Attach(ctx context.Context, tag string) (*Output, error) {
	req := connect.NewRequest(&rpc.ConnectRequest{Process: &rpc.ProcessSelector{Selector: &rpc.ProcessSelector_Tag{Tag: tag}}})
	c.Auth(req.Header())
	stream, err := c.Process().Connect(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", tag, err)
	}
	o, err := newOutput(stream, func() *rpc.ProcessEvent { return stream.Msg().GetEvent() })
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", tag, err)
	}
	return o, nil
}

// Follow passes the process's output to out (when not nil), a chunk at a
// time, until the process ends (its Exit), or the stream breaks or its
// context ends (an error).
func (o *Output) Follow(out func(stdout, stderr []byte)) (Exit, error) {
	for o.stream.Receive() {
		ev := o.event()
		if d := ev.GetData(); d != nil && out != nil {
			out(d.GetStdout(), d.GetStderr())
		}
		if e := ev.GetEnd(); e != nil {
			x := Exit{ExitCode: int(e.GetExitCode()), Status: e.GetStatus()}
			if x.Status == "" {
				x.Status = e.GetError()
			}
			return x, nil
		}
	}
	if err := o.stream.Err(); err != nil {
		return Exit{}, err
	}
	return Exit{}, ErrNoEnd
}

// Close ends the stream; the process runs on.
func (o *Output) Close() { _ = o.stream.Close() }
