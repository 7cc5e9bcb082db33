package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
)

// envdInit is POST /init's body, in E2B's field names.
type envdInit struct {
	EnvVars     map[string]string `json:"envVars,omitempty"`
	AccessToken *string           `json:"accessToken,omitempty"`
	DefaultUser string            `json:"defaultUser,omitempty"`
	Timestamp   string            `json:"timestamp"`
}

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
	resp, err := m.envdDo(ctx, sb.ID, http.MethodPost, "/init", raw)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("envd /init: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// envdInitBody is the body of envd's /init for sb.
func (m *Manager) envdInitBody(sb *store.Sandbox) ([]byte, error) {
	body := envdInit{
		EnvVars:     sb.EnvVars,
		DefaultUser: m.cfg.DefaultUser,
		Timestamp:   m.now().UTC().Format(time.RFC3339Nano),
	}
	if sb.EnvdAccessToken != "" {
		body.AccessToken = &sb.EnvdAccessToken
	}
	return json.Marshal(body)
}

// envdDo makes one request to a sandbox's envd over a fresh backend
// connection. It is for rare control calls; the proxy pools its own.
func (m *Manager) envdDo(ctx context.Context, id, method, path string, body []byte) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return m.backend.Dial(ctx, id, runtime.EnvdPort)
		},
		DisableKeepAlives: true,
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://envd"+path, bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
