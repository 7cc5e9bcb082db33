// Package template owns the templates tenants build through E2B's template
// API (build system v2): their names, builds, tags and uploaded files, the
// builder that turns a build's steps into layers on a runtime.Layered
// backend, and the lookup the lifecycle manager uses to create sandboxes
// from them (sandbox.TemplateSource).
//
// A template is a stack of content-addressed layers on a base plus its
// config (env, user, workdir, start and ready commands). A layer's key
// hashes its parent's key with the step that made it (the command, the
// files' hash, the user, workdir and env it ran with), so an unchanged
// prefix of steps is a cache hit and templates that share one share its
// layers on disk. Every ready build is defined on the backend under its
// build id; sandboxes and warm pools name it like any backend template.
package template

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// DefaultBuildTimeout bounds a build whose tenant's limits name no time.
const DefaultBuildTimeout = time.Hour

// DefaultTag is the tag a build gets when it names none, and the one a
// create that names a template without a tag runs.
const DefaultTag = "default"

// DefaultBaseImage is what E2B's SDKs send as fromImage when a template
// names no base; it resolves to the backend's "base" unless Config.Images
// maps it elsewhere.
const DefaultBaseImage = "e2bdev/base"

// E2B's defaults for a template's processes.
const (
	defaultUser    = "user"
	defaultWorkdir = "/home/user"
)

// Result is what a ready build is: the root filesystem (layers on base)
// and the config its sandboxes start with.
type Result struct {
	Base     string            `json:"base"`
	Layers   []string          `json:"layers"`
	Env      map[string]string `json:"env,omitempty"`
	User     string            `json:"user"`
	Workdir  string            `json:"workdir"`
	StartCmd string            `json:"startCmd,omitempty"`
	ReadyCmd string            `json:"readyCmd,omitempty"`
	// Partial marks the result of a build of steps while it runs: the
	// layers made so far (Layers alone), so that a crash loses none
	// (its template's delete queues them).
	Partial bool `json:"partial,omitempty"`
	// Bytes is, for a snapshot, what its own (top) layer holds: the
	// sandbox's disk use when it was taken. It counts against the
	// tenant's MaxSnapshotMB.
	Bytes int64 `json:"bytes,omitempty"`
	// A published version (Publish): the build it was made from, the
	// sandbox that made it and the paths it changed.
	Parent  string       `json:"parent,omitempty"`
	Sandbox string       `json:"sandbox,omitempty"`
	Paths   []PathChange `json:"paths,omitempty"`
}

// Config configures a Service.
type Config struct {
	Store   *store.Store
	Backend runtime.Backend
	// Layered is Backend's layer store; nil when the backend has none:
	// builds then fail with a clear reason, everything else works.
	Layered runtime.Layered
	// Builtin reports whether name is one of the backend's own templates
	// (names a tenant's template may not take).
	Builtin func(name string) bool
	// Dir holds uploaded build files (<Dir>/files/<tenant>/<hash>).
	Dir string
	// Images maps image references to backend templates, replacing a pull:
	// DefaultBaseImage maps to "base" unless set otherwise.
	Images map[string]string
	// MaxBuilds is how many builds run at once on this host; more wait.
	// 0: 2.
	MaxBuilds int
	// Limits are what tenant t's builds may use (per-tenant settings over
	// the server's): a build sandbox's CPUs and memory at most, its disk,
	// and a build's time (0: DefaultBuildTimeout). nil: no limits.
	Limits func(t tenant.ID) tenant.BuildBudget
	// Defaults fills in the resources a template leaves unset.
	Defaults func() runtime.Resources
	// PlainHTTPRegistries are registry hosts pulled over plain HTTP (a
	// registry on loopback for tests and air-gapped installs).
	PlainHTTPRegistries []string
	// MaxSnapshots and MaxSnapshotMB bound each tenant's snapshots: how
	// many (every snapshot build counts) and their layers' total size.
	// 0: no bound.
	MaxSnapshots, MaxSnapshotMB int
	// MaxPublishPaths and MaxPublishMB bound one publish: the paths a
	// version may change and their bytes. 0: DefaultMaxPublishPaths,
	// DefaultMaxPublishMB.
	MaxPublishPaths, MaxPublishMB int
	// UploadSecret signs upload links; random when empty.
	UploadSecret []byte
	// CollectEvery is how often the layers queued for removal are tried
	// again (a sandbox used one at its template's delete). 0: a minute.
	CollectEvery time.Duration
	Log          *slog.Logger
	Now          func() time.Time
}

// Service is the template registry and builder.
type Service struct {
	cfg   Config
	log   *slog.Logger
	slots chan struct{}
	// stop ends the builds in progress (Close); builds waits for them.
	stopCtx context.Context
	stop    context.CancelFunc
	builds  sync.WaitGroup

	mu sync.RWMutex
	// ready maps the backend name of every ready build (its id) to what
	// sandboxes of it start with.
	ready map[string]sandbox.TemplateConfig
	// running are the builds in progress, by build id.
	running map[string]*buildLog
	// forget is told of every build undefined (its warm members go).
	forget func(ctx context.Context, backend string)
	// snapshotting serialises a tenant's snapshots, so that two cannot
	// both pass its quota.
	snapshotting map[tenant.ID]*sync.Mutex
	// publishing serialises the publishes to one template (by id).
	publishing map[string]*sync.Mutex
	// resolved caches Resolve's answers, so that a create from a built
	// template costs no query more than one from base; every change of
	// names, tags, visibility or ready builds clears it.
	resolved map[resolveKey]string
	// layers is read-held by every build that runs, which may take a
	// queued layer from the cache; a collection of layers runs only
	// with it write-held, so between builds.
	layers sync.RWMutex
	// collectWanted is set by every call of collectLayers. Whoever lets
	// go of layers runs the collection while it is set: one asked for
	// while a build or another collection held the lock (a template's
	// delete during the collection at start) is not left to the next
	// CollectEvery.
	collectWanted atomic.Bool
}

type resolveKey struct {
	t   tenant.ID
	ref string
}

// Close fails the builds in progress ("sandboxd stopped during the build"),
// removes their build sandboxes and waits for them to be recorded; a
// build requested after Close fails at once.
func (s *Service) Close() {
	s.stop()
	s.builds.Wait()
}

// OnForget registers fn to run when a build's backend template goes, before
// its layers are collected: warm pools drop their members of it.
func (s *Service) OnForget(fn func(ctx context.Context, backend string)) {
	s.mu.Lock()
	s.forget = fn
	s.mu.Unlock()
}

// changed drops what Resolve cached.
func (s *Service) changed() {
	s.mu.Lock()
	clear(s.resolved)
	s.mu.Unlock()
}

var _ sandbox.TemplateSource = (*Service)(nil)

// New returns a Service; call Start before serving.
func New(cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxBuilds <= 0 {
		cfg.MaxBuilds = 2
	}
	if cfg.Limits == nil {
		cfg.Limits = func(tenant.ID) tenant.BuildBudget { return tenant.BuildBudget{} }
	}
	if cfg.Builtin == nil {
		cfg.Builtin = func(string) bool { return false }
	}
	if cfg.Defaults == nil {
		cfg.Defaults = func() runtime.Resources { return runtime.Resources{CPUCount: 2, MemoryMB: 512, DiskSizeMB: 2048} }
	}
	images := map[string]string{DefaultBaseImage: "base"}
	maps.Copy(images, cfg.Images)
	cfg.Images = images
	if len(cfg.UploadSecret) == 0 {
		cfg.UploadSecret = make([]byte, 32)
		_, _ = rand.Read(cfg.UploadSecret)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "files"), 0o700); err != nil {
		return nil, fmt.Errorf("template files dir: %w", err)
	}
	stopCtx, stop := context.WithCancel(context.Background())
	return &Service{
		cfg: cfg, log: cfg.Log, slots: make(chan struct{}, cfg.MaxBuilds), stopCtx: stopCtx, stop: stop,
		ready: map[string]sandbox.TemplateConfig{}, running: map[string]*buildLog{},
		resolved: map[resolveKey]string{}, snapshotting: map[tenant.ID]*sync.Mutex{}, publishing: map[string]*sync.Mutex{},
	}, nil
}

// Start recovers after a restart: builds that were in progress are marked
// failed (their scratch sandboxes are not in the store, so the manager's
// reconcile destroys them), and every ready build is defined on the
// backend again.
func (s *Service) Start(ctx context.Context) error {
	for _, st := range []store.BuildStatus{store.BuildWaiting, store.BuildBuilding} {
		builds, err := s.cfg.Store.ListBuilds(ctx, "", st)
		if err != nil {
			return fmt.Errorf("templates: %w", err)
		}
		for _, b := range builds {
			b.Status, b.Reason, b.ReasonStep = store.BuildError, "sandboxd restarted during the build", ""
			if err := s.cfg.Store.UpdateBuild(ctx, b, s.cfg.Now()); err != nil {
				return fmt.Errorf("templates: mark build %s failed: %w", b.ID, err)
			}
			s.log.Info("template build failed by restart", "build_id", b.ID, "template_id", b.TemplateID)
			var res Result
			if b.Result != nil && json.Unmarshal(b.Result, &res) == nil && res.Partial {
				continue // a build of steps: its layers stay, the cache of the next
			}
			if tpl, err := s.templateOfBuild(ctx, b); err == nil && b.Result != nil && s.cfg.Layered != nil {
				// A snapshot or publish cut short (a build of steps has
				// only a partial result, skipped above): its layer may be
				// half made, and a template it made has no version.
				s.dropCommit(ctx, tpl, b.ID, true)
			}
		}
	}
	builds, err := s.cfg.Store.ListBuilds(ctx, "", store.BuildReady)
	if err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	for _, b := range builds {
		tpl, err := s.templateOfBuild(ctx, b)
		if err != nil {
			return err
		}
		var res Result
		if err := json.Unmarshal(b.Result, &res); err != nil {
			s.log.Error("template build: bad result", "build_id", b.ID, "err", err)
			continue
		}
		if err := s.define(ctx, tpl, b.ID, res); err != nil {
			// A layer lost with the backend's state: sandboxes of this
			// build cannot start; it says so when named.
			s.log.Error("template build: define", "build_id", b.ID, "template_id", tpl.ID, "err", err)
		}
	}
	if s.cfg.Layered != nil {
		s.builds.Add(1)
		go func() {
			defer s.builds.Done()
			s.collectLoop()
		}()
	}
	return nil
}

func (s *Service) templateOfBuild(ctx context.Context, b store.Build) (store.Template, error) {
	tpl, err := s.cfg.Store.GetTemplate(ctx, b.TemplateID)
	if err != nil {
		return store.Template{}, fmt.Errorf("templates: template of build %s: %w", b.ID, err)
	}
	return tpl, nil
}

// define makes build id a backend template and a source of sandboxes.
func (s *Service) define(ctx context.Context, tpl store.Template, id string, res Result) error {
	if s.cfg.Layered == nil {
		return fmt.Errorf("%w: the backend cannot hold built templates", runtime.ErrUnsupported)
	}
	if err := s.cfg.Layered.DefineTemplate(ctx, id, res.Base, res.Layers); err != nil {
		return err
	}
	s.mu.Lock()
	s.ready[id] = s.templateConfig(tpl, res)
	s.mu.Unlock()
	return nil
}

func (s *Service) templateConfig(tpl store.Template, res Result) sandbox.TemplateConfig {
	return sandbox.TemplateConfig{
		TemplateID: tpl.ID, Alias: tpl.Name,
		Resources: runtime.Resources{CPUCount: tpl.CPUCount, MemoryMB: tpl.MemoryMB},
		Env:       res.Env, User: res.User, Workdir: res.Workdir,
		StartCmd: res.StartCmd, ReadyCmd: res.ReadyCmd,
	}
}

// Config returns what sandboxes of backend template name start with, when
// name is a build of this Service.
func (s *Service) Config(name string) (sandbox.TemplateConfig, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c, ok := s.ready[name]
	return c, ok
}

// Resolve returns the backend template (a build id) that a create of
// tenant t naming ref runs: ref is a template's id or name, with an
// optional ":tag" (DefaultTag when none). ok is false when ref names no
// template of this Service, so that the backend's own templates resolve
// as before.
func (s *Service) Resolve(ctx context.Context, t tenant.ID, ref string) (string, bool, error) {
	if s.cfg.Builtin(ref) {
		return "", false, nil
	}
	s.mu.RLock()
	build, ok := s.resolved[resolveKey{t, ref}]
	s.mu.RUnlock()
	if ok {
		if _, defined := s.Config(build); defined {
			return build, true, nil
		}
	}
	name, tag := splitRef(ref)
	tpl, err := s.cfg.Store.FindTemplate(ctx, t, name)
	if errors.Is(err, store.ErrNotFound) {
		// A build id (what the backend knows a sandbox's template by): its
		// template must be visible to t.
		if c, ok := s.Config(ref); ok && tag == DefaultTag && c.TemplateID != "" {
			if _, err := s.cfg.Store.FindTemplate(ctx, t, c.TemplateID); err == nil {
				return ref, true, nil
			}
		}
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	build, err = s.taggedBuild(ctx, tpl, tag)
	if err != nil {
		return "", true, err
	}
	if _, ok := s.Config(build); !ok {
		return "", true, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(
			"template %q: build %s cannot be started on this backend", ref, build))
	}
	s.mu.Lock()
	s.resolved[resolveKey{t, ref}] = build
	s.mu.Unlock()
	return build, true, nil
}

func (s *Service) taggedBuild(ctx context.Context, tpl store.Template, tag string) (string, error) {
	tags, err := s.cfg.Store.ListTags(ctx, tpl.ID)
	if err != nil {
		return "", err
	}
	for _, tg := range tags {
		if tg.Tag == tag {
			return tg.BuildID, nil
		}
	}
	if tag == DefaultTag {
		// Every build named a tag of its own: the bare name runs the
		// newest ready one.
		builds, err := s.cfg.Store.ListBuilds(ctx, tpl.ID, store.BuildReady)
		if err != nil {
			return "", err
		}
		if len(builds) > 0 {
			return builds[0].ID, nil
		}
		return "", errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("template %q has no ready build", tpl.Name))
	}
	return "", errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("template %q has no tag %q", tpl.Name, tag))
}

// splitRef splits "name:tag" (tag DefaultTag when absent).
func splitRef(ref string) (name, tag string) {
	if i := strings.LastIndexByte(ref, ':'); i > 0 && i < len(ref)-1 && !strings.Contains(ref[i:], "/") {
		return ref[:i], ref[i+1:]
	}
	return strings.TrimSuffix(ref, ":"), DefaultTag
}

var (
	nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._/-]{0,127}$`)
	tagRE  = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$`)
)

// Requested is a build just requested.
type Requested struct {
	Template store.Template
	BuildID  string
	Tags     []string
}

// Request starts a build of tenant t's template name (created if new) with
// tags (from "name:tag" and tags; DefaultTag when none). The build waits
// for its steps (StartBuild).
func (s *Service) Request(ctx context.Context, t tenant.ID, ref string, tags []string, cpu, memMB int) (Requested, error) {
	name, tag := splitRef(ref)
	all := slices.Clone(tags)
	if strings.Contains(ref, ":") || len(all) == 0 {
		all = append(all, tag)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	if err := s.checkName(name, all); err != nil {
		return Requested{}, err
	}
	if cpu < 0 || memMB < 0 {
		return Requested{}, errdefs.New(errdefs.ErrInvalidArgument, "resources must not be negative")
	}
	id := uuid.NewString()
	tpl, err := s.cfg.Store.RequestBuild(ctx, store.Template{
		ID: sandbox.NewID(), Tenant: t, Name: name, CPUCount: cpu, MemoryMB: memMB, // E2B's id format, as sandboxes'
	}, id, s.cfg.Now())
	if err != nil {
		return Requested{}, err
	}
	s.mu.Lock()
	s.running[id] = newBuildLog(all)
	clear(s.resolved) // a new name may shadow a public one
	s.mu.Unlock()
	s.log.Info("template build requested", "tenant", t, "template_id", tpl.ID, "build_id", id, "name", name, "tags", all)
	return Requested{Template: tpl, BuildID: id, Tags: all}, nil
}

// checkName refuses a template name or tags a tenant may not give.
func (s *Service) checkName(name string, tags []string) error {
	if !nameRE.MatchString(name) {
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(
			"template name %q: 1 to 128 letters, digits, '.', '_', '-' and '/', starting with a letter or digit", name))
	}
	if s.cfg.Builtin(name) {
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("template name %q is taken by a built-in template", name))
	}
	for _, tg := range tags {
		if !tagRE.MatchString(tg) {
			return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("tag %q: 1 to 64 letters, digits, '.', '_' and '-'", tg))
		}
	}
	return nil
}

// Find returns the template tenant t may use by id or name[:tag].
func (s *Service) Find(ctx context.Context, t tenant.ID, ref string) (store.Template, error) {
	name, _ := splitRef(ref)
	tpl, err := s.cfg.Store.FindTemplate(ctx, t, name)
	if errors.Is(err, store.ErrNotFound) {
		return store.Template{}, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("template %q not found", ref))
	}
	return tpl, err
}

// own is Find for a change: only the tenant's own templates qualify.
func (s *Service) own(ctx context.Context, t tenant.ID, ref string) (store.Template, error) {
	tpl, err := s.Find(ctx, t, ref)
	if err != nil {
		return tpl, err
	}
	if tpl.Tenant != t {
		return store.Template{}, errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("template %q belongs to another team", ref))
	}
	return tpl, nil
}

// List returns the templates tenant t may use.
func (s *Service) List(ctx context.Context, t tenant.ID) ([]store.Template, error) {
	return s.cfg.Store.ListTemplates(ctx, t)
}

// Builds returns a template's builds, newest first.
func (s *Service) Builds(ctx context.Context, tpl store.Template) ([]store.Build, error) {
	return s.cfg.Store.ListBuilds(ctx, tpl.ID, "")
}

// Tags returns a template's tags.
func (s *Service) Tags(ctx context.Context, tpl store.Template) ([]store.Tag, error) {
	return s.cfg.Store.ListTags(ctx, tpl.ID)
}

// AssignTags points tags at the build target ("name:tag") names.
func (s *Service) AssignTags(ctx context.Context, t tenant.ID, target string, tags []string) (string, error) {
	tpl, err := s.own(ctx, t, target)
	if err != nil {
		return "", err
	}
	_, tag := splitRef(target)
	build, err := s.taggedBuild(ctx, tpl, tag)
	if err != nil {
		return "", err
	}
	for _, tg := range tags {
		if !tagRE.MatchString(tg) {
			return "", errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("tag %q: 1 to 64 letters, digits, '.', '_' and '-'", tg))
		}
	}
	if err := s.cfg.Store.SetTags(ctx, tpl.ID, build, tags, s.cfg.Now()); err != nil {
		return "", err
	}
	s.changed()
	s.log.Info("template tags assigned", "tenant", t, "template_id", tpl.ID, "build_id", build, "tags", tags)
	return build, nil
}

// DeleteTags removes tags from tenant t's template name.
func (s *Service) DeleteTags(ctx context.Context, t tenant.ID, name string, tags []string) error {
	tpl, err := s.own(ctx, t, name)
	if err != nil {
		return err
	}
	if err := s.cfg.Store.DeleteTags(ctx, tpl.ID, tags); err != nil {
		return err
	}
	s.changed()
	s.log.Info("template tags deleted", "tenant", t, "template_id", tpl.ID, "tags", tags)
	return nil
}

// SetPublic changes whether other tenants may use tenant t's template.
func (s *Service) SetPublic(ctx context.Context, t tenant.ID, ref string, public bool) error {
	tpl, err := s.own(ctx, t, ref)
	if err != nil {
		return err
	}
	if err := s.cfg.Store.SetTemplatePublic(ctx, t, tpl.ID, public, s.cfg.Now()); err != nil {
		return err
	}
	s.changed()
	s.log.Info("template visibility changed", "tenant", t, "template_id", tpl.ID, "public", public)
	return nil
}

// Delete removes tenant t's template: its builds are undefined on the
// backend (running sandboxes keep what they were created from) and the
// layers no other ready build uses are removed once no sandbox uses them.
func (s *Service) Delete(ctx context.Context, t tenant.ID, ref string) error {
	tpl, err := s.own(ctx, t, ref)
	if err != nil {
		return err
	}
	builds, err := s.cfg.Store.DeleteTemplate(ctx, t, tpl.ID, layersOf, s.cfg.Now())
	if err != nil {
		return err
	}
	s.changed()
	for _, b := range builds {
		s.mu.Lock()
		delete(s.ready, b.ID)
		forget := s.forget
		s.mu.Unlock()
		if forget != nil {
			forget(ctx, b.ID)
		}
		if s.cfg.Layered != nil {
			if err := s.cfg.Layered.UndefineTemplate(ctx, b.ID); err != nil {
				s.log.Warn("template delete: undefine", "build_id", b.ID, "err", err)
			}
		}
	}
	s.log.Info("template deleted", "tenant", t, "template_id", tpl.ID, "builds", len(builds))
	s.collectLayers(ctx)
	return nil
}

// layersOf are the layers build b's result names: a ready build's stack,
// or the layers a failed build had made or taken from the cache.
func layersOf(b store.Build) []string {
	var res Result
	if b.Result == nil || json.Unmarshal(b.Result, &res) != nil {
		return nil
	}
	return res.Layers
}

// collectLayers removes the layers queued for removal (a template's
// delete queues its builds' layers) that no ready build uses, and forgets
// those a ready build uses. A layer a live sandbox or a warm member still
// uses (runtime.ErrInUse), or whose removal fails, stays queued for the
// next collection: every CollectEvery, and at the next start after a
// crash. Nothing runs while a build does: it may have taken a queued
// layer from the cache, and its result is not written yet.
func (s *Service) collectLayers(ctx context.Context) {
	if s.cfg.Layered == nil {
		return
	}
	s.collectWanted.Store(true)
	for s.collectWanted.Load() && s.layers.TryLock() {
		s.collectWanted.Store(false)
		s.collectOnce(ctx)
		s.layers.Unlock()
	}
}

// holdLayers read-holds layers for a build; the func it returns lets go
// and runs the collection asked for meanwhile, if any.
func (s *Service) holdLayers() (release func()) {
	s.layers.RLock()
	return func() {
		s.layers.RUnlock()
		if s.collectWanted.Load() {
			s.collectLayers(s.stopCtx)
		}
	}
}

// holdLayersInSlot is holdLayers for a build that holds one of the build
// slots: the func it returns frees the slot before it lets go of the
// layers, so that a collection run then (the removal of a large layer
// takes seconds) never holds a queued build back.
func (s *Service) holdLayersInSlot() (release func()) {
	let := s.holdLayers()
	return func() {
		<-s.slots
		let()
	}
}

// collectOnce is one pass of collectLayers, with layers write-held.
func (s *Service) collectOnce(ctx context.Context) {
	queued, err := s.cfg.Store.LayerRemovals(ctx)
	if err != nil || len(queued) == 0 {
		if err != nil {
			s.log.Warn("template layers: list the removals", "err", err)
		}
		return
	}
	ready, err := s.cfg.Store.ListBuilds(ctx, "", store.BuildReady)
	if err != nil {
		s.log.Warn("template layers: list builds", "err", err)
		return
	}
	keep := map[string]bool{}
	for _, b := range ready {
		for _, l := range layersOf(b) {
			keep[l] = true
		}
	}
	for _, l := range queued {
		if !keep[l] {
			if err := s.cfg.Layered.RemoveLayer(ctx, l); err != nil {
				// In use: tried again every pass while its sandboxes
				// live (up to a day), so not at Info.
				level := slog.LevelWarn
				if errors.Is(err, runtime.ErrInUse) {
					level = slog.LevelDebug
				}
				s.log.Log(ctx, level, "template layers: removal deferred", "layer", l, "err", err)
				continue
			}
			s.log.Info("template layer removed", "layer", l)
		}
		if err := s.cfg.Store.LayerRemoved(ctx, l); err != nil {
			s.log.Warn("template layers: forget a removal", "layer", l, "err", err)
		}
	}
}

// collectLoop collects layers at once and every CollectEvery until the
// service closes.
func (s *Service) collectLoop() {
	every := s.cfg.CollectEvery
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.collectLayers(s.stopCtx)
		select {
		case <-s.stopCtx.Done():
			return
		case <-t.C:
		}
	}
}

// hashKey is a layer or cache key: the hex SHA-256 of its parts, cut to
// 32 characters (128 bits) to keep overlayfs' option string short.
func hashKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\x00", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// BuildInfo returns build id of tenant t's template ref with its log so
// far.
func (s *Service) BuildInfo(ctx context.Context, t tenant.ID, ref, id string) (store.Build, []LogEntry, error) {
	tpl, err := s.Find(ctx, t, ref)
	if err != nil {
		return store.Build{}, nil, err
	}
	b, err := s.cfg.Store.GetBuild(ctx, tpl.ID, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Build{}, nil, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("build %q of template %q not found", id, ref))
	}
	if err != nil {
		return store.Build{}, nil, err
	}
	s.mu.RLock()
	l := s.running[id]
	s.mu.RUnlock()
	if l != nil && !b.Status.Finished() {
		return b, l.entries(), nil
	}
	var ents []LogEntry
	if len(b.Logs) > 0 {
		if err := json.Unmarshal(b.Logs, &ents); err != nil {
			return b, nil, fmt.Errorf("build %s: log: %w", id, err)
		}
	}
	return b, ents, nil
}

// IsBuild reports whether backend template name is a build of this
// Service (not one of the backend's own).
func (s *Service) IsBuild(name string) bool {
	_, ok := s.Config(name)
	return ok
}
