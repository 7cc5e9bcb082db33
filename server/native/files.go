package native

import (
	"encoding/json"
	"io"
	"net/http"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/server/httpx"
)

// Files go through envd's /files (streamed both ways, never buffered here)
// and its Filesystem service (list, remove).

func requirePath(p string) error {
	if p == "" {
		return errdefs.New(errdefs.ErrInvalidArgument, "missing path")
	}
	return nil
}

// filesEnvd checks the path and connects to the sandbox's envd as user; on
// failure it answers the client itself and returns nil.
func (a *API) filesEnvd(w http.ResponseWriter, r *http.Request, id, path string, user *string) *envdConn {
	if err := requirePath(path); err != nil {
		WriteError(w, r, a.log, err)
		return nil
	}
	c, err := a.envd(r.Context(), id, httpx.Deref(user))
	if err != nil {
		WriteError(w, r, a.log, err)
		return nil
	}
	return c
}

// filesDo sends one request to envd's /files, with r's body when upload is
// set; on failure, a non-200 answer included, it answers the client itself
// and returns nil. The caller closes the response's body.
func (a *API) filesDo(w http.ResponseWriter, r *http.Request, c *envdConn, path string, upload bool) *http.Response {
	method, body, size := http.MethodGet, io.Reader(nil), int64(0)
	if upload {
		method, body, size = http.MethodPost, r.Body, r.ContentLength
	}
	resp, err := c.Files(r.Context(), method, path, body, size)
	if err != nil {
		WriteError(w, r, a.log, err)
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		WriteError(w, r, a.log, EnvdStatus(resp))
		resp.Body.Close()
		return nil
	}
	return resp
}

func (a *API) UploadFile(w http.ResponseWriter, r *http.Request, id string, p nativeapi.UploadFileParams) {
	c := a.filesEnvd(w, r, id, p.Path, p.User)
	if c == nil {
		return
	}
	defer c.close()
	resp := a.filesDo(w, r, c, p.Path, true)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	var entries []struct {
		Path, Name, Type string
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&entries); err != nil || len(entries) == 0 {
		WriteError(w, r, a.log, errdefs.New(errdefs.ErrUnavailable, "envd answered the upload without an entry"))
		return
	}
	e := entries[0]
	httpx.WriteJSON(w, http.StatusOK, nativeapi.FileEntry{Name: e.Name, Path: e.Path, Type: fileType(e.Type)})
}

func fileType(t string) nativeapi.FileEntryType {
	switch t {
	case "file", "dir", "symlink":
		return nativeapi.FileEntryType(t)
	case "directory":
		return "dir"
	}
	return "other"
}

func (a *API) DownloadFile(w http.ResponseWriter, r *http.Request, id string, p nativeapi.DownloadFileParams) {
	c := a.filesEnvd(w, r, id, p.Path, p.User)
	if c == nil {
		return
	}
	defer c.close()
	resp := a.filesDo(w, r, c, p.Path, false)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	for _, h := range []string{"Content-Length", "Last-Modified"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	// io.Copy moves 32 KiB at a time: memory stays flat whatever the size.
	if _, err := io.Copy(w, resp.Body); err != nil {
		a.log.Debug("download interrupted", "sandbox_id", id, "err", err)
	}
}

func (a *API) DeleteFile(w http.ResponseWriter, r *http.Request, id string, p nativeapi.DeleteFileParams) {
	c := a.filesEnvd(w, r, id, p.Path, p.User)
	if c == nil {
		return
	}
	defer c.close()
	req := connect.NewRequest(&filesystem.RemoveRequest{Path: p.Path})
	c.Auth(req.Header())
	if _, err := c.Filesystem().Remove(r.Context(), req); err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *API) ListFiles(w http.ResponseWriter, r *http.Request, id string, p nativeapi.ListFilesParams) {
	if err := requirePath(p.Path); err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	depth := httpx.Deref(p.Depth)
	switch {
	case depth < 0 || depth > 64:
		WriteError(w, r, a.log, errdefs.New(errdefs.ErrInvalidArgument, "depth must be between 1 and 64"))
		return
	case depth == 0:
		depth = 1
	}
	c := a.filesEnvd(w, r, id, p.Path, p.User)
	if c == nil {
		return
	}
	defer c.close()
	req := connect.NewRequest(&filesystem.ListDirRequest{Path: p.Path, Depth: uint32(depth)})
	c.Auth(req.Header())
	resp, err := c.Filesystem().ListDir(r.Context(), req)
	if err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	out := nativeapi.FileList{Entries: make([]nativeapi.FileEntry, 0, len(resp.Msg.GetEntries()))}
	for _, e := range resp.Msg.GetEntries() {
		fe := nativeapi.FileEntry{Name: e.GetName(), Path: e.GetPath(), Size: ptr(e.GetSize()),
			Type: nativeapi.FileEntryType(EntryType(e.GetType()))}
		if s := e.GetPermissions(); s != "" {
			fe.Mode = &s
		}
		if e.GetModifiedTime() != nil {
			fe.ModifiedAt = ptr(e.GetModifiedTime().AsTime())
		}
		out.Entries = append(out.Entries, fe)
	}
	httpx.WriteJSON(w, http.StatusOK, out)
}

// EntryType names an envd file type as the native API does: file, dir,
// symlink or other.
func EntryType(t filesystem.FileType) string {
	switch t {
	case filesystem.FileType_FILE_TYPE_FILE:
		return "file"
	case filesystem.FileType_FILE_TYPE_DIRECTORY:
		return "dir"
	case filesystem.FileType_FILE_TYPE_SYMLINK:
		return "symlink"
	}
	return "other"
}
