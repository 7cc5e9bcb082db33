package server

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/tenant"
)

// TestHostRoutingDomainWithPort: with `--domain HOST:PORT` (any listener not
// on 443) the SDKs send `Host: 49983-<id>.HOST:PORT`; that must reach the
// sandbox's envd, not sandboxd's own /health, and an unknown sandbox is the
// proxy's answer. The API's own host still serves sandboxd's /health.
func TestHostRoutingDomainWithPort(t *testing.T) {
	for _, domain := range []string{"localhost:3000", "sbx.localhost:8443", "sbx.localhost"} {
		t.Run(domain, func(t *testing.T) {
			e := newFakeEnv(t, func(c *Config) { c.Domain = domain })
			sb, err := e.mgr.Create(tenant.WithContext(context.Background(), "acme"), sandbox.CreateRequest{})
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				host string
				want int
			}{
				{"49983-" + sb.ID + "." + domain, http.StatusNoContent}, // envd's /health
				{"49983-nosuchsandbox." + domain, http.StatusBadGateway},
				{domain, http.StatusOK}, // sandboxd's /health
			} {
				req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/health", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Host = tc.host // *.localhost is loopback; the test server is too
				r, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(r.Body)
				r.Body.Close()
				if r.StatusCode != tc.want {
					t.Errorf("GET /health Host %s = %d %s; want %d", tc.host, r.StatusCode, b, tc.want)
				}
			}
		})
	}
}
