package e2b

import (
	"context"

	"github.com/sandboxd/sandboxd/errdefs"
)

// notImplemented answers the E2B routes sandboxd does not serve yet with 501
// and E2B's error body. Each is listed in the README's compatibility table.
type notImplemented struct{}

func unimplemented(what string) error {
	return errdefs.New(errdefs.ErrNotImplemented, what+" is not implemented by sandboxd")
}

// unimplementedOn answers a route that names a sandbox as E2B would before
// it gets to the work: 404 for a sandbox that does not exist, is gone, or
// belongs to another tenant; 501 only for one the caller could act on.
func (a *API) unimplementedOn(ctx context.Context, id, what string) error {
	if _, err := a.mgr.GetView(ctx, id); err != nil {
		return err
	}
	return unimplemented(what)
}
