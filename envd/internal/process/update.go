package process

import (
	"context"
	"errors"
	"fmt"
	"os"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// Update resizes the PTY of a running process. A request without a pty
// changes nothing.
func (s *Service) Update(_ context.Context, req *connect.Request[rpc.UpdateRequest]) (*connect.Response[rpc.UpdateResponse], error) {
	p, err := s.lookupRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	if req.Msg.GetPty() != nil {
		if p.tty == nil {
			return nil, rpcerr.Connect(fmt.Errorf("%w: process %d has no PTY to resize", rpcerr.ErrFailedPrecondition, p.pid))
		}
		if err := setWinsize(p.tty, req.Msg.GetPty().GetSize()); err != nil {
			if p.finished() || errors.Is(err, os.ErrClosed) {
				err = p.errExited() // the terminal went away with the process
			}
			return nil, rpcerr.Connect(fmt.Errorf("resize pty of process %d: %w", p.pid, err))
		}
	}
	return connect.NewResponse(&rpc.UpdateResponse{}), nil
}
