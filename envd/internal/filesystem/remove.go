package filesystem

import (
	"context"
	"os"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// Remove deletes a file, a symlink (not its target) or a whole directory
// tree. Removing a path that does not exist succeeds: E2B's envd uses
// os.RemoveAll and the SDK suites assert that removing a missing file does not
// throw.
func (s *Service) Remove(_ context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	path, u, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.Connect(err)
	}
	if err := permissions.AsUser(u, func() error { return os.RemoveAll(path) }); err != nil {
		return nil, rpcerr.Connect(err)
	}
	s.log.Info("removed", "path", path, "user", u.Name)
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
