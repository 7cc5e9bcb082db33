package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/openapi/e2bapi"
	"github.com/sandboxd/sandboxd/tenant"
	"github.com/sandboxd/sandboxd/volume"
)

// dirVolumes is a runtime.VolumeStore of plain directories.
type dirVolumes struct{ dir string }

func (d dirVolumes) CreateVolume(_ context.Context, id string, _ int) error {
	return os.Mkdir(filepath.Join(d.dir, id), 0o755)
}
func (d dirVolumes) DeleteVolume(_ context.Context, id string) error {
	return os.RemoveAll(filepath.Join(d.dir, id))
}
func (d dirVolumes) OpenVolume(_ context.Context, id string) (*os.Root, error) {
	return os.OpenRoot(filepath.Join(d.dir, id))
}
func (d dirVolumes) Volumes(context.Context) ([]string, error) { return nil, nil }

func newVolumeEnv(t *testing.T) *fakeEnv {
	t.Helper()
	var vols *volume.Service
	e := newFakeEnv(t, func(c *Config) {
		vols = volume.New(c.Store, dirVolumes{t.TempDir()}, func(tenant.ID) tenant.VolumeBudget {
			return tenant.VolumeBudget{Max: 3, SizeMB: 64}
		}, slog.New(slog.DiscardHandler))
		c.Volumes = vols
		c.Domain = "sbx.test"
	})
	return e
}

// content calls the volume content API with token (e.do's API key, which
// these routes ignore, goes along).
func (e *fakeEnv) content(t *testing.T, method, path, token, body string, hdr map[string]string) (int, []byte) {
	t.Helper()
	h := map[string]string{"Authorization": "Bearer " + token}
	maps.Copy(h, hdr)
	r, b := e.do(t, method, path, body, h)
	return r.StatusCode, b
}

func TestE2BVolumes(t *testing.T) {
	e := newVolumeEnv(t)
	const api = E2BPrefix
	r, b := e.do(t, http.MethodPost, api+"/volumes", `{"name":"data"}`, nil)
	var v e2bapi.VolumeAndToken
	if r.StatusCode != http.StatusCreated || json.Unmarshal(b, &v) != nil || v.Token == "" {
		t.Fatalf("create = %d %s; want 201 with a token", r.StatusCode, b)
	}
	for _, tc := range []struct {
		name, method, path, body string
		want                     int
	}{
		{"taken name", http.MethodPost, "/volumes", `{"name":"data"}`, 400},
		{"bad name", http.MethodPost, "/volumes", `{"name":"a b"}`, 400},
		{"get", http.MethodGet, "/volumes/" + v.VolumeID, "", 200},
		{"get unknown", http.MethodGet, "/volumes/nope", "", 404},
		{"list", http.MethodGet, "/volumes", "", 200},
		{"mount over /etc", http.MethodPost, "/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"data","path":"/etc"}]}`, 400},
		{"mount unknown volume", http.MethodPost, "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"nope","path":"/mnt"}]}`, 400},
		{"relative mount", http.MethodPost, "/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"data","path":"mnt"}]}`, 400},
	} {
		r, b := e.do(t, tc.method, api+tc.path, tc.body, nil)
		var eb struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if r.StatusCode != tc.want {
			t.Errorf("%s: %s %s = %d %s; want %d", tc.name, tc.method, tc.path, r.StatusCode, b, tc.want)
		} else if tc.want >= 400 && (json.Unmarshal(b, &eb) != nil || eb.Code != tc.want || eb.Message == "") {
			t.Errorf("%s: body %s; want E2B's {code, message}", tc.name, b)
		}
	}

	// A sandbox with the volume reports its mounts, as E2B's detail does.
	r, b = e.do(t, http.MethodPost, api+"/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"data","path":"/mnt/data"}]}`, nil)
	var sb e2bapi.Sandbox
	if r.StatusCode != http.StatusCreated || json.Unmarshal(b, &sb) != nil {
		t.Fatalf("create with a volume = %d %s", r.StatusCode, b)
	}
	r, b = e.do(t, http.MethodGet, api+"/sandboxes/"+sb.SandboxID, "", nil)
	var d e2bapi.SandboxDetail
	if r.StatusCode != 200 || json.Unmarshal(b, &d) != nil || d.VolumeMounts == nil || len(*d.VolumeMounts) != 1 ||
		(*d.VolumeMounts)[0] != (e2bapi.SandboxVolumeMount{Name: "data", Path: "/mnt/data"}) {
		t.Errorf("GET sandbox = %d %s; want volumeMounts [{data /mnt/data}]", r.StatusCode, b)
	}
	if r, _ := e.do(t, http.MethodDelete, api+"/sandboxes/"+sb.SandboxID, "", nil); r.StatusCode != 204 {
		t.Fatalf("kill = %d", r.StatusCode)
	}

	c := api + "/volumecontent/" + v.VolumeID
	big := strings.Repeat("x", 2<<20) // above the JSON body bound
	for _, tc := range []struct {
		name, method, path, token, body string
		want                            int
		wantBody                        string
	}{
		{"no token", http.MethodGet, "/path?path=/", "", "", 401, ""},
		{"API key is no token", http.MethodGet, "/path?path=/", e.key, "", 401, ""},
		{"wrong token", http.MethodGet, "/path?path=/", v.Token + "0", "", 401, ""},
		{"write", http.MethodPut, "/file?path=/a/b.txt&force=true", v.Token, "hello", 201, `"size":5`},
		{"write existing without force", http.MethodPut, "/file?path=/a/b.txt", v.Token, "x", 409, ""},
		{"write 2 MiB", http.MethodPut, "/file?path=/big", v.Token, big, 201, `"size":2097152`},
		{"read", http.MethodGet, "/file?path=/a/b.txt", v.Token, "", 200, "hello"},
		{"read up and out", http.MethodGet, "/file?path=../../../etc/passwd", v.Token, "", 404, ""},
		{"stat", http.MethodGet, "/path?path=a", v.Token, "", 200, `"type":"directory"`},
		{"mkdir", http.MethodPost, "/dir?path=/d&mode=448", v.Token, "", 201, `"mode":448`},
		{"list", http.MethodGet, "/dir?path=/&depth=2", v.Token, "", 200, `"path":"/a/b.txt"`},
		{"chmod", http.MethodPatch, "/path?path=/big", v.Token, `{"mode":384}`, 200, `"mode":384`},
		{"remove", http.MethodDelete, "/path?path=/a", v.Token, "", 204, ""},
		{"removed", http.MethodGet, "/path?path=/a", v.Token, "", 404, ""},
		{"at the root too", http.MethodGet, "/path?path=/big", v.Token, "", 200, `"name":"big"`},
	} {
		p := c + tc.path
		if tc.name == "at the root too" {
			p = "/volumecontent/" + v.VolumeID + tc.path
		}
		status, body := e.content(t, tc.method, p, tc.token, tc.body, map[string]string{"Content-Type": "application/octet-stream"})
		if tc.method == http.MethodPatch {
			status, body = e.content(t, tc.method, p, tc.token, tc.body, map[string]string{"Content-Type": "application/json"})
		}
		if status != tc.want || !strings.Contains(string(body), tc.wantBody) {
			t.Errorf("%s: %s %s = %d %.200s; want %d with %q", tc.name, tc.method, tc.path, status, body, tc.want, tc.wantBody)
		}
	}

	// With --domain D, the SDKs' default content URL (https://api.D, when
	// E2B_VOLUME_API_URL is unset) reaches the content API at the root.
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/volumecontent/"+v.VolumeID+"/file?path=/big", nil)
	req.Host = "api.sbx.test"
	req.Header.Set("Authorization", "Bearer "+v.Token)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 || resp.ContentLength != 2<<20 {
		t.Errorf("GET file through Host api.sbx.test = %v, %v; want 200 with the 2 MiB file", resp, err)
	} else {
		resp.Body.Close()
	}

	// Another volume's token opens only that volume.
	r, b = e.do(t, http.MethodPost, api+"/volumes", `{"name":"other"}`, nil)
	var w e2bapi.VolumeAndToken
	if r.StatusCode != 201 || json.Unmarshal(b, &w) != nil {
		t.Fatalf("create other = %d %s", r.StatusCode, b)
	}
	if status, body := e.content(t, http.MethodGet, c+"/path?path=/", w.Token, "", nil); status != 401 {
		t.Errorf("another volume's token = %d %s; want 401", status, body)
	}
	// Another tenant sees nothing.
	if _, err := e.st.EnsureTenant(t.Context(), "other"); err != nil {
		t.Fatal(err)
	}
	key2, _, err := e.st.CreateKey(t.Context(), "other")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		if r, b := e.do(t, m, api+"/volumes/"+v.VolumeID, "", map[string]string{"X-API-KEY": key2}); r.StatusCode != 404 {
			t.Errorf("%s another tenant's volume = %d %s; want 404", m, r.StatusCode, b)
		}
	}
	if r, _ := e.do(t, http.MethodDelete, api+"/volumes/"+v.VolumeID, "", nil); r.StatusCode != 204 {
		t.Errorf("delete = %d; want 204", r.StatusCode)
	}
	if status, _ := e.content(t, http.MethodGet, c+"/path?path=/", v.Token, "", nil); status != 401 {
		t.Errorf("content of a deleted volume = %d; want 401", status)
	}
}
