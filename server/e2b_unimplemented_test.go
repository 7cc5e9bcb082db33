package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/tenant"
)

// TestE2BUnimplementedSandboxRoutes: a route a server cannot serve (here:
// snapshots without a template service, forks on a backend that cannot
// copy files) still answers 404 for a sandbox the caller cannot see
// (unknown, killed, another tenant's) before it answers 501, as E2B would;
// a fork says so per fork.
func TestE2BUnimplementedSandboxRoutes(t *testing.T) {
	e := newFakeEnv(t, nil)
	ctx := context.Background()
	if _, err := e.st.EnsureTenant(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	create := func(tn tenant.ID) string {
		sb, err := e.mgr.Create(tenant.WithContext(ctx, tn), sandbox.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return sb.ID
	}
	live, foreign, killed := create("acme"), create("other"), create("acme")
	if err := e.mgr.Kill(tenant.WithContext(ctx, "acme"), killed); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/sandboxes/%s/fork", "/sandboxes/%s/snapshots"} {
		for _, tc := range []struct {
			name, id string
			want     int
		}{
			{"live", live, http.StatusNotImplemented},
			{"another tenant's", foreign, http.StatusNotFound},
			{"killed", killed, http.StatusNotFound},
			{"unknown", "nosuchsandbox", http.StatusNotFound},
		} {
			p := fmt.Sprintf(path, tc.id)
			want, wantBody := tc.want, ""
			if tc.want == http.StatusNotImplemented && strings.HasSuffix(path, "/fork") {
				want, wantBody = http.StatusCreated, `"code":501`
			}
			if r, b := e.do(t, http.MethodPost, p, `{}`, map[string]string{"Content-Type": "application/json"}); r.StatusCode != want || !strings.Contains(string(b), wantBody) {
				t.Errorf("POST %s (%s) = %d %s; want %d %s", p, tc.name, r.StatusCode, b, want, wantBody)
			}
		}
	}
}
