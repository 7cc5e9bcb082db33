package template

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Sandboxes is the lifecycle manager as a snapshot needs it
// (*sandbox.Manager): the tenant's sandbox, and its files taken as a layer
// while it is frozen and locked.
type Sandboxes interface {
	Get(ctx context.Context, id string) (*store.Sandbox, error)
	Stats(ctx context.Context, id string) (*store.Sandbox, runtime.Stats, error)
	Checkpoint(ctx context.Context, id, key string) (*store.Sandbox, error)
}

// SnapshotInfo is one snapshot as E2B names it: ID is what a create runs
// ("name:tag", or "templateID:tag" for a snapshot without a name), Names
// its names (none or one).
type SnapshotInfo struct {
	ID    string
	Names []string
}

// commitLayer is the layer key of build id made of a sandbox's files (a
// snapshot or a publish): derived from it, so that one cut short by a crash
// can be cleaned up from its row.
func commitLayer(buildID string) string { return "snap-" + buildID }

// Snapshot makes what running sandbox id of tenant t has changed in its
// filesystem a template: a build whose layers are the sandbox's
// template's plus one layer of those changes, with the same config (env,
// user, workdir, start and ready commands: processes are not kept, a
// sandbox created from it starts afresh) and the sandbox's create
// environment on top. name ("name[:tag]") names it, reusing the tenant's
// template of that name as E2B does; without one the snapshot is known
// by its template id. Nothing of a failed snapshot is left.
func (s *Service) Snapshot(ctx context.Context, sbx Sandboxes, t tenant.ID, id, name string) (SnapshotInfo, error) {
	if s.cfg.Layered == nil {
		return SnapshotInfo{}, errdefs.New(errdefs.ErrNotImplemented, "this backend cannot snapshot sandboxes")
	}
	alias, tag := "", DefaultTag
	if name != "" {
		alias, tag = splitRef(name)
		if err := s.checkName(alias, []string{tag}); err != nil {
			return SnapshotInfo{}, err
		}
	}
	unlock := s.lockSnapshots(t)
	defer unlock()
	src, err := sbx.Get(ctx, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if err := sandbox.RunningFor(src, "snapshotted"); err != nil {
		return SnapshotInfo{}, err
	}
	_, st, err := sbx.Stats(ctx, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if err := s.checkSnapshotQuota(ctx, t, int64(st.DiskBytes)); err != nil {
		return SnapshotInfo{}, err
	}
	res, err := s.resultOf(ctx, src.Template)
	if err != nil {
		return SnapshotInfo{}, err
	}
	res.Bytes = int64(st.DiskBytes)
	buildID := uuid.NewString()
	key := commitLayer(buildID)
	res.Layers = append(slices.Clone(res.Layers), key)
	res.Env = maps.Clone(res.Env)
	if res.Env == nil {
		res.Env = map[string]string{}
	}
	maps.Copy(res.Env, src.EnvVars)

	newID := sandbox.NewID()
	raw, _ := json.Marshal(res)
	tpl, err := s.cfg.Store.StartCommit(ctx, store.Template{
		ID: newID, Tenant: t, Name: cmp.Or(alias, newID), CPUCount: src.CPUCount, MemoryMB: src.MemoryMB, SnapshotOf: id,
	}, buildID, raw, s.cfg.Now())
	if err != nil {
		return SnapshotInfo{}, err
	}
	r := revert.New()
	defer r.Fail()
	cleanupCtx := context.WithoutCancel(ctx)
	r.Add(func() { s.dropCommit(cleanupCtx, tpl, buildID, tpl.ID == newID) })

	if _, err := sbx.Checkpoint(ctx, id, key); err != nil {
		return SnapshotInfo{}, err
	}
	if err := s.define(ctx, tpl, buildID, res); err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot of sandbox %s: %w", id, err)
	}
	if err := s.cfg.Store.FinishCommit(ctx, store.Build{ID: buildID, TemplateID: tpl.ID, Result: raw}, tag, "", s.cfg.Now()); err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot of sandbox %s: %w", id, err)
	}
	r.Success()
	s.changed()
	info := snapshotInfo(tpl, tag)
	s.log.Info("snapshot created", "audit", true, "tenant", t, "sandbox_id", id, "template_id", tpl.ID,
		"build_id", buildID, "snapshot_id", info.ID)
	return info, nil
}

// lockSnapshots serialises tenant t's snapshots (its quota's check and use).
func (s *Service) lockSnapshots(t tenant.ID) func() { return lockOf(&s.mu, s.snapshotting, t) }

// checkSnapshotQuota refuses (ErrResourceExhausted, 429) a snapshot of
// size bytes that would take tenant t over MaxSnapshots or MaxSnapshotMB.
// Every ready snapshot build counts: deleting a snapshot frees its share.
func (s *Service) checkSnapshotQuota(ctx context.Context, t tenant.ID, size int64) error {
	if s.cfg.MaxSnapshots <= 0 && s.cfg.MaxSnapshotMB <= 0 {
		return nil
	}
	tpls, err := s.cfg.Store.ListSnapshotTemplates(ctx, t, "")
	if err != nil {
		return err
	}
	n, used := 0, int64(0)
	for _, tpl := range tpls {
		builds, err := s.cfg.Store.ListBuilds(ctx, tpl.ID, store.BuildReady)
		if err != nil {
			return err
		}
		for _, b := range builds {
			var res Result
			if json.Unmarshal(b.Result, &res) == nil {
				n, used = n+1, used+res.Bytes
			}
		}
	}
	const mib = 1 << 20
	switch {
	case s.cfg.MaxSnapshots > 0 && n >= s.cfg.MaxSnapshots:
		return errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf(
			"snapshot quota reached: %d of %d snapshots; delete some first", n, s.cfg.MaxSnapshots))
	case s.cfg.MaxSnapshotMB > 0 && (used+size+mib-1)/mib > int64(s.cfg.MaxSnapshotMB):
		return errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf(
			"snapshot quota reached: %d MiB of snapshots + %d MiB asked exceeds the quota of %d MiB; delete some first",
			used/mib, (size+mib-1)/mib, s.cfg.MaxSnapshotMB))
	}
	return nil
}

// resultOf returns what backend template name is made of, as a base for a
// snapshot of its sandbox: a build's result, or one of the backend's own.
func (s *Service) resultOf(ctx context.Context, name string) (Result, error) {
	if s.cfg.Builtin(name) {
		return Result{Base: name, User: defaultUser, Workdir: defaultWorkdir}, nil
	}
	c, ok := s.Config(name)
	if !ok {
		return Result{}, errdefs.New(errdefs.ErrConflict, "the template of this sandbox was deleted: it cannot be snapshotted")
	}
	b, err := s.cfg.Store.GetBuild(ctx, c.TemplateID, name)
	if err != nil {
		return Result{}, err
	}
	var res Result
	if err := json.Unmarshal(b.Result, &res); err != nil {
		return Result{}, fmt.Errorf("build %s: result: %w", name, err)
	}
	return res, nil
}

// dropCommit undoes a snapshot or publish that did not finish: its build forgotten
// and failed, its layer removed, and its template deleted when the
// snapshot made it (created) and it has no other ready build.
func (s *Service) dropCommit(ctx context.Context, tpl store.Template, buildID string, created bool) {
	s.mu.Lock()
	delete(s.ready, buildID)
	s.mu.Unlock()
	if err := s.cfg.Layered.UndefineTemplate(ctx, buildID); err != nil {
		s.log.Warn("snapshot undo: undefine", "build_id", buildID, "err", err)
	}
	if err := s.cfg.Layered.RemoveLayer(ctx, commitLayer(buildID)); err != nil {
		s.log.Warn("snapshot undo: remove layer; queued for the next collection", "build_id", buildID, "err", err)
		if err := s.cfg.Store.QueueLayerRemovals(ctx, []string{commitLayer(buildID)}, s.cfg.Now()); err != nil {
			s.log.Warn("snapshot undo: queue the layer's removal", "build_id", buildID, "err", err)
		}
	}
	b := store.Build{ID: buildID, TemplateID: tpl.ID, Status: store.BuildError, Reason: "the snapshot failed"}
	if err := s.cfg.Store.UpdateBuild(ctx, b, s.cfg.Now()); err != nil && !errors.Is(err, store.ErrConflict) {
		s.log.Warn("snapshot undo: build", "build_id", buildID, "err", err)
	}
	if !created {
		return
	}
	ready, err := s.cfg.Store.ListBuilds(ctx, tpl.ID, store.BuildReady)
	if err == nil && len(ready) == 0 {
		_, err = s.cfg.Store.DeleteTemplate(ctx, tpl.Tenant, tpl.ID, layersOf, s.cfg.Now())
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("snapshot undo: template", "template_id", tpl.ID, "err", err)
	}
}

// snapshotInfo names snapshot template tpl at tag.
func snapshotInfo(tpl store.Template, tag string) SnapshotInfo {
	if tpl.Name == tpl.ID {
		return SnapshotInfo{ID: tpl.ID + ":" + tag, Names: []string{}}
	}
	return SnapshotInfo{ID: tpl.Name + ":" + tag, Names: []string{tpl.Name}}
}

// ListSnapshots returns a page of tenant t's snapshots, newest first: of
// sandbox sandboxID only when not empty, and of the snapshot name names
// ("name" or "name:tag") only when not empty. A snapshot is listed at its
// newest tag. limit 0 means all; next is the token of the page after this
// one ("" at the end), and token the one this page starts at.
func (s *Service) ListSnapshots(ctx context.Context, t tenant.ID, sandboxID, name, token string, limit int) (page []SnapshotInfo, next string, err error) {
	tpls, err := s.cfg.Store.ListSnapshotTemplates(ctx, t, sandboxID)
	if err != nil {
		return nil, "", err
	}
	wantName, wantTag := "", ""
	if name != "" {
		wantName, wantTag = splitRef(name)
		if !hasTag(name) {
			wantTag = ""
		}
	}
	after := ""
	if token != "" {
		raw, err := base64.RawURLEncoding.DecodeString(token)
		if err != nil {
			return nil, "", errdefs.New(errdefs.ErrInvalidArgument, "invalid next token")
		}
		after = string(raw)
	}
	started, last := after == "", ""
	for _, tpl := range tpls {
		if !started {
			started = tpl.ID == after
			continue
		}
		if wantName != "" && tpl.Name != wantName && tpl.ID != wantName {
			continue
		}
		tag, ok, err := s.newestReadyTag(ctx, tpl.ID, wantTag)
		if err != nil {
			return nil, "", err
		}
		if !ok {
			continue
		}
		if limit > 0 && len(page) == limit {
			return page, base64.RawURLEncoding.EncodeToString([]byte(last)), nil
		}
		page, last = append(page, snapshotInfo(tpl, tag)), tpl.ID
	}
	return page, "", nil
}

// newestReadyTag returns the tag of template id last pointed at a ready
// build (only tag want, when not empty); ok is false when there is none.
func (s *Service) newestReadyTag(ctx context.Context, id, want string) (tag string, ok bool, err error) {
	tags, err := s.cfg.Store.ListTags(ctx, id)
	if err != nil {
		return "", false, err
	}
	var newest store.Tag
	for _, tg := range tags {
		if want != "" && tg.Tag != want {
			continue
		}
		if _, ready := s.Config(tg.BuildID); ready && (!ok || tg.CreatedAt.After(newest.CreatedAt)) {
			newest, ok = tg, true
		}
	}
	return newest.Tag, ok, nil
}

// hasTag reports whether ref names a tag ("name:tag").
func hasTag(ref string) bool {
	name, _ := splitRef(ref)
	return name != ref && name+":" != ref
}
