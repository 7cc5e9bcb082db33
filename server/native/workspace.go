package native

import (
	"encoding/base64"
	"errors"
	"io/fs"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/template"
)

// ChangeType is what a change left at its path, as the native API and the
// MCP tools name it: file, dir, symlink or other (a deletion: other).
func ChangeType(c runtime.Change) string {
	switch {
	case c.Kind == runtime.ChangeDeleted:
		return "other"
	case c.Mode.IsRegular():
		return "file"
	case c.Mode.IsDir():
		return "dir"
	case c.Mode&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}

// ChangePath is a change's path as the native API and the MCP tools
// report it: as text (each byte that is not UTF-8 replaced by U+FFFD) and,
// when that lost bytes, the raw bytes in base64 ("" otherwise).
func ChangePath(c runtime.Change) (text, base64Raw string) {
	if utf8.ValidString(c.Path) {
		return c.Path, ""
	}
	return strings.ToValidUTF8(c.Path, "\uFFFD"), base64.StdEncoding.EncodeToString([]byte(c.Path))
}

func (a *API) GetChanges(w http.ResponseWriter, r *http.Request, id string) {
	list, err := a.ws.Changes(r.Context(), id)
	if err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	out := nativeapi.ChangeList{Changes: make([]nativeapi.Change, 0, len(list.Changes))}
	if list.WritersTruncated {
		out.WritersTruncated = ptr(true)
	}
	for _, c := range list.Changes {
		text, raw := ChangePath(c)
		nc := nativeapi.Change{Path: text, Kind: nativeapi.ChangeKind(c.Kind), Type: nativeapi.ChangeType(ChangeType(c))}
		if raw != "" {
			nc.PathBase64 = ptr(raw)
		}
		if c.Kind != runtime.ChangeDeleted {
			nc.Mode = ptr(c.Mode.String())
		}
		if c.Mode.IsRegular() {
			nc.Size = ptr(c.Size)
		}
		if c.Opaque {
			nc.Opaque = ptr(true)
		}
		nc.Writer = nativeWriter(c.Writer)
		out.Changes = append(out.Changes, nc)
	}
	httpx.WriteJSON(w, http.StatusOK, out)
}

// nativeWriter is a change's writer as the native API reports it; nil
// for none.
func nativeWriter(w *runtime.Writer) *nativeapi.ChangeWriter {
	if w == nil {
		return nil
	}
	nw := &nativeapi.ChangeWriter{Pid: w.PID, Comm: w.Comm}
	if w.Command != "" {
		nw.Command = ptr(w.Command)
	}
	if w.EnvdPID != 0 {
		nw.EnvdPid = ptr(w.EnvdPID)
	}
	return nw
}

// streamed answers with the body write produces: errors before its first
// byte get the error shape; after it, the connection is cut (a truncated
// body is never taken for a whole one).
func (a *API) streamed(w http.ResponseWriter, r *http.Request, ctype string, write func(w *firstWrite) error) {
	fw := &firstWrite{w: w, ctype: ctype}
	if err := write(fw); err != nil {
		if !fw.started {
			WriteError(w, r, a.log, err)
			return
		}
		a.log.WarnContext(r.Context(), "streamed answer cut", "path", r.URL.Path, "err", err)
		panic(http.ErrAbortHandler)
	}
	if !fw.started {
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(http.StatusOK)
	}
}

// firstWrite sends the 200 and its content type with the first byte.
type firstWrite struct {
	w       http.ResponseWriter
	ctype   string
	started bool
}

func (f *firstWrite) Write(p []byte) (int, error) {
	if !f.started {
		f.started = true
		f.w.Header().Set("Content-Type", f.ctype)
		f.w.WriteHeader(http.StatusOK)
	}
	return f.w.Write(p)
}

func (a *API) GetDiff(w http.ResponseWriter, r *http.Request, id string) {
	a.streamed(w, r, "text/x-diff; charset=utf-8", func(fw *firstWrite) error { return a.ws.Diff(r.Context(), id, fw) })
}

func (a *API) ExportChanges(w http.ResponseWriter, r *http.Request, id string, p nativeapi.ExportChangesParams) {
	finalize := p.Finalize != nil && *p.Finalize
	a.streamed(w, r, "application/x-tar", func(fw *firstWrite) error { return a.ws.Export(r.Context(), id, fw, finalize) })
}

func (a *API) Publish(w http.ResponseWriter, r *http.Request, id string) {
	var body nativeapi.PublishPost
	if r.ContentLength != 0 {
		if err := httpx.DecodeJSON(r, &body); err != nil {
			WriteError(w, r, a.log, err)
			return
		}
	}
	v, err := a.ws.Publish(r.Context(), id, deref(body.Template), body.Finalize != nil && *body.Finalize)
	var ce *template.ConflictError
	if errors.As(err, &ce) {
		var eb nativeapi.Error
		eb.Error.Code = nativeErrorCode(http.StatusConflict)
		eb.Error.Message = ce.Error()
		eb.Error.Conflicts = &ce.Paths
		if id := middleware.GetReqID(r.Context()); id != "" {
			eb.RequestId = &id
		}
		httpx.WriteJSON(w, http.StatusConflict, eb)
		return
	}
	if err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	httpx.WriteJSON(w, http.StatusCreated, nativeVersion(v))
}

func nativeVersion(v template.Version) nativeapi.Version {
	nv := nativeapi.Version{
		TemplateId: v.TemplateID, Template: v.Template, BuildId: v.BuildID, Number: v.Number,
		Current: v.Current, CreatedAt: v.CreatedAt, Paths: ptr(v.Paths),
	}
	if v.Parent != "" {
		nv.Parent = ptr(v.Parent)
	}
	if v.Sandbox != "" {
		nv.Sandbox = ptr(v.Sandbox)
	}
	return nv
}

func (a *API) ListVersions(w http.ResponseWriter, r *http.Request, id string) {
	vs, from, err := a.ws.Versions(r.Context(), id)
	if err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	out := nativeapi.VersionList{Versions: make([]nativeapi.Version, 0, len(vs)), StartedFrom: ptr(from)}
	for _, v := range vs {
		out.Versions = append(out.Versions, nativeVersion(v))
	}
	httpx.WriteJSON(w, http.StatusOK, out)
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
