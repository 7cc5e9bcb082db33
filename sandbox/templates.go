package sandbox

import (
	"context"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/tenant"
)

// TemplateSource is where templates beyond the backend's own come from:
// those tenants build (package template). The Manager asks it which
// backend template a create runs and what that template's sandboxes start
// with.
type TemplateSource interface {
	// Resolve returns the backend template a create of tenant t naming
	// ref runs. ok is false when ref is none of the source's: the backend's
	// own templates are then looked up as before.
	Resolve(ctx context.Context, t tenant.ID, ref string) (backend string, ok bool, err error)
	// Config returns what sandboxes of backend template name start with;
	// ok is false for a template the source did not build.
	Config(name string) (TemplateConfig, bool)
}

// TemplateConfig is what a built template gives its sandboxes.
type TemplateConfig struct {
	// TemplateID and Alias are reported as the sandbox's templateID and
	// alias.
	TemplateID, Alias string
	// Resources are the template's defaults; zero fields fall back to the
	// Manager's.
	Resources runtime.Resources
	// Env is under the create's env vars; User and Workdir are envd's
	// defaults.
	Env           map[string]string
	User, Workdir string
	// StartCmd, when set, runs (as root, in Workdir) before the sandbox is
	// handed out, which happens once ReadyCmd succeeds (or StartCmd ends).
	StartCmd, ReadyCmd string
}
