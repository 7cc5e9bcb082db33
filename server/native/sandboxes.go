package native

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server/httpx"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// nativeState is a sandbox's state in the native API, whose enum has no
// "resuming": such a sandbox is not reachable yet (see e2b.apiState).
func nativeState(s sandbox.State) nativeapi.SandboxState {
	if s == sandbox.StateResuming {
		return nativeapi.SandboxStatePaused
	}
	return nativeapi.SandboxState(s)
}

// nativeSandbox renders a sandbox. The envd access token opens the data
// plane (exec and files through the E2B proxy), so only a caller with the
// write scope sees it: a read-only token must not be a way to run commands.
func nativeSandbox(ctx context.Context, sb sandbox.View) nativeapi.Sandbox {
	out := nativeapi.Sandbox{
		Id:        sb.ID,
		Template:  sb.Template,
		State:     nativeState(sb.State),
		StartedAt: sb.StartedAt,
		EndAt:     sb.EndAt,
		CpuCount:  sb.CPUCount,
		MemoryMb:  sb.MemoryMB,
		DiskMb:    sb.DiskMB,
	}
	if len(sb.Metadata) > 0 {
		out.Metadata = ptr(sb.Metadata)
	}
	if sb.IdleTTL > 0 {
		out.IdleTtl = ptr(int(sb.IdleTTL / time.Second))
	}
	if !sb.LastActiveAt.IsZero() {
		out.LastActiveAt = ptr(sb.LastActiveAt)
	}
	if sb.EnvdAccessToken != "" && HasScope(ctx, jwtauth.ScopeWrite) {
		out.EnvdAccessToken = ptr(sb.EnvdAccessToken)
	}
	out.AllowInternet = ptr(sb.AllowInternetAccess)
	if n := sb.Network; n != nil && (len(n.AllowOut) > 0 || len(n.DenyOut) > 0) {
		out.Network = &nativeapi.NetworkPolicy{AllowOut: ptr(nonNil(n.AllowOut)), DenyOut: ptr(nonNil(n.DenyOut))}
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// networkConfig is the native policy in sandbox's terms; nil for none.
func networkConfig(p *nativeapi.NetworkPolicy) *sandbox.NetworkConfig {
	if p == nil {
		return nil
	}
	return &sandbox.NetworkConfig{AllowOut: httpx.Deref(p.AllowOut), DenyOut: httpx.Deref(p.DenyOut)}
}

func (a *API) PutSandboxNetwork(w http.ResponseWriter, r *http.Request, id string) {
	var b nativeapi.NetworkPolicy
	if err := httpx.DecodeJSON(r, &b); err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	if err := a.mgr.UpdateNetwork(r.Context(), id, sandbox.NetworkUpdate{AllowOut: httpx.Deref(b.AllowOut), DenyOut: httpx.Deref(b.DenyOut)}); err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	a.GetSandbox(w, r, id)
}

func (a *API) CreateSandbox(w http.ResponseWriter, r *http.Request) {
	var b nativeapi.SandboxPost
	if err := httpx.DecodeJSON(r, &b); err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	for name, v := range map[string]*int{"timeout": b.Timeout, "idle_ttl": b.IdleTtl, "cpu_count": b.CpuCount, "memory_mb": b.MemoryMb, "disk_mb": b.DiskMb} {
		if httpx.Deref(v) < 0 {
			WriteError(w, r, a.log, errdefs.New(errdefs.ErrInvalidArgument, name+" must not be negative"))
			return
		}
	}
	for _, m := range []struct {
		name string
		m    map[string]string
		lim  httpx.MapLimits
	}{{"metadata", httpx.Deref(b.Metadata), httpx.MetadataLimits}, {"env", httpx.Deref(b.Env), httpx.EnvLimits}} {
		if err := httpx.CheckMap(m.name, m.m, m.lim); err != nil {
			WriteError(w, r, a.log, err)
			return
		}
	}
	idleTTL := a.idleTTL // 0 or absent: the server's default
	if n := httpx.Deref(b.IdleTtl); n > 0 {
		idleTTL = time.Duration(n) * time.Second
	}
	sb, err := a.mgr.CreateView(r.Context(), sandbox.CreateRequest{
		IdleTTL:       idleTTL,
		Template:      httpx.Deref(b.Template),
		Timeout:       time.Duration(httpx.Deref(b.Timeout)) * time.Second,
		Secure:        true,
		AllowInternet: b.AllowInternet == nil || *b.AllowInternet,
		Metadata:      httpx.Deref(b.Metadata),
		EnvVars:       httpx.Deref(b.Env),
		CPUCount:      httpx.Deref(b.CpuCount),
		MemoryMB:      httpx.Deref(b.MemoryMb),
		DiskMB:        httpx.Deref(b.DiskMb),
		Network:       networkConfig(b.Network),
	})
	if err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	httpx.WriteJSON(w, http.StatusCreated, nativeSandbox(r.Context(), sb))
}

func (a *API) ListSandboxes(w http.ResponseWriter, r *http.Request, p nativeapi.ListSandboxesParams) {
	f := sandbox.ListFilter{Template: httpx.Deref(p.Template), Cursor: httpx.Deref(p.Cursor), Limit: httpx.Deref(p.Limit)}
	if f.Limit < 0 || f.Limit > 1000 {
		WriteError(w, r, a.log, errdefs.New(errdefs.ErrInvalidArgument, "limit must be between 1 and 1000"))
		return
	}
	for _, s := range httpx.Deref(p.State) {
		st := sandbox.State(s)
		if !st.Live() {
			WriteError(w, r, a.log, errdefs.New(errdefs.ErrInvalidArgument, "unknown state "+string(s)))
			return
		}
		f.States = append(f.States, st)
	}
	for _, kv := range httpx.Deref(p.Metadata) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			WriteError(w, r, a.log, errdefs.New(errdefs.ErrInvalidArgument, "metadata filter "+kv+" is not key=value"))
			return
		}
		if f.Metadata == nil {
			f.Metadata = map[string]string{}
		}
		f.Metadata[k] = v
	}
	sbs, next, err := a.mgr.ListViews(r.Context(), f)
	if err != nil {
		if errors.Is(err, sandbox.ErrInvalidFilter) {
			err = errdefs.New(errdefs.ErrInvalidArgument, "invalid cursor")
		}
		WriteError(w, r, a.log, err)
		return
	}
	out := nativeapi.SandboxList{Sandboxes: make([]nativeapi.Sandbox, 0, len(sbs))}
	for i := range sbs {
		out.Sandboxes = append(out.Sandboxes, nativeSandbox(r.Context(), sbs[i]))
	}
	if next != "" {
		out.NextCursor = &next
	}
	httpx.WriteJSON(w, http.StatusOK, out)
}

func (a *API) GetSandbox(w http.ResponseWriter, r *http.Request, id string) {
	sb, err := a.mgr.GetView(r.Context(), id)
	if err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, nativeSandbox(r.Context(), sb))
}

func (a *API) DeleteSandbox(w http.ResponseWriter, r *http.Request, id string) {
	if err := a.mgr.Kill(r.Context(), id); err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
