package process

import (
	"context"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// Connect attaches to a running process, by pid or tag: start, then output
// from now on, then end. A process that exited within the retention window
// answers start and end.
func (s *Service) Connect(ctx context.Context, req *connect.Request[rpc.ConnectRequest], stream *connect.ServerStream[rpc.ConnectResponse]) error {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return rpcerr.Connect(err)
	}
	sub, _ := p.events.subscribe() // nil once p has ended
	return s.stream(ctx, req.Header(), p, sub, func(ev *rpc.ProcessEvent) error {
		return stream.Send(&rpc.ConnectResponse{Event: ev})
	})
}
