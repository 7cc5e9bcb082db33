package e2b

import (
	"context"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/e2bapi"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/volume"
)

// E2B's volumes: the control routes (/volumes, API key) and the content
// routes (/volumecontent, the volume's token, checked by the server's auth
// middleware before these handlers). The work is package volume's.

func volumeAndToken(v store.Volume) e2bapi.VolumeAndToken {
	return e2bapi.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: v.Token}
}

func (a *API) ListVolumes(ctx context.Context, _ e2bapi.ListVolumesRequestObject) (e2bapi.ListVolumesResponseObject, error) {
	vs, err := a.vol.List(ctx)
	if err != nil {
		return nil, err
	}
	out := e2bapi.ListVolumes200JSONResponse{}
	for _, v := range vs {
		out = append(out, e2bapi.Volume{VolumeID: v.ID, Name: v.Name})
	}
	return out, nil
}

func (a *API) CreateVolume(ctx context.Context, req e2bapi.CreateVolumeRequestObject) (e2bapi.CreateVolumeResponseObject, error) {
	if req.Body == nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "missing body")
	}
	v, err := a.vol.Create(ctx, req.Body.Name)
	if err != nil {
		return nil, err
	}
	return e2bapi.CreateVolume201JSONResponse(volumeAndToken(v)), nil
}

func (a *API) GetVolume(ctx context.Context, req e2bapi.GetVolumeRequestObject) (e2bapi.GetVolumeResponseObject, error) {
	v, err := a.vol.Get(ctx, req.VolumeID)
	if err != nil {
		return nil, err
	}
	return e2bapi.GetVolume200JSONResponse(volumeAndToken(v)), nil
}

func (a *API) DeleteVolume(ctx context.Context, req e2bapi.DeleteVolumeRequestObject) (e2bapi.DeleteVolumeResponseObject, error) {
	if err := a.vol.Delete(ctx, req.VolumeID); err != nil {
		return nil, err
	}
	return e2bapi.DeleteVolume204Response{}, nil
}

func entryStat(e volume.Entry) e2bapi.VolumeEntryStat {
	out := e2bapi.VolumeEntryStat{
		Name: e.Name, Type: e2bapi.VolumeEntryStatType(e.Type), Path: e.Path, Size: e.Size, Mode: e.Mode,
		Uid: e.UID, Gid: e.GID, Atime: e.Atime, Mtime: e.Mtime, Ctime: e.Ctime,
	}
	if e.Target != "" {
		out.Target = ptr(e.Target)
	}
	return out
}

// withRoot runs fn on the root of the volume the request's token opened.
func (a *API) withRoot(ctx context.Context, id string, fn func(*os.Root) error) error {
	root, err := a.vol.Open(ctx, id)
	if err != nil {
		return err
	}
	defer root.Close()
	return fn(root)
}

// fileBody streams an open file of a volume and closes it and the root.
type fileBody struct {
	*os.File
	root *os.Root
}

func (f fileBody) Close() error {
	err := f.File.Close()
	f.root.Close()
	return err
}

func (a *API) GetVolumeFile(ctx context.Context, req e2bapi.GetVolumeFileRequestObject) (e2bapi.GetVolumeFileResponseObject, error) {
	root, err := a.vol.Open(ctx, req.VolumeID)
	if err != nil {
		return nil, err
	}
	f, e, err := volume.OpenFile(root, req.Params.Path)
	if err != nil {
		root.Close()
		return nil, err
	}
	// An empty file is sent with no Content-Length, as chunked: the
	// generated writer omits a zero length.
	return e2bapi.GetVolumeFile200ApplicationoctetStreamResponse{Body: fileBody{f, root}, ContentLength: e.Size}, nil
}

func owner(uid, gid, mode *int) volume.Owner { return volume.Owner{UID: uid, GID: gid, Mode: mode} }

func (a *API) PutVolumeFile(ctx context.Context, req e2bapi.PutVolumeFileRequestObject) (e2bapi.PutVolumeFileResponseObject, error) {
	var out volume.Entry
	body := req.Body
	if body == nil {
		body = eof{}
	}
	err := a.withRoot(ctx, req.VolumeID, func(root *os.Root) (err error) {
		p := req.Params
		out, err = volume.WriteFile(root, p.Path, body, owner(p.Uid, p.Gid, p.Mode), p.Force != nil && *p.Force)
		return err
	})
	if err != nil {
		return nil, err
	}
	return e2bapi.PutVolumeFile201JSONResponse(entryStat(out)), nil
}

type eof struct{}

func (eof) Read([]byte) (int, error) { return 0, io.EOF }

func (a *API) ListVolumeDir(ctx context.Context, req e2bapi.ListVolumeDirRequestObject) (e2bapi.ListVolumeDirResponseObject, error) {
	var es []volume.Entry
	err := a.withRoot(ctx, req.VolumeID, func(root *os.Root) (err error) {
		depth := 1
		if req.Params.Depth != nil {
			depth = *req.Params.Depth
		}
		es, err = volume.List(root, req.Params.Path, depth)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := e2bapi.ListVolumeDir200JSONResponse{}
	for _, e := range es {
		out = append(out, entryStat(e))
	}
	return out, nil
}

func (a *API) MakeVolumeDir(ctx context.Context, req e2bapi.MakeVolumeDirRequestObject) (e2bapi.MakeVolumeDirResponseObject, error) {
	var out volume.Entry
	err := a.withRoot(ctx, req.VolumeID, func(root *os.Root) (err error) {
		p := req.Params
		out, err = volume.MakeDir(root, p.Path, owner(p.Uid, p.Gid, p.Mode), p.Force != nil && *p.Force)
		return err
	})
	if err != nil {
		return nil, err
	}
	return e2bapi.MakeVolumeDir201JSONResponse(entryStat(out)), nil
}

func (a *API) StatVolumePath(ctx context.Context, req e2bapi.StatVolumePathRequestObject) (e2bapi.StatVolumePathResponseObject, error) {
	var out volume.Entry
	err := a.withRoot(ctx, req.VolumeID, func(root *os.Root) (err error) {
		out, err = volume.Stat(root, req.Params.Path)
		return err
	})
	if err != nil {
		return nil, err
	}
	return e2bapi.StatVolumePath200JSONResponse(entryStat(out)), nil
}

func (a *API) UpdateVolumePath(ctx context.Context, req e2bapi.UpdateVolumePathRequestObject) (e2bapi.UpdateVolumePathResponseObject, error) {
	if req.Body == nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "missing body")
	}
	var out volume.Entry
	err := a.withRoot(ctx, req.VolumeID, func(root *os.Root) (err error) {
		b := req.Body
		out, err = volume.Update(root, req.Params.Path, owner(b.Uid, b.Gid, b.Mode))
		return err
	})
	if err != nil {
		return nil, err
	}
	return e2bapi.UpdateVolumePath200JSONResponse(entryStat(out)), nil
}

func (a *API) DeleteVolumePath(ctx context.Context, req e2bapi.DeleteVolumePathRequestObject) (e2bapi.DeleteVolumePathResponseObject, error) {
	err := a.withRoot(ctx, req.VolumeID, func(root *os.Root) error {
		return volume.Remove(root, req.Params.Path)
	})
	if err != nil {
		return nil, err
	}
	return e2bapi.DeleteVolumePath204Response{}, nil
}

// mountRequests converts a create's volumeMounts; package volume checks and
// resolves them (create).
func mountRequests(ms *[]e2bapi.SandboxVolumeMount) []volume.MountRequest {
	if ms == nil {
		return nil
	}
	reqs := make([]volume.MountRequest, 0, len(*ms))
	for _, m := range *ms {
		reqs = append(reqs, volume.MountRequest{Name: m.Name, Path: m.Path})
	}
	return reqs
}
