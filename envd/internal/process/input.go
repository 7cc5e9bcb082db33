package process

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// SendInput writes stdin bytes (pipe) or pty bytes (terminal) to a running
// process.
func (s *Service) SendInput(ctx context.Context, req *connect.Request[rpc.SendInputRequest]) (*connect.Response[rpc.SendInputResponse], error) {
	p, err := s.lookupRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	if err := sendInput(ctx, p, req.Msg.GetInput()); err != nil {
		return nil, rpcerr.Connect(err)
	}
	return connect.NewResponse(&rpc.SendInputResponse{}), nil
}

// StreamInput takes ordered input over one client stream: a start event that
// selects the process, then data events; keepalives are ignored.
func (s *Service) StreamInput(ctx context.Context, stream *connect.ClientStream[rpc.StreamInputRequest]) (*connect.Response[rpc.StreamInputResponse], error) {
	var p *process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *rpc.StreamInputRequest_Start:
			var err error
			if p, err = s.lookupRunning(ev.Start.GetProcess()); err != nil {
				return nil, rpcerr.Connect(err)
			}
		case *rpc.StreamInputRequest_Data:
			if p == nil {
				return nil, rpcerr.Connect(fmt.Errorf("%w: input stream must begin with a start event", rpcerr.ErrInvalidArgument))
			}
			if err := sendInput(ctx, p, ev.Data.GetInput()); err != nil {
				return nil, rpcerr.Connect(err)
			}
		case *rpc.StreamInputRequest_Keepalive:
		default:
			return nil, rpcerr.Connect(fmt.Errorf("%w: input stream event is empty", rpcerr.ErrInvalidArgument))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, rpcerr.Connect(err)
	}
	return connect.NewResponse(&rpc.StreamInputResponse{}), nil
}

// CloseStdin gives a running process EOF on stdin. It is a no-op when stdin
// is already closed or was never open; a PTY takes Ctrl-D (0x04) instead.
func (s *Service) CloseStdin(_ context.Context, req *connect.Request[rpc.CloseStdinRequest]) (*connect.Response[rpc.CloseStdinResponse], error) {
	p, err := s.lookupRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	if p.tty != nil {
		return nil, rpcerr.Connect(fmt.Errorf("%w: process %d has a PTY; send Ctrl-D (0x04) as pty input instead", rpcerr.ErrFailedPrecondition, p.pid))
	}
	p.closeStdin()
	return connect.NewResponse(&rpc.CloseStdinResponse{}), nil
}

func sendInput(ctx context.Context, p *process, in *rpc.ProcessInput) error {
	var data []byte
	var isPTY bool
	switch v := in.GetInput().(type) {
	case *rpc.ProcessInput_Stdin:
		data = v.Stdin
	case *rpc.ProcessInput_Pty:
		data, isPTY = v.Pty, true
	default:
		return fmt.Errorf("%w: input needs stdin or pty bytes", rpcerr.ErrInvalidArgument)
	}
	f, err := p.input(isPTY)
	if err != nil {
		return err
	}
	return p.write(ctx, f, data)
}
