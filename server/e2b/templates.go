package e2b

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	openapi_types "github.com/oapi-codegen/runtime/types"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/e2bapi"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/template"
	"github.com/sandboxd/sandboxd/tenant"
)

type apiBaseKey struct{}

// WithAPIBase records the API's URL as the client reached it (scheme,
// host, mount prefix), for links the API hands out (template uploads).
func WithAPIBase(prefix string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			scheme := "http"
			if r.TLS != nil {
				scheme = "https"
			}
			base := scheme + "://" + r.Host
			if strings.HasPrefix(r.URL.Path, prefix+"/") {
				base += prefix
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), apiBaseKey{}, base)))
		})
	}
}

// UploadHandler serves the PUTs of template files to the signed links
// GetTemplateFilesUploadLink hands out; the signature is the credential
// (the SDKs send no API key there).
func (a *API) UploadHandler(templateID, hash func(*http.Request) string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.tpl == nil {
			httpx.WriteError(w, r, a.log, errdefs.New(errdefs.ErrNotImplemented, "templates are not enabled"))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, template.MaxUpload+1)
		if err := a.tpl.Receive(r.Context(), templateID(r), hash(r), r.URL.Query(), r.Body); err != nil {
			httpx.WriteError(w, r, a.log, err)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
}

func tenantOf(ctx context.Context) tenant.ID {
	t, _ := tenant.FromContext(ctx)
	return t
}

func (a *API) templatesOn() error {
	if a.tpl == nil {
		return errdefs.New(errdefs.ErrNotImplemented, "templates are not enabled on this sandboxd")
	}
	return nil
}

func (a *API) CreateTemplateV3(ctx context.Context, req e2bapi.CreateTemplateV3RequestObject) (e2bapi.CreateTemplateV3ResponseObject, error) {
	if err := a.templatesOn(); err != nil {
		return nil, err
	}
	b := req.Body
	name := cmp.Or(deref(b.Name), deref(b.Alias))
	if name == "" {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "name is required")
	}
	r, err := a.tpl.Request(ctx, tenantOf(ctx), name, deref(b.Tags), int(deref(b.CpuCount)), int(deref(b.MemoryMB)))
	if err != nil {
		return nil, err
	}
	return e2bapi.CreateTemplateV3202JSONResponse{
		TemplateID: r.Template.ID, BuildID: r.BuildID, Public: r.Template.Public,
		Names: []string{r.Template.Name}, Aliases: []string{r.Template.Name}, Tags: r.Tags,
	}, nil
}

func (a *API) CreateTemplateV2(ctx context.Context, req e2bapi.CreateTemplateV2RequestObject) (e2bapi.CreateTemplateV2ResponseObject, error) {
	if err := a.templatesOn(); err != nil {
		return nil, err
	}
	b := req.Body
	r, err := a.tpl.Request(ctx, tenantOf(ctx), b.Alias, nil, int(deref(b.CpuCount)), int(deref(b.MemoryMB)))
	if err != nil {
		return nil, err
	}
	res := a.resources(r.Template)
	return e2bapi.CreateTemplateV2202JSONResponse{
		TemplateID: r.Template.ID, BuildID: r.BuildID, Public: r.Template.Public, Aliases: []string{r.Template.Name},
		CpuCount: int32(res.CPUCount), MemoryMB: int32(res.MemoryMB), DiskSizeMB: int32(res.DiskSizeMB),
		CreatedAt: r.Template.CreatedAt, UpdatedAt: r.Template.UpdatedAt, BuildCount: 1, EnvdVersion: a.envdVersion,
	}, nil
}

func (a *API) GetTemplateFilesUploadLink(ctx context.Context, req e2bapi.GetTemplateFilesUploadLinkRequestObject) (e2bapi.GetTemplateFilesUploadLinkResponseObject, error) {
	if err := a.templatesOn(); err != nil {
		return nil, err
	}
	base, _ := ctx.Value(apiBaseKey{}).(string)
	link, err := a.tpl.Upload(ctx, tenantOf(ctx), req.TemplateID, req.Hash, base)
	if err != nil {
		return nil, err
	}
	return e2bapi.GetTemplateFilesUploadLink201JSONResponse{Present: link.Present, Url: &link.URL}, nil
}

func (a *API) StartTemplateBuildV2(ctx context.Context, req e2bapi.StartTemplateBuildV2RequestObject) (e2bapi.StartTemplateBuildV2ResponseObject, error) {
	if err := a.templatesOn(); err != nil {
		return nil, err
	}
	b := req.Body
	spec := template.BuildSpec{
		FromImage: deref(b.FromImage), FromTemplate: deref(b.FromTemplate), Force: deref(b.Force),
		StartCmd: deref(b.StartCmd), ReadyCmd: deref(b.ReadyCmd),
	}
	if b.FromImageRegistry != nil {
		kind, err := b.FromImageRegistry.Discriminator()
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "fromImageRegistry: "+err.Error())
		}
		spec.Registry = &template.RegistryAuth{Kind: kind}
		if kind == "registry" {
			g, err := b.FromImageRegistry.AsGeneralRegistry()
			if err != nil {
				return nil, errdefs.New(errdefs.ErrInvalidArgument, "fromImageRegistry: "+err.Error())
			}
			spec.Registry.Username, spec.Registry.Password = g.Username, g.Password
		}
	}
	for _, st := range deref(b.Steps) {
		spec.Steps = append(spec.Steps, template.Step{Type: st.Type, Args: deref(st.Args), FilesHash: deref(st.FilesHash), Force: deref(st.Force)})
	}
	if err := a.tpl.StartBuild(ctx, tenantOf(ctx), req.TemplateID, req.BuildID, spec); err != nil {
		return nil, err
	}
	return e2bapi.StartTemplateBuildV2202Response{}, nil
}

// levelRank orders log levels for the minimum-level filters.
func levelRank(l string) int {
	switch l {
	case "debug":
		return 0
	case "info":
		return 1
	case "warn":
		return 2
	case "error":
		return 3
	}
	return 1
}

func buildLogEntry(e template.LogEntry) e2bapi.BuildLogEntry {
	out := e2bapi.BuildLogEntry{Timestamp: e.Timestamp, Level: e2bapi.LogLevel(e.Level), Message: e.Message}
	if e.Step != "" {
		out.Step = ptr(e.Step)
	}
	return out
}

// buildLog is a build with its log entries of level and above (all when
// level is nil).
func (a *API) buildLog(ctx context.Context, templateID, buildID string, level *e2bapi.LogLevel) (store.Build, []template.LogEntry, error) {
	if err := a.templatesOn(); err != nil {
		return store.Build{}, nil, err
	}
	b, ents, err := a.tpl.BuildInfo(ctx, tenantOf(ctx), templateID, buildID)
	if err != nil || level == nil {
		return b, ents, err
	}
	floor := levelRank(string(*level))
	kept := ents[:0]
	for _, e := range ents {
		if levelRank(e.Level) >= floor {
			kept = append(kept, e)
		}
	}
	return b, kept, nil
}

func (a *API) GetTemplateBuildStatus(ctx context.Context, req e2bapi.GetTemplateBuildStatusRequestObject) (e2bapi.GetTemplateBuildStatusResponseObject, error) {
	p := req.Params
	b, filtered, err := a.buildLog(ctx, req.TemplateID, req.BuildID, p.Level)
	if err != nil {
		return nil, err
	}
	off := int(max(deref(p.LogsOffset), 0))
	limit := 100
	if p.Limit != nil {
		limit = int(*p.Limit)
	}
	page := filtered[min(off, len(filtered)):min(off+limit, len(filtered))]
	out := e2bapi.GetTemplateBuildStatus200JSONResponse{
		TemplateID: b.TemplateID, BuildID: b.ID, Status: e2bapi.TemplateBuildStatus(b.Status),
		Logs: []string{}, LogEntries: []e2bapi.BuildLogEntry{},
	}
	for _, e := range page {
		out.LogEntries = append(out.LogEntries, buildLogEntry(e))
		out.Logs = append(out.Logs, fmt.Sprintf("[%s] %s", e.Timestamp.Format(time.RFC3339), e.Message))
	}
	if b.Status == store.BuildError {
		r := e2bapi.BuildStatusReason{Message: b.Reason, LogEntries: &[]e2bapi.BuildLogEntry{}}
		if b.ReasonStep != "" {
			r.Step = ptr(b.ReasonStep)
		}
		for _, e := range filtered { // error entries pass every level filter
			if e.Level == "error" {
				*r.LogEntries = append(*r.LogEntries, buildLogEntry(e))
			}
		}
		out.Reason = &r
	}
	return out, nil
}

func (a *API) GetTemplateBuildLogs(ctx context.Context, req e2bapi.GetTemplateBuildLogsRequestObject) (e2bapi.GetTemplateBuildLogsResponseObject, error) {
	p := req.Params
	_, ents, err := a.buildLog(ctx, req.TemplateID, req.BuildID, p.Level)
	if err != nil {
		return nil, err
	}
	backward := p.Direction != nil && *p.Direction == e2bapi.LogsDirectionBackward
	if backward {
		slices.Reverse(ents)
	}
	limit := 100
	if p.Limit != nil {
		limit = int(*p.Limit)
	}
	out := e2bapi.GetTemplateBuildLogs200JSONResponse{Logs: []e2bapi.BuildLogEntry{}}
	for _, e := range ents {
		if len(out.Logs) >= limit {
			break
		}
		ms := e.Timestamp.UnixMilli()
		if p.Cursor != nil && ((!backward && ms < *p.Cursor) || (backward && ms > *p.Cursor)) {
			continue
		}
		out.Logs = append(out.Logs, buildLogEntry(e))
	}
	return out, nil
}

// resources are a template's, defaults filled in.
func (a *API) resources(t store.Template) struct{ CPUCount, MemoryMB, DiskSizeMB int } {
	def := a.mgr.TemplateResources("")
	return struct{ CPUCount, MemoryMB, DiskSizeMB int }{
		cmp.Or(t.CPUCount, def.CPUCount), cmp.Or(t.MemoryMB, def.MemoryMB), def.DiskSizeMB,
	}
}

// builtin are the backend's own templates, visible to every tenant.
func (a *API) builtin(ctx context.Context) ([]string, error) {
	if a.templates == nil {
		return nil, nil
	}
	return a.templates.Templates(ctx)
}

func (a *API) isBuiltin(ctx context.Context, name string) (bool, error) {
	names, err := a.builtin(ctx)
	return slices.Contains(names, name), err
}

func (a *API) ListTemplates(ctx context.Context, _ e2bapi.ListTemplatesRequestObject) (e2bapi.ListTemplatesResponseObject, error) {
	all, err := a.templateList(ctx)
	if err != nil {
		return nil, err
	}
	return e2bapi.ListTemplates200JSONResponse(all), nil
}

// ListTemplatesV2 is ListTemplates a page at a time: the cursor is the
// offset into the (stable: built-ins, then by creation) list.
func (a *API) ListTemplatesV2(ctx context.Context, req e2bapi.ListTemplatesV2RequestObject) (e2bapi.ListTemplatesV2ResponseObject, error) {
	all, err := a.templateList(ctx)
	if err != nil {
		return nil, err
	}
	off := 0
	if tok := deref(req.Params.NextToken); tok != "" {
		if off, err = strconv.Atoi(tok); err != nil || off < 0 {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("nextToken %q is not a cursor of this list", tok))
		}
	}
	limit := int(deref(req.Params.Limit))
	if limit <= 0 {
		limit = 100
	}
	page := all[min(off, len(all)):min(off+limit, len(all))]
	out := e2bapi.ListTemplatesV2200JSONResponse{Body: page}
	if off+limit < len(all) {
		out.Headers.XNextToken = ptr(strconv.Itoa(off + limit))
	}
	return out, nil
}

// templateList is every template the caller may use: the backend's own,
// then the tenant's and the public built ones, oldest first.
func (a *API) templateList(ctx context.Context) ([]e2bapi.Template, error) {
	names, err := a.builtin(ctx)
	if err != nil {
		return nil, err
	}
	out := []e2bapi.Template{}
	for _, n := range names {
		if a.tpl != nil && a.tpl.IsBuild(n) {
			continue
		}
		r := a.mgr.TemplateResources(n)
		out = append(out, e2bapi.Template{
			TemplateID: n, BuildID: n, Aliases: []string{n}, Names: []string{n}, Public: true,
			BuildStatus: "ready", EnvdVersion: a.envdVersion, CreatedAt: a.started, UpdatedAt: a.started,
			CpuCount: int32(r.CPUCount), MemoryMB: int32(r.MemoryMB), DiskSizeMB: int32(r.DiskSizeMB),
		})
	}
	if a.tpl == nil {
		return out, nil
	}
	tpls, err := a.tpl.List(ctx, tenantOf(ctx))
	if err != nil {
		return nil, err
	}
	for _, t := range tpls {
		builds, err := a.tpl.Builds(ctx, t)
		if err != nil {
			return nil, err
		}
		r := a.resources(t)
		item := e2bapi.Template{
			TemplateID: t.ID, Aliases: []string{t.Name}, Names: []string{t.Name}, Public: t.Public,
			BuildCount: int32(len(builds)), EnvdVersion: a.envdVersion, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
			CpuCount: int32(r.CPUCount), MemoryMB: int32(r.MemoryMB), DiskSizeMB: int32(r.DiskSizeMB),
			BuildStatus: e2bapi.TemplateBuildStatusWaiting,
		}
		if len(builds) > 0 {
			item.BuildStatus = e2bapi.TemplateBuildStatus(builds[0].Status)
			item.BuildID = builds[0].ID
		}
		for _, b := range builds {
			if b.Status == store.BuildReady {
				item.BuildID = b.ID
				break
			}
		}
		out = append(out, item)
	}
	return out, nil
}

func (a *API) GetTemplate(ctx context.Context, req e2bapi.GetTemplateRequestObject) (e2bapi.GetTemplateResponseObject, error) {
	if ok, err := a.isBuiltin(ctx, req.TemplateID); err != nil {
		return nil, err
	} else if ok {
		return e2bapi.GetTemplate200JSONResponse{Body: e2bapi.TemplateWithBuilds{
			TemplateID: req.TemplateID, Aliases: []string{req.TemplateID}, Names: []string{req.TemplateID},
			Public: true, Builds: []e2bapi.TemplateBuild{},
		}}, nil
	}
	if err := a.templatesOn(); err != nil {
		return nil, templateNotFound(req.TemplateID)
	}
	t, err := a.tpl.Find(ctx, tenantOf(ctx), req.TemplateID)
	if err != nil {
		return nil, err
	}
	builds, err := a.tpl.Builds(ctx, t)
	if err != nil {
		return nil, err
	}
	r := a.resources(t)
	body := e2bapi.TemplateWithBuilds{TemplateID: t.ID, Aliases: []string{t.Name}, Names: []string{t.Name},
		Public: t.Public, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, Builds: []e2bapi.TemplateBuild{}}
	for _, b := range builds {
		tb := e2bapi.TemplateBuild{BuildID: uuidOf(b.ID), Status: e2bapi.TemplateBuildStatus(b.Status),
			CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt, CpuCount: int32(r.CPUCount), MemoryMB: int32(r.MemoryMB),
			DiskSizeMB: ptr(int32(r.DiskSizeMB)), EnvdVersion: ptr(a.envdVersion)}
		if b.Status.Finished() {
			tb.FinishedAt = ptr(b.UpdatedAt)
		}
		body.Builds = append(body.Builds, tb)
	}
	return e2bapi.GetTemplate200JSONResponse{Body: body}, nil
}

func uuidOf(s string) openapi_types.UUID {
	var u openapi_types.UUID
	_ = u.UnmarshalText([]byte(s))
	return u
}

func templateNotFound(name string) error {
	return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("template %q not found", name))
}

func (a *API) GetTemplateByAlias(ctx context.Context, req e2bapi.GetTemplateByAliasRequestObject) (e2bapi.GetTemplateByAliasResponseObject, error) {
	if ok, err := a.isBuiltin(ctx, req.Alias); err != nil {
		return nil, err
	} else if ok {
		return e2bapi.GetTemplateByAlias200JSONResponse{TemplateID: req.Alias, Public: true}, nil
	}
	if a.tpl == nil {
		return nil, templateNotFound(req.Alias)
	}
	t, err := a.tpl.Find(ctx, tenantOf(ctx), req.Alias)
	if err != nil {
		return nil, err
	}
	return e2bapi.GetTemplateByAlias200JSONResponse{TemplateID: t.ID, Public: t.Public}, nil
}

func (a *API) DeleteTemplate(ctx context.Context, req e2bapi.DeleteTemplateRequestObject) (e2bapi.DeleteTemplateResponseObject, error) {
	if ok, err := a.isBuiltin(ctx, req.TemplateID); err != nil {
		return nil, err
	} else if ok {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("template %q is built into sandboxd", req.TemplateID))
	}
	if a.tpl == nil {
		return nil, templateNotFound(req.TemplateID)
	}
	if err := a.tpl.Delete(ctx, tenantOf(ctx), req.TemplateID); err != nil {
		return nil, err
	}
	return e2bapi.DeleteTemplate204Response{}, nil
}

func (a *API) UpdateTemplateV2(ctx context.Context, req e2bapi.UpdateTemplateV2RequestObject) (e2bapi.UpdateTemplateV2ResponseObject, error) {
	if ok, err := a.isBuiltin(ctx, req.TemplateID); err != nil {
		return nil, err
	} else if ok {
		return nil, errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("template %q is built into sandboxd", req.TemplateID))
	}
	if err := a.templatesOn(); err != nil {
		return nil, err
	}
	t, err := a.tpl.Find(ctx, tenantOf(ctx), req.TemplateID)
	if err != nil {
		return nil, err
	}
	if req.Body.Public != nil {
		if err := a.tpl.SetPublic(ctx, tenantOf(ctx), req.TemplateID, *req.Body.Public); err != nil {
			return nil, err
		}
	}
	return e2bapi.UpdateTemplateV2200JSONResponse{Names: []string{t.Name}}, nil
}

func (a *API) AssignTemplateTags(ctx context.Context, req e2bapi.AssignTemplateTagsRequestObject) (e2bapi.AssignTemplateTagsResponseObject, error) {
	if err := a.templatesOn(); err != nil {
		return nil, err
	}
	if len(req.Body.Tags) == 0 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "tags must not be empty")
	}
	build, err := a.tpl.AssignTags(ctx, tenantOf(ctx), req.Body.Target, req.Body.Tags)
	if err != nil {
		return nil, err
	}
	return e2bapi.AssignTemplateTags201JSONResponse{Tags: req.Body.Tags, BuildID: uuidOf(build)}, nil
}

func (a *API) DeleteTemplateTags(ctx context.Context, req e2bapi.DeleteTemplateTagsRequestObject) (e2bapi.DeleteTemplateTagsResponseObject, error) {
	if err := a.templatesOn(); err != nil {
		return nil, err
	}
	if len(req.Body.Tags) == 0 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "tags must not be empty")
	}
	if err := a.tpl.DeleteTags(ctx, tenantOf(ctx), req.Body.Name, req.Body.Tags); err != nil {
		return nil, err
	}
	return e2bapi.DeleteTemplateTags204Response{}, nil
}

func (a *API) ListTemplateTags(ctx context.Context, req e2bapi.ListTemplateTagsRequestObject) (e2bapi.ListTemplateTagsResponseObject, error) {
	if err := a.templatesOn(); err != nil {
		return nil, err
	}
	t, err := a.tpl.Find(ctx, tenantOf(ctx), req.TemplateID)
	if err != nil {
		return nil, err
	}
	tags, err := a.tpl.Tags(ctx, t)
	if err != nil {
		return nil, err
	}
	out := e2bapi.ListTemplateTags200JSONResponse{}
	for _, tg := range tags {
		out = append(out, e2bapi.TemplateTag{Tag: tg.Tag, BuildID: uuidOf(tg.BuildID), CreatedAt: tg.CreatedAt})
	}
	return out, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
