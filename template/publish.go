package template

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Default limits of one publish (Config.MaxPublishPaths, MaxPublishMB):
// what a version may hold.
const (
	DefaultMaxPublishPaths = 100_000
	DefaultMaxPublishMB    = 4 << 10
)

// PathChange is one path a version changed, as its conflicts are judged:
// Dir marks a directory it added that only holds other changes (two
// versions may both add one); anything else replaces what was there.
type PathChange struct {
	Path string
	Dir  bool
}

// pathChangeJSON is how a PathChange is stored in its build's result. A
// path that is not UTF-8 goes as bytes (base64), since JSON text would
// turn its bytes into U+FFFD and make two such names one, a false
// conflict.
type pathChangeJSON struct {
	P   string `json:"p,omitempty"`
	P64 []byte `json:"p64,omitempty"`
	D   bool   `json:"d,omitempty"`
}

func (c PathChange) MarshalJSON() ([]byte, error) {
	j := pathChangeJSON{D: c.Dir}
	if utf8.ValidString(c.Path) {
		j.P = c.Path
	} else {
		j.P64 = []byte(c.Path)
	}
	return json.Marshal(j)
}

func (c *PathChange) UnmarshalJSON(b []byte) error {
	var j pathChangeJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*c = PathChange{Path: j.P, Dir: j.D}
	if j.P64 != nil {
		c.Path = string(j.P64)
	}
	return nil
}

// Version is one ready build of a template in its project history.
type Version struct {
	TemplateID, Template string // its template's id and name
	BuildID              string
	// Number counts the template's ready builds, oldest first, from 1.
	Number int
	// Parent is the build a published version was made from; "" for a
	// build of steps or a snapshot.
	Parent string
	// Sandbox published it ("" when built).
	Sandbox string
	// Paths is how many paths it changed.
	Paths     int
	Current   bool // the template's default tag points at it
	CreatedAt time.Time
}

// ConflictError is a publish refused because versions published since
// its sandbox started changed the same paths.
type ConflictError struct {
	Template string
	Since    string // the version the sandbox started from
	Paths    []string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("template %q changed since version %s in %d of the same paths: %s",
		e.Template, e.Since, len(e.Paths), strings.Join(e.Paths[:min(len(e.Paths), 20)], ", "))
}

// Is makes a ConflictError an errdefs.ErrConflict (409).
func (e *ConflictError) Is(target error) bool { return target == errdefs.ErrConflict }

// pathChanges is what changes contribute to conflicts.
func pathChanges(changes []runtime.Change) []PathChange {
	out := make([]PathChange, len(changes))
	for i, c := range changes {
		out[i] = PathChange{Path: c.Path, Dir: c.Kind == runtime.ChangeAdded && c.Mode.IsDir() && !c.Opaque}
	}
	return out
}

// Conflicts returns the paths of mine that clash with theirs: the same
// path (unless both only add a directory), or a path below one the other
// side replaced (deleted, made opaque, or turned into a non-directory).
// Sorted, each once.
func Conflicts(mine, theirs []PathChange) []string {
	their := make(map[string]PathChange, len(theirs))
	under := map[string]bool{} // every ancestor of their paths
	for _, c := range theirs {
		their[c.Path] = c
		for p := path.Dir(c.Path); p != "/" && p != "."; p = path.Dir(p) {
			under[p] = true
		}
	}
	var out []string
	for _, c := range mine {
		clash := false
		if o, ok := their[c.Path]; ok && !(o.Dir && c.Dir) {
			clash = true
		}
		if !c.Dir && under[c.Path] {
			clash = true // mine replaced a directory they changed inside
		}
		for p := path.Dir(c.Path); !clash && p != "/" && p != "."; p = path.Dir(p) {
			if o, ok := their[p]; ok && !o.Dir {
				clash = true // they replaced a directory mine changed inside
			}
		}
		if clash {
			out = append(out, c.Path)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Publish makes what running sandbox id of tenant t changed (changes, the
// backend's Differ's list) the next version of template target (a name
// of t's; "" for the template the sandbox was created from): a build whose
// layers are the current version's plus one layer of the sandbox's
// changes. The sandbox must have started from the current version or
// from one it descends from by publishes that changed none of the same
// paths (else *ConflictError, 409, listing them); a template rebuilt from
// steps since is a conflict too. A sandbox of a built-in template
// publishes to a new template (target required), as version 1. Exactly
// one of two concurrent publishes from the same version wins. New
// sandboxes of the template start from the new version; running ones keep
// theirs.
func (s *Service) Publish(ctx context.Context, sbx Sandboxes, t tenant.ID, id, target string, changes []runtime.Change) (Version, error) {
	if s.cfg.Layered == nil {
		return Version{}, errdefs.New(errdefs.ErrNotImplemented, "this backend cannot publish sandboxes")
	}
	if len(changes) == 0 {
		return Version{}, errdefs.New(errdefs.ErrInvalidArgument, "the sandbox has no changes to publish")
	}
	var size int64
	for _, c := range changes {
		size += c.Size
	}
	maxPaths, maxMB := cmp.Or(max(s.cfg.MaxPublishPaths, 0), DefaultMaxPublishPaths), cmp.Or(max(s.cfg.MaxPublishMB, 0), DefaultMaxPublishMB)
	switch mib := (size + 1<<20 - 1) >> 20; {
	case len(changes) > maxPaths:
		return Version{}, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(
			"publish limit: the sandbox changed %d paths; a version holds at most %d paths (--max-publish-paths)", len(changes), maxPaths))
	case size > int64(maxMB)<<20:
		return Version{}, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(
			"publish limit: the sandbox changed %d MiB of files; a version holds at most %d MiB (--max-publish-mb)", mib, maxMB))
	}
	src, err := sbx.Get(ctx, id)
	if err != nil {
		return Version{}, err
	}
	if err := sandbox.RunningFor(src, "published"); err != nil {
		return Version{}, err
	}
	from := src.Template // the build (or built-in template) it started from
	var tpl store.Template
	fresh := false // the publish makes the template
	switch c, built := s.Config(from); {
	case target == "" && !built:
		return Version{}, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(
			"the sandbox runs built-in template %q: name a template to publish to", from))
	case target == "":
		if tpl, err = s.own(ctx, t, c.TemplateID); err != nil {
			return Version{}, err
		}
	default:
		name, _ := splitRef(target)
		if err := s.checkName(name, nil); err != nil {
			return Version{}, err
		}
		tpl, err = s.own(ctx, t, name)
		switch {
		case errdefs.IsNotFound(err):
			tpl = store.Template{ID: sandbox.NewID(), Tenant: t, Name: name, CPUCount: src.CPUCount, MemoryMB: src.MemoryMB}
			fresh = true
		case err != nil:
			return Version{}, err
		}
	}
	unlock := s.lockTemplate(tpl.ID)
	defer unlock()

	cur, curRes, err := s.currentVersion(ctx, tpl)
	if err != nil {
		return Version{}, err
	}
	mine := pathChanges(changes)
	if cur != "" && cur != from {
		theirs, err := s.publishedSince(ctx, tpl, cur, from)
		if err != nil {
			return Version{}, err
		}
		if clash := Conflicts(mine, theirs); len(clash) > 0 {
			return Version{}, &ConflictError{Template: tpl.Name, Since: from, Paths: clash}
		}
	}
	res := curRes
	if cur == "" {
		// A new template (or one with no version yet): what the sandbox
		// started from is its base.
		if res, err = s.resultOf(ctx, from); err != nil {
			return Version{}, err
		}
	}
	buildID := uuid.NewString()
	key := commitLayer(buildID)
	res.Layers = append(slices.Clone(res.Layers), key)
	res.Parent, res.Sandbox, res.Paths, res.Bytes = cur, id, mine, size

	raw, _ := json.Marshal(res)
	stored, err := s.cfg.Store.StartCommit(ctx, tpl, buildID, raw, s.cfg.Now())
	if err != nil {
		return Version{}, err
	}
	r := revert.New()
	defer r.Fail()
	cleanupCtx := context.WithoutCancel(ctx)
	r.Add(func() { s.dropCommit(cleanupCtx, stored, buildID, fresh && stored.ID == tpl.ID) })
	if _, err := sbx.Checkpoint(ctx, id, key); err != nil {
		return Version{}, err
	}
	if err := s.define(ctx, stored, buildID, res); err != nil {
		return Version{}, fmt.Errorf("publish sandbox %s: %w", id, err)
	}
	err = s.cfg.Store.FinishCommit(ctx, store.Build{ID: buildID, TemplateID: stored.ID, Result: raw}, DefaultTag, cur, s.cfg.Now())
	if errors.Is(err, store.ErrConflict) {
		return Version{}, errdefs.New(errdefs.ErrConflict, fmt.Sprintf("template %q got another version meanwhile: publish again", tpl.Name))
	}
	if err != nil {
		return Version{}, fmt.Errorf("publish sandbox %s: %w", id, err)
	}
	r.Success()
	s.changed()
	vs, err := s.Versions(ctx, t, stored.ID)
	if err != nil || len(vs) == 0 {
		return Version{TemplateID: stored.ID, Template: stored.Name, BuildID: buildID, Parent: cur, Sandbox: id, Paths: len(mine), Current: true}, err
	}
	s.log.Info("template version published", "audit", true, "tenant", t, "sandbox_id", id, "template_id", stored.ID,
		"build_id", buildID, "parent", cur, "version", vs[0].Number, "paths", len(mine))
	return vs[0], nil
}

// lockTemplate serialises publishes to template id.
func (s *Service) lockTemplate(id string) func() {
	return lockOf(&s.mu, s.publishing, id)
}

// lockOf locks the mutex of key in m (made on first use, under mu).
func lockOf[K comparable](mu *sync.RWMutex, m map[K]*sync.Mutex, key K) func() {
	mu.Lock()
	l := m[key]
	if l == nil {
		l = &sync.Mutex{}
		m[key] = l
	}
	mu.Unlock()
	l.Lock()
	return l.Unlock
}

// currentVersion returns the build tpl's default tag points at and its
// result; "" for a template that has none yet.
func (s *Service) currentVersion(ctx context.Context, tpl store.Template) (string, Result, error) {
	tags, err := s.cfg.Store.ListTags(ctx, tpl.ID)
	if err != nil {
		return "", Result{}, err
	}
	for _, tg := range tags {
		if tg.Tag != DefaultTag {
			continue
		}
		b, err := s.cfg.Store.GetBuild(ctx, tpl.ID, tg.BuildID)
		if err != nil {
			return "", Result{}, err
		}
		var res Result
		if err := json.Unmarshal(b.Result, &res); err != nil {
			return "", Result{}, fmt.Errorf("build %s: result: %w", b.ID, err)
		}
		return b.ID, res, nil
	}
	return "", Result{}, nil
}

// publishedSince collects what the versions from cur back to (not
// including) from changed, following their parents; a chain that does not
// reach from (a build of steps, or a version of another line) is a
// conflict on everything.
func (s *Service) publishedSince(ctx context.Context, tpl store.Template, cur, from string) ([]PathChange, error) {
	var out []PathChange
	for b := cur; b != from; {
		bd, err := s.cfg.Store.GetBuild(ctx, tpl.ID, b)
		if err != nil {
			return nil, err
		}
		var res Result
		if err := json.Unmarshal(bd.Result, &res); err != nil {
			return nil, fmt.Errorf("build %s: result: %w", b, err)
		}
		if res.Parent == "" {
			return nil, errdefs.New(errdefs.ErrConflict, fmt.Sprintf(
				"template %q was built again since the sandbox's version %s: its changes cannot be merged", tpl.Name, from))
		}
		out = append(out, res.Paths...)
		b = res.Parent
	}
	return out, nil
}

// Versions returns the ready builds of tenant t's template ref, newest
// first.
func (s *Service) Versions(ctx context.Context, t tenant.ID, ref string) ([]Version, error) {
	tpl, err := s.Find(ctx, t, ref)
	if err != nil {
		return nil, err
	}
	builds, err := s.cfg.Store.ListBuilds(ctx, tpl.ID, store.BuildReady)
	if err != nil {
		return nil, err
	}
	cur, _, err := s.currentVersion(ctx, tpl)
	if err != nil {
		return nil, err
	}
	out := make([]Version, len(builds))
	for i, b := range builds {
		var res Result
		_ = json.Unmarshal(b.Result, &res)
		out[i] = Version{
			TemplateID: tpl.ID, Template: tpl.Name, BuildID: b.ID, Number: len(builds) - i, Parent: res.Parent, Sandbox: res.Sandbox,
			Paths: len(res.Paths), Current: b.ID == cur, CreatedAt: b.CreatedAt,
		}
	}
	return out, nil
}
