package process

import (
	"context"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
)

// List returns the processes that are still running.
func (s *Service) List(context.Context, *connect.Request[rpc.ListRequest]) (*connect.Response[rpc.ListResponse], error) {
	out := &rpc.ListResponse{Processes: []*rpc.ProcessInfo{}}
	for _, p := range s.running() {
		out.Processes = append(out.Processes, &rpc.ProcessInfo{Config: p.info, Pid: p.pid, Tag: p.tag})
	}
	return connect.NewResponse(out), nil
}
