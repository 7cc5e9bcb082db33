package filesystem

import (
	"context"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// Stat describes one entry without following a final symlink; a missing path
// is not_found, which the SDKs' files.exists turns into false.
func (s *Service) Stat(_ context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	path, u, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	var e *filesystem.EntryInfo
	if err := permissions.AsUser(u, func() (err error) { e, err = EntryInfo(path); return err }); err != nil {
		return nil, rpcerr.Connect(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}
