package sandbox

import (
	"context"
	"net/url"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

// SignedFileSandbox finds the sandbox a pre-signed envd `/files` URL belongs
// to. E2B's uploadUrl/downloadUrl carry no sandbox id when every sandbox is
// served from one origin (E2B_SANDBOX_URL), but their signature is keyed by
// the sandbox's envd access token, so exactly one live sandbox verifies it.
// The scan costs one SHA-256 per live secure sandbox; envd verifies the
// signature again (and its expiry) when the request arrives.
func (m *Manager) SignedFileSandbox(ctx context.Context, q url.Values, op string) string {
	sig := q.Get("signature")
	if sig == "" {
		return ""
	}
	live, err := m.store.ListLive(ctx)
	if err != nil {
		m.log.Error("signed file route: list sandboxes", "err", err)
		return ""
	}
	now := m.now()
	for _, sb := range live {
		if sb.EnvdAccessToken == "" {
			continue
		}
		err := envdapi.VerifySignature(sig, q.Get("path"), op, q.Get("username"), sb.EnvdAccessToken, q.Get("signature_expiration"), now)
		if err == nil || err == envdapi.ErrExpiredSignature {
			// An expired signature still names its sandbox: envd answers
			// it with the proper 401.
			return sb.ID
		}
	}
	return ""
}
