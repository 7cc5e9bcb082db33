package process

import (
	"context"
	"fmt"
	"syscall"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// SendSignal delivers SIGKILL or SIGTERM to a running process and everything
// in its process group.
func (s *Service) SendSignal(_ context.Context, req *connect.Request[rpc.SendSignalRequest]) (*connect.Response[rpc.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case rpc.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case rpc.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, rpcerr.Connect(fmt.Errorf("%w: unsupported signal %s", rpcerr.ErrInvalidArgument, req.Msg.GetSignal()))
	}
	p, err := s.lookupRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	if err := p.signal(sig); err != nil {
		return nil, rpcerr.Connect(fmt.Errorf("signal process %d: %w", p.pid, err))
	}
	return connect.NewResponse(&rpc.SendSignalResponse{}), nil
}
