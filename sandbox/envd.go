package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/store"
)

// initEnvd hands a new sandbox its env vars, access token and default user.
// It is the control plane's only write to envd, over the backend's private
// channel (never through the public proxy, which refuses /init). A cold
// create hands the same body to the backend instead (runtime.Spec.EnvdInit),
// whose readiness probe can be this /init.
func (m *Manager) initEnvd(ctx context.Context, sb *store.Sandbox) error {
	raw, err := m.envdInitBody(sb)
	if err != nil {
		return err
	}
	// The last control request in a while: the connection a member's
	// health check left is used, and none is kept for a running sandbox.
	status, msg, err := m.envdAsk(ctx, sb.ID, http.MethodPost, "/init", raw, false)
	if err != nil {
		return err
	}
	if err := envdconn.Answered("/init", status, msg); err != nil {
		return err
	}
	m.uninit.forget(sb.ID) // a deferred one (claiminit.go) is done too
	return nil
}

// envdInitBody is the body of envd's /init for sb.
func (m *Manager) envdInitBody(sb *store.Sandbox) ([]byte, error) {
	body := envdapi.InitRequest{
		EnvVars:     sb.EnvVars,
		DefaultUser: m.cfg.DefaultUser,
		Timestamp:   m.now().UTC().Format(time.RFC3339Nano),
	}
	if te, ok := m.backend.(runtime.TemplateEnver); ok {
		if env := te.TemplateEnv(sb.Template); len(env) > 0 {
			merged := maps.Clone(env)
			maps.Copy(merged, body.EnvVars)
			body.EnvVars = merged
		}
	}
	if cfg, ok := m.templateConfig(sb.Template); ok {
		// The template's env is under the create's; its user and workdir
		// are the defaults of every process.
		env := maps.Clone(cfg.Env)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, sb.EnvVars)
		body.EnvVars = env
		body.DefaultUser = cmp.Or(cfg.User, body.DefaultUser)
		body.DefaultWorkdir = cfg.Workdir
	}
	if sb.EnvdAccessToken != "" {
		body.AccessToken = &sb.EnvdAccessToken
	}
	return json.Marshal(body)
}

// ForgetEnvd drops the connection kept to sandbox id's envd: for a warm
// member the pools destroyed (pool.Config.Destroyed), which the Manager
// does not see go.
func (m *Manager) ForgetEnvd(id string) { m.envd.Forget(id) }

// envdAsk makes one control request (GET /health, POST /init: requests
// that may be sent twice) to a sandbox's envd over the backend's channel.
// On a backend whose channel is runtime.LocalEnvdChannel it goes over the
// connection the sandbox's last request kept (m.envd), or a new one, and
// keep says whether to keep it for the next. The proxy pools its own
// connections for the API's traffic.
func (m *Manager) envdAsk(ctx context.Context, id, method, path string, body []byte, keep bool) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dial := func(ctx context.Context) (net.Conn, error) { return m.backend.Dial(ctx, id, runtime.EnvdPort) }
	switch {
	case !m.keepEnvd:
		return envdconn.Ask(ctx, dial, method, path, body)
	case keep:
		return m.envd.Ask(ctx, id, dial, method, path, body)
	default:
		return m.envd.AskLast(ctx, id, dial, method, path, body)
	}
}
