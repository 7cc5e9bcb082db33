package sandbox

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/runtime"
)

// spares is the Admitter's side of the host-wide spare pools (package
// pool: a Key without a tenant). Which templates a spare pool may serve:
// the backend's own (every tenant may create them) and the public templates
// the operator names in SpareMin, resolved once they are ready (a template
// built in the background at start gets its members when its build is
// done). A tenant's private template never has one.
type spares struct {
	// min is the operator's floor per template reference (SpareMin).
	min map[string]int
	// resolve maps a reference to the backend template a create of it
	// runs, as seen by no tenant (public templates and the backend's own),
	// or reports that it is not (yet) startable.
	resolve func(ctx context.Context, ref string) (string, bool)
	// builtin reports whether template is one of the backend's own.
	builtin func(template string) bool
	// key is the spare pool of template: default resources, internet
	// allowed (what a plain Sandbox.create() asks for).
	key func(template string) pool.Key

	mu       sync.Mutex
	floors   map[string]int // backend template -> floor, as last resolved
	public   map[string]bool
	builtins map[string]bool // builtin's answers since the last refresh
	resolved time.Time
}

// spareRefresh is how often the references in SpareMin are resolved again
// (a template rebuilt gets a new build id; one built late becomes ready).
const spareRefresh = 2 * time.Second

// refresh resolves the references of min at most every spareRefresh.
// Only Seeds (the pools' single refill loop) calls it; the store lookups
// run outside mu, which claims take.
func (s *spares) refresh(ctx context.Context) {
	s.mu.Lock()
	fresh := !s.resolved.IsZero() && time.Since(s.resolved) < spareRefresh
	s.mu.Unlock()
	if fresh {
		return
	}
	floors := map[string]int{}
	public := map[string]bool{}
	for ref, n := range s.min {
		if backend, ok := s.resolve(ctx, ref); ok {
			floors[backend] = max(floors[backend], n)
			public[backend] = true
		}
	}
	s.mu.Lock()
	s.floors, s.public, s.builtins = floors, public, map[string]bool{}
	s.resolved = time.Now()
	s.mu.Unlock()
}

// eligible reports whether a spare pool may serve creates of template. It
// is on every claim's path: the backend's answer is remembered until the
// next refresh.
func (s *spares) eligible(template string) bool {
	s.mu.Lock()
	ok, known := s.public[template], false
	if !ok {
		ok, known = s.builtins[template]
	}
	s.mu.Unlock()
	if ok || known {
		return ok
	}
	ok = s.builtin(template)
	s.mu.Lock()
	if s.builtins == nil {
		s.builtins = map[string]bool{}
	}
	s.builtins[template] = ok
	s.mu.Unlock()
	return ok
}

// floor is the operator's floor for spare pool key: the SpareMin of its
// template, for the template's default shape only.
func (s *spares) floor(key pool.Key) int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	n := s.floors[key.Template]
	s.mu.Unlock()
	if n == 0 || key != s.key(key.Template) {
		return 0
	}
	return n
}

// seeds are the spare pools with a floor.
func (s *spares) seeds() []pool.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]pool.Key, 0, len(s.floors))
	for tmpl, n := range s.floors {
		if n > 0 {
			keys = append(keys, s.key(tmpl))
		}
	}
	return keys
}

// SpareKey is the spare pool that may serve claims of key (pool.Config's
// Spare): key without its tenant, when spare pools are on and key's
// template is public.
func (a *Admitter) SpareKey(key pool.Key) (pool.Key, bool) {
	if a.spare == nil || key.IsSpare() || !a.spare.eligible(key.Template) {
		return pool.Key{}, false
	}
	key.Tenant = ""
	return key, true
}

// spareResolver resolves a SpareMin reference as no tenant would: a
// public template's current build, or one of the backend's own templates.
func (m *Manager) spareResolver(ctx context.Context, ref string) (string, bool) {
	if m.cfg.Templates != nil {
		backend, ok, err := m.cfg.Templates.Resolve(ctx, "", ref)
		if err != nil {
			return "", false // not built yet, or failed: no spare members
		}
		if ok {
			return backend, true
		}
	}
	return ref, m.isBuiltin(ref)
}

// isBuiltin reports whether template is one of the backend's own (not a
// build), which every tenant may create.
func (m *Manager) isBuiltin(template string) bool {
	if _, built := m.templateConfig(template); built {
		return false
	}
	lister, ok := m.backend.(runtime.TemplateLister)
	if !ok {
		return true // a backend that cannot list runs what it is asked
	}
	names, err := lister.Templates(context.Background())
	return err == nil && slices.Contains(names, template)
}
