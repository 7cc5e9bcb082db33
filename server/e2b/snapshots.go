package e2b

import (
	"context"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/e2bapi"
	"github.com/sandboxd/sandboxd/server/httpx"
)

// ForkSandbox starts the forks and reports each: its sandbox as a create
// would, or its error with E2B's {code, message}.
func (a *API) ForkSandbox(ctx context.Context, req e2bapi.ForkSandboxRequestObject) (e2bapi.ForkSandboxResponseObject, error) {
	var timeout time.Duration
	count := 1
	if b := req.Body; b != nil {
		if b.Timeout != nil {
			if *b.Timeout < 0 {
				return nil, errdefs.New(errdefs.ErrInvalidArgument, "timeout must not be negative")
			}
			timeout = time.Duration(*b.Timeout) * time.Second
		}
		if b.Count != nil {
			count = int(*b.Count)
		}
	}
	forks, err := a.mgr.Fork(ctx, req.SandboxID, timeout, count)
	if err != nil {
		return nil, err
	}
	out := make(e2bapi.ForkSandbox201JSONResponse, len(forks))
	for i, f := range forks {
		if f.Err != nil {
			status, msg, _ := httpx.Describe(f.Err)
			if status >= 500 {
				a.log.ErrorContext(ctx, "fork failed", "sandbox_id", req.SandboxID, "status", status, "err", f.Err)
			}
			out[i].Error = &e2bapi.Error{Code: int32(status), Message: msg}
			continue
		}
		sb := a.sandboxBody(f.Sandbox)
		out[i].Sandbox = &sb
	}
	return out, nil
}

func (a *API) CreateSnapshot(ctx context.Context, req e2bapi.CreateSnapshotRequestObject) (e2bapi.CreateSnapshotResponseObject, error) {
	if a.tpl == nil {
		return nil, a.unimplementedOn(ctx, req.SandboxID, "CreateSnapshot")
	}
	name := ""
	if b := req.Body; b != nil {
		if b.Memory != nil && *b.Memory {
			// Kept processes need CRIU or a VM; the default (memory
			// absent) is taken as the filesystem snapshot sandboxd makes.
			if _, err := a.mgr.GetView(ctx, req.SandboxID); err != nil {
				return nil, err
			}
			return nil, errdefs.New(errdefs.ErrNotImplemented, "memory snapshots are not supported by sandboxd: snapshots keep the filesystem only (mode 'filesystem')")
		}
		if b.Name != nil {
			name = *b.Name
		}
	}
	info, err := a.tpl.Snapshot(ctx, a.mgr, tenantOf(ctx), req.SandboxID, name)
	if err != nil {
		return nil, err
	}
	return e2bapi.CreateSnapshot201JSONResponse{SnapshotID: info.ID, Names: info.Names}, nil
}

func (a *API) ListSnapshots(ctx context.Context, req e2bapi.ListSnapshotsRequestObject) (e2bapi.ListSnapshotsResponseObject, error) {
	out := e2bapi.ListSnapshots200JSONResponse{Body: []e2bapi.SnapshotInfo{}}
	if a.tpl == nil {
		return out, nil // no template service: no snapshots
	}
	p := req.Params
	limit := 100
	if p.Limit != nil {
		limit = int(*p.Limit)
	}
	page, next, err := a.tpl.ListSnapshots(ctx, tenantOf(ctx), deref(p.SandboxID), deref(p.Name), deref(p.NextToken), limit)
	if err != nil {
		return nil, err
	}
	for _, s := range page {
		out.Body = append(out.Body, e2bapi.SnapshotInfo{SnapshotID: s.ID, Names: s.Names})
	}
	if next != "" {
		out.Headers.XNextToken = ptr(next)
	}
	return out, nil
}
