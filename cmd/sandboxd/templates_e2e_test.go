package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxd/sandboxd/internal/testimage"
)

// The template build API end to end, as E2B's SDKs drive it: request a
// build, upload COPY files to the link handed out, start the build with its
// steps, poll status and logs, then create sandboxes from the template.

type e2eBuildStatus struct {
	TemplateID string `json:"templateID"`
	BuildID    string `json:"buildID"`
	Status     string `json:"status"`
	Logs       []string
	LogEntries []struct {
		Message string `json:"message"`
		Level   string `json:"level"`
	} `json:"logEntries"`
	Reason *struct {
		Message string `json:"message"`
		Step    string `json:"step"`
	} `json:"reason"`
}

type e2eBuild struct {
	TemplateID, BuildID string
}

// requestBuild is POST /v3/templates.
func requestBuild(t *testing.T, s *e2eServer, key, name string, tags []string) e2eBuild {
	t.Helper()
	body := map[string]any{"name": name}
	if tags != nil {
		body["tags"] = tags
	}
	r := s.api(t, http.MethodPost, "/v3/templates", key, body)
	wantStatus(t, "POST /v3/templates", r, http.StatusAccepted)
	wantKeys(t, "POST /v3/templates", r.body, "templateID", "buildID", "public", "names", "tags", "aliases")
	var b e2eBuild
	e2eDecode(t, "POST /v3/templates", r, &b)
	return b
}

// uploadFiles asks for the link of hash and PUTs archive to it unless the
// server has it; it reports whether it uploaded.
func uploadFiles(t *testing.T, s *e2eServer, key, templateID, hash string, archive []byte) bool {
	t.Helper()
	r := s.api(t, http.MethodGet, "/templates/"+templateID+"/files/"+hash, key, nil)
	wantStatus(t, "GET files link", r, http.StatusCreated)
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	e2eDecode(t, "GET files link", r, &link)
	if link.Present {
		return false
	}
	req, err := http.NewRequest(http.MethodPut, link.URL, bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT %s: %v", link.URL, err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT upload: %d %s", resp.StatusCode, msg)
	}
	return true
}

// startBuild posts the steps and waits for the build to finish.
func startBuild(t *testing.T, s *e2eServer, key string, b e2eBuild, spec map[string]any) e2eBuildStatus {
	t.Helper()
	r := s.api(t, http.MethodPost, "/v2/templates/"+b.TemplateID+"/builds/"+b.BuildID, key, spec)
	wantStatus(t, "start build", r, http.StatusAccepted)
	if r.header.Get("Content-Length") != "0" {
		t.Errorf("start build: Content-Length %q, want 0 (the JS SDK parses an empty chunked body as JSON)", r.header.Get("Content-Length"))
	}
	return waitBuild(t, s, key, b)
}

func waitBuild(t *testing.T, s *e2eServer, key string, b e2eBuild) e2eBuildStatus {
	t.Helper()
	var st e2eBuildStatus
	var all []string
	e2eEventually(t, "build "+b.BuildID, 5*time.Minute, 100*time.Millisecond, func() (bool, string) {
		r := s.api(t, http.MethodGet, fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", b.TemplateID, b.BuildID, len(all)), key, nil)
		wantStatus(t, "build status", r, http.StatusOK)
		wantKeys(t, "build status", r.body, "logs", "logEntries", "status")
		st = e2eBuildStatus{}
		e2eDecode(t, "build status", r, &st)
		for _, e := range st.LogEntries {
			all = append(all, e.Message)
		}
		return st.Status == "ready" || st.Status == "error", st.Status
	})
	st.Logs = all
	return st
}

func tarGz(t *testing.T, files map[string]string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, data := range files {
		if strings.HasSuffix(name, "/") {
			_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755})
			continue
		}
		_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))})
		_, _ = tw.Write([]byte(data))
	}
	_ = tw.Close()
	_ = zw.Close()
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:])
}

func logsContain(st e2eBuildStatus, sub string) bool {
	for _, l := range st.Logs {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

// webappSpec is a build from the base template with every kind of step,
// COPY taking the archive of hash, and a start and a ready command.
func webappSpec(hash string) map[string]any {
	return map[string]any{
		"fromImage": "e2bdev/base",
		"steps": []map[string]any{
			{"type": "ENV", "args": []string{"GREETING", "hi there"}},
			{"type": "WORKDIR", "args": []string{"/home/user/app"}},
			{"type": "COPY", "args": []string{"app", "./", "", ""}, "filesHash": hash},
			{"type": "RUN", "args": []string{"echo \"$GREETING\" > built.txt && id -un >> built.txt"}},
			{"type": "RUN", "args": []string{"touch /opt/by-root", "root"}},
		},
		"startCmd": "sleep 1; echo up > /tmp/started; sleep 100000",
		"readyCmd": "test -f /tmp/started",
	}
}

func TestTemplateBuildE2E(t *testing.T) {
	e := newE2EEnv(t, "a", "b")
	s := e.start()
	ka, kb := e.keys["a"], e.keys["b"]

	archive, hash := tarGz(t, map[string]string{"app/": "", "app/hello.txt": "hello from COPY\n"})
	b := requestBuild(t, s, ka, "webapp", []string{"v1"})
	if !uploadFiles(t, s, ka, b.TemplateID, hash, archive) {
		t.Fatal("a fresh hash is present before any upload")
	}
	if uploadFiles(t, s, ka, b.TemplateID, hash, archive) {
		t.Error("an uploaded hash is not reported present")
	}
	spec := webappSpec(hash)
	st := startBuild(t, s, ka, b, spec)
	if st.Status != "ready" {
		t.Fatalf("build: %s, reason %+v, logs %q", st.Status, st.Reason, st.Logs)
	}
	for _, want := range []string{"[1/5] ENV", "[3/5] COPY", "[4/5] RUN", "Template is ready"} {
		if !logsContain(st, want) {
			t.Errorf("build logs lack %q: %q", want, st.Logs)
		}
	}

	// A sandbox of the template, by name, name:tag and id: the build's files,
	// env, workdir and user; its start command already ready.
	for _, ref := range []string{"webapp", "webapp:v1", b.TemplateID} {
		sb, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": ref, "secure": true})
		tok := *sb.EnvdAccessToken
		out := s.mustRun(t, sb.SandboxID, tok, "cat /home/user/app/built.txt /home/user/app/hello.txt; pwd; stat -c %U /opt/by-root; cat /tmp/started; echo $GREETING")
		want := "hi there\nuser\nhello from COPY\n/home/user/app\nroot\nup\nhi there\n"
		if out.stdout != want {
			t.Errorf("sandbox of %q: got %q, want %q", ref, out.stdout, want)
		}
	}

	// Claims made the template a warm pool: its members ran the start
	// command before any claim, so a warm sandbox is ready when handed out.
	e2eEventually(t, "a ready warm member of the template", time.Minute, 100*time.Millisecond, func() (bool, string) {
		r := s.do(t, http.MethodGet, "/metrics", "", nil)
		want := `sandboxd_pool_members{state="ready",template="` + b.BuildID + `",tenant="a"}`
		for _, l := range strings.Split(string(r.body), "\n") {
			if strings.HasPrefix(l, want+" ") && !strings.HasSuffix(l, " 0") {
				return true, l
			}
		}
		return false, "no ready member yet"
	})
	warm, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "webapp", "secure": true})
	if out := s.mustRun(t, warm.SandboxID, *warm.EnvdAccessToken, "cat /tmp/started; echo $GREETING"); out.stdout != "up\nhi there\n" {
		t.Errorf("warm sandbox of the template: %q", out.stdout)
	}
	servedFrom := ""
	for _, l := range s.logLines() {
		if l["action"] == "create" && l["sandbox_id"] == warm.SandboxID {
			servedFrom = fmt.Sprint(l["served_from"])
		}
	}
	if servedFrom != "pool" {
		t.Errorf("the create after the pool filled was served from %q, want pool", servedFrom)
	}

	// The same steps again: every layer is a cache hit.
	b2 := requestBuild(t, s, ka, "webapp", nil)
	uploadFiles(t, s, ka, b2.TemplateID, hash, archive)
	st = startBuild(t, s, ka, b2, spec)
	if st.Status != "ready" {
		t.Fatalf("rebuild: %s, reason %+v", st.Status, st.Reason)
	}
	for _, want := range []string{"CACHED [3/5] COPY", "CACHED [4/5] RUN", "CACHED [5/5] RUN"} {
		if !logsContain(st, want) {
			t.Errorf("rebuild logs lack %q: %q", want, st.Logs)
		}
	}

	// Another tenant sees none of it.
	if r := s.api(t, http.MethodGet, "/templates/aliases/webapp", kb, nil); r.status != http.StatusNotFound {
		t.Errorf("tenant b: alias of a's template: %s, want 404", r)
	}
	r := s.api(t, http.MethodPost, "/sandboxes", kb, map[string]any{"templateID": "webapp"})
	if r.status/100 != 4 {
		t.Errorf("tenant b: create from a's template: %s, want 4xx", r)
	}
	if r := s.api(t, http.MethodGet, "/templates/aliases/webapp", ka, nil); r.status != http.StatusOK {
		t.Errorf("tenant a: alias: %s", r)
	}

	// A failing step fails the build with its command, code and output.
	bf := requestBuild(t, s, ka, "broken", nil)
	st = startBuild(t, s, ka, bf, map[string]any{"steps": []map[string]any{
		{"type": "RUN", "args": []string{"echo ok"}},
		{"type": "RUN", "args": []string{"echo doomed >&2; exit 3"}},
	}})
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "2" ||
		!strings.Contains(st.Reason.Message, "exit code 3") || !strings.Contains(st.Reason.Message, "doomed") {
		t.Errorf("failing build: %s %+v", st.Status, st.Reason)
	}
	r = s.api(t, http.MethodPost, "/sandboxes", ka, map[string]any{"templateID": "broken"})
	if r.status != http.StatusBadRequest {
		t.Errorf("create from a template without a ready build: %s, want 400", r)
	}

	// A COPY of files never uploaded fails the build, not the server.
	bm := requestBuild(t, s, ka, "missing-files", nil)
	st = startBuild(t, s, ka, bm, map[string]any{"steps": []map[string]any{
		{"type": "COPY", "args": []string{"x", "/tmp/x"}, "filesHash": strings.Repeat("ab", 32)},
	}})
	if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "never uploaded") {
		t.Errorf("COPY of missing files: %s %+v", st.Status, st.Reason)
	}

	// Bad requests are 4xx before anything starts.
	for _, tc := range []struct {
		what string
		body map[string]any
	}{
		{"unknown step", map[string]any{"steps": []map[string]any{{"type": "FROB"}}}},
		{"both bases", map[string]any{"fromImage": "x", "fromTemplate": "y"}},
		{"COPY without hash", map[string]any{"steps": []map[string]any{{"type": "COPY", "args": []string{"a", "b"}}}}},
	} {
		bb := requestBuild(t, s, ka, "bad-"+e2eRandHex(3), nil)
		r := s.api(t, http.MethodPost, "/v2/templates/"+bb.TemplateID+"/builds/"+bb.BuildID, ka, tc.body)
		wantError(t, tc.what, r, http.StatusBadRequest)
	}
	wantError(t, "built-in name", s.api(t, http.MethodPost, "/v3/templates", ka, map[string]any{"name": "base"}), http.StatusConflict)

	// Tags: a new tag on v1's build; delete it again.
	r = s.api(t, http.MethodPost, "/templates/tags", ka, map[string]any{"target": "webapp:v1", "tags": []string{"stable"}})
	wantStatus(t, "assign tags", r, http.StatusCreated)
	r = s.api(t, http.MethodGet, "/templates/"+b.TemplateID+"/tags", ka, nil)
	wantStatus(t, "list tags", r, http.StatusOK)
	if !strings.Contains(string(r.body), `"stable"`) || !strings.Contains(string(r.body), `"v1"`) {
		t.Errorf("tags: %s", r)
	}
	e.create(t, "/sandboxes", ka, map[string]any{"templateID": "webapp:stable"})
	r = s.api(t, http.MethodDelete, "/templates/tags", ka, map[string]any{"name": "webapp", "tags": []string{"stable"}})
	wantStatus(t, "delete tags", r, http.StatusNoContent)
	r = s.api(t, http.MethodPost, "/sandboxes", ka, map[string]any{"templateID": "webapp:stable"})
	if r.status/100 != 4 {
		t.Errorf("create from a deleted tag: %s", r)
	}

	// Public: tenant b may use it once a makes it so.
	r = s.api(t, http.MethodPatch, "/v2/templates/"+b.TemplateID, ka, map[string]any{"public": true})
	wantStatus(t, "publish", r, http.StatusOK)
	e.create(t, "/sandboxes", kb, map[string]any{"templateID": "webapp"})
	wantError(t, "delete another tenant's template", s.api(t, http.MethodDelete, "/templates/"+b.TemplateID, kb, nil), http.StatusForbidden)

	// GET /v2/templates pages through what GET /templates lists.
	var whole []map[string]any
	e2eDecode(t, "GET /templates", s.api(t, http.MethodGet, "/templates", ka, nil), &whole)
	var paged []map[string]any
	for next, pages := "", 0; pages == 0 || next != ""; pages++ {
		r := s.api(t, http.MethodGet, "/v2/templates?limit=2&nextToken="+next, ka, nil)
		wantStatus(t, "GET /v2/templates", r, http.StatusOK)
		var page []map[string]any
		e2eDecode(t, "GET /v2/templates", r, &page)
		paged = append(paged, page...)
		next = r.header.Get("X-Next-Token")
		if pages > len(whole) {
			t.Fatal("GET /v2/templates does not end")
		}
	}
	if len(paged) != len(whole) || len(whole) < 3 {
		t.Errorf("GET /v2/templates paged %d templates, GET /templates lists %d", len(paged), len(whole))
	}

	// Deleting a template leaves its running sandboxes alone.
	keep, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "webapp", "secure": true})
	r = s.api(t, http.MethodDelete, "/templates/"+b.TemplateID, ka, nil)
	wantStatus(t, "delete template", r, http.StatusNoContent)
	out := s.mustRun(t, keep.SandboxID, *keep.EnvdAccessToken, "cat /home/user/app/hello.txt")
	if out.stdout != "hello from COPY\n" {
		t.Errorf("sandbox of a deleted template: %q", out.stdout)
	}
	if r := s.api(t, http.MethodGet, "/templates/aliases/webapp", ka, nil); r.status != http.StatusNotFound {
		t.Errorf("alias of a deleted template: %s", r)
	}
}

// testRegistry serves images on loopback, behind basic auth when user is
// set.
func testRegistry(t *testing.T, user, pass string) string {
	t.Helper()
	srv := httptest.NewServer(testimage.Registry(user, pass))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u.Host
}

func pushImage(t *testing.T, host, repo, user, pass string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(host+"/"+repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	opts := []remote.Option{}
	if user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: user, Password: pass}))
	}
	if err := remote.Write(ref, img, opts...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref.String()
}

func TestTemplateFromRegistryE2E(t *testing.T) {
	open := testRegistry(t, "", "")
	private := testRegistry(t, "builder", "s3cret")
	img, err := testimage.Busybox()
	if err != nil {
		t.Fatal(err)
	}
	pub := pushImage(t, open, "test/busybox:1", "", "", img)
	priv := pushImage(t, private, "team/busybox:1", "builder", "s3cret", img)

	e := newE2EEnv(t, "a")
	e.serveArgs = append(e.serveArgs, "--plain-http-registries="+open+","+private)
	s := e.start()
	ka := e.keys["a"]

	b := requestBuild(t, s, ka, "bb", nil)
	st := startBuild(t, s, ka, b, map[string]any{
		"fromImage": pub,
		"steps": []map[string]any{
			{"type": "RUN", "args": []string{"echo \"$FROM_IMAGE\" > /home/user/from.txt"}},
		},
	})
	if st.Status != "ready" {
		t.Fatalf("build from %s: %s %+v %q", pub, st.Status, st.Reason, st.Logs)
	}
	sb, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "bb", "secure": true})
	out := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "cat /home/user/from.txt; id -un; echo $FROM_IMAGE")
	if out.stdout != "yes\nuser\nyes\n" {
		t.Errorf("sandbox of an image template: %q", out.stdout)
	}

	// With credentials; without them the build fails saying why.
	for _, tc := range []struct {
		what string
		reg  map[string]any
		ok   bool
	}{
		{"right credentials", map[string]any{"type": "registry", "username": "builder", "password": "s3cret"}, true},
		{"wrong credentials", map[string]any{"type": "registry", "username": "builder", "password": "nope"}, false},
	} {
		b := requestBuild(t, s, ka, "private-"+e2eRandHex(3), nil)
		st := startBuild(t, s, ka, b, map[string]any{"fromImage": priv, "fromImageRegistry": tc.reg})
		if tc.ok && st.Status != "ready" {
			t.Errorf("%s: %s %+v", tc.what, st.Status, st.Reason)
		}
		if !tc.ok && (st.Status != "error" || st.Reason == nil || st.Reason.Step != "base" || !strings.Contains(st.Reason.Message, "refused")) {
			t.Errorf("%s: %s %+v", tc.what, st.Status, st.Reason)
		}
	}
	b = requestBuild(t, s, ka, "nosuch", nil)
	st = startBuild(t, s, ka, b, map[string]any{"fromImage": open + "/no/such:image"})
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "base" {
		t.Errorf("missing image: %s %+v", st.Status, st.Reason)
	}
}

// A sandboxd stopped mid-build (SIGTERM) fails the build and removes its
// build sandbox before it exits; one killed (SIGKILL) fails it at its next
// start, whose reconcile removes the build sandbox. Killed just after a
// step's layer is committed, or an image's imported (a fault-injection
// build stops there: the windows are milliseconds), the layer is already
// named by the build's record, so the template's delete removes it. The
// env's cleanup checks that no sandbox is left on the host either way.
func TestTemplateBuildCrashE2E(t *testing.T) {
	parent, faultBin := t, ""
	for _, tc := range []struct {
		name      string
		sig       syscall.Signal
		point     string // a faultinject pause point to kill sandboxd at
		fromImage bool   // the build starts from an image in a registry
		want      string
	}{
		{"terminated", syscall.SIGTERM, "", false, "sandboxd stopped during the build"},
		{"killed", syscall.SIGKILL, "", false, "sandboxd restarted during the build"},
		{"killed-at-commit", syscall.SIGKILL, "template-layer-committed", false, "sandboxd restarted during the build"},
		{"killed-at-import", syscall.SIGKILL, "template-image-imported", true, "sandboxd restarted during the build"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newE2EEnv(t, "a")
			marker := filepath.Join(t.TempDir(), "paused")
			if tc.point != "" {
				if faultBin == "" {
					faultBin = buildFaultSandboxd(parent) // outlives this subtest
				}
				e.launch = e2eLaunch{bin: faultBin, env: []string{"SANDBOXD_FAULT_PAUSE=" + tc.point + ":" + marker}}
			}
			spec := map[string]any{
				"steps": []map[string]any{
					{"type": "RUN", "args": []string{"echo first > /home/user/first.txt"}},
					{"type": "RUN", "args": []string{"touch /tmp/running; sleep 600"}},
				},
			}
			if tc.fromImage {
				img, err := testimage.Busybox()
				if err != nil {
					t.Fatal(err)
				}
				reg := testRegistry(t, "", "")
				spec["fromImage"] = pushImage(t, reg, "test/busybox:1", "", "", img)
				e.serveArgs = append(e.serveArgs, "--plain-http-registries="+reg)
			}
			s := e.start()
			ka := e.keys["a"]
			b := requestBuild(t, s, ka, "slow", nil)
			r := s.api(t, http.MethodPost, "/v2/templates/"+b.TemplateID+"/builds/"+b.BuildID, ka, spec)
			wantStatus(t, "start build", r, http.StatusAccepted)
			if tc.point != "" {
				e2eEventually(t, "sandboxd stopped at "+tc.point, time.Minute, 10*time.Millisecond, func() (bool, string) {
					return e2eExists(marker), ""
				})
			} else {
				// The first step's layer made, the second step's sandbox up.
				e2eEventually(t, "the build sandbox running", time.Minute, 50*time.Millisecond, func() (bool, string) {
					r := s.api(t, http.MethodGet, "/templates/"+b.TemplateID+"/builds/"+b.BuildID+"/status", ka, nil)
					ents, _ := os.ReadDir(filepath.Join(e.runDir, "sandboxes"))
					for _, ent := range ents {
						if strings.HasPrefix(ent.Name(), "bld-") && strings.Contains(string(r.body), `"building"`) && len(e.templateLayers()) > 0 {
							return true, ""
						}
					}
					return false, string(r.body)
				})
			}
			if err := s.stop(tc.sig); err != nil {
				t.Fatal(err)
			}
			if tc.sig == syscall.SIGTERM {
				if left := e.leaks(); len(left) > 0 {
					t.Errorf("after SIGTERM mid-build, left on the host: %v", left)
				}
			}
			e.launch = e2eLaunch{}
			s = e.start()
			st := waitBuild(t, s, ka, b)
			if st.Status != "error" || st.Reason == nil || st.Reason.Message != tc.want {
				t.Errorf("build across %s: %s %+v, want %q", tc.sig, st.Status, st.Reason, tc.want)
			}
			if r := s.api(t, http.MethodGet, "/templates/"+b.TemplateID, ka, nil); r.status != http.StatusOK {
				t.Errorf("template after %s: %s", tc.sig, r)
			}
			// The first step's layer stayed, the cache of the next build,
			// and goes with the template.
			if len(e.templateLayers()) == 0 {
				t.Errorf("the first step's layer is gone after %s", tc.sig)
			}
			wantStatus(t, "delete template", s.api(t, http.MethodDelete, "/templates/"+b.TemplateID, ka, nil), http.StatusNoContent)
			e2eEventually(t, "the failed build's layers removed", time.Minute, 100*time.Millisecond, func() (bool, string) {
				l := e.templateLayers()
				return len(l) == 0, fmt.Sprint(l)
			})
		})
	}
}

// A tenant's build limits hold: a step over the build memory is killed and
// fails its build, a build over its time fails saying so, and another
// tenant's builds keep the server's limits.
func TestTemplateBuildLimitsE2E(t *testing.T) {
	e := newE2EEnv(t, "small", "big")
	e.sandboxdCLI(t, "tenants", "set", "small", "--data-dir", e.dataDir,
		"--build-memory-mb", "64", "--build-disk-mb", "64", "--build-timeout-s", "3")
	s := e.start()
	// 400 MiB touched, by base's python3: over the
	// small tenant's 64 MiB (plus its 64 MiB disk, which the local backend
	// charges to the same cgroup), under the server's 2 GiB.
	hog := `python3 -c 'b = bytearray(400 << 20); b[::4096] = b"x" * len(b[::4096]); print("held")'`
	for _, tc := range []struct {
		tenant, cmd, want string
	}{
		{"small", hog, "exit code"},
		{"small", "sleep 30", "took longer than its limit of 3s"},
		{"big", hog, ""},
	} {
		key := e.keys[tc.tenant]
		b := requestBuild(t, s, key, "limits-"+e2eRandHex(3), nil)
		st := startBuild(t, s, key, b, map[string]any{"steps": []map[string]any{{"type": "RUN", "args": []string{tc.cmd}}}})
		switch {
		case tc.want == "" && st.Status != "ready":
			t.Errorf("%s: %q: %s %+v", tc.tenant, tc.cmd, st.Status, st.Reason)
		case tc.want != "" && (st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, tc.want)):
			t.Errorf("%s: %q: %s %+v, want a failure with %q", tc.tenant, tc.cmd, st.Status, st.Reason, tc.want)
		}
	}
}

// A --template image's ENV reaches every process of its sandboxes, under
// the create's own env vars, as a built template's does.
func TestTemplateFlagImageEnvE2E(t *testing.T) {
	img, err := testimage.Busybox() // ENV PATH=/bin FROM_IMAGE=yes
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "bb.tar")
	ref, _ := name.ParseReference("bb:1")
	if err := tarball.WriteToFile(tarPath, ref, img); err != nil {
		t.Fatal(err)
	}
	e := newE2EEnv(t, "a")
	e.serveArgs = []string{"--template", "bb=" + tarPath}
	s := e.start()
	ka := e.keys["a"]
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "yes /bin\n"},
		{map[string]string{"FROM_IMAGE": "mine"}, "mine /bin\n"},
	} {
		sb, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "bb", "secure": true, "envVars": tc.env})
		if out := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, `echo "$FROM_IMAGE $PATH"`); out.stdout != tc.want {
			t.Errorf("create env %v: %q, want %q", tc.env, out.stdout, tc.want)
		}
	}
}

// A template from an image made of Debian packages (scripts/incus-setup.sh's
// tarball of the base root filesystem: Python, Node, iproute2 …), pulled from a
// registry on loopback: the Python and Node toolchains work in its build
// steps, in its start command (a server the ready command waits for with
// ss, as the SDKs' waitForPort does) and in its sandboxes.
func TestTemplateFromDebianImageE2E(t *testing.T) {
	if _, err := testimage.DebianTarball(testimage.DebianCache); errors.Is(err, fs.ErrNotExist) && os.Getenv("CI") != "true" {
		t.Skip(err) // CI runs incus-setup.sh first, which builds it
	}
	e := newE2EEnv(t, "a")
	reg := debianRegistry(t)
	ref := reg + "/sandboxd-test/debian:bookworm" // compat-tests/registry's DebianRepo
	e.serveArgs = append(e.serveArgs, "--plain-http-registries="+reg)
	s := e.start()
	ka := e.keys["a"]

	archive, hash := tarGz(t, map[string]string{
		"app/":         "",
		"app/hello.py": "import json, sys\nprint(json.dumps({'py': sys.version_info[0]}))\n",
		"app/hello.js": "console.log(JSON.stringify({node: Number(process.versions.node.split('.')[0]) > 0}))\n",
	})
	b := requestBuild(t, s, ka, "debian-tools", nil)
	uploadFiles(t, s, ka, b.TemplateID, hash, archive)
	st := startBuild(t, s, ka, b, map[string]any{
		"fromImage": ref,
		"steps": []map[string]any{
			{"type": "WORKDIR", "args": []string{"/home/user/app"}},
			{"type": "COPY", "args": []string{"app", "./", "", ""}, "filesHash": hash},
			{"type": "RUN", "args": []string{"python3 -m venv /home/user/venv && /home/user/venv/bin/python hello.py > py.txt"}},
			{"type": "RUN", "args": []string{"node hello.js > node.txt"}},
		},
		"startCmd": "python3 -m http.server 8000 --bind 127.0.0.1",
		"readyCmd": `[ -n "$(ss -Htln sport = :8000)" ]`,
	})
	if st.Status != "ready" {
		t.Fatalf("build from %s: %s %+v %q", ref, st.Status, st.Reason, st.Logs)
	}
	sb, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "debian-tools", "secure": true})
	out := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken,
		`cat py.txt node.txt; id -un; node -e 'console.log(1+1)'; /home/user/venv/bin/python -c 'print(6*7)'; ss -Htln sport = :8000 | wc -l`)
	want := "{\"py\": 3}\n{\"node\":true}\nuser\n2\n42\n1\n"
	if out.stdout != want {
		t.Errorf("sandbox of the Debian template: %q, want %q", out.stdout, want)
	}
}

// debianRegistry starts compat-tests/registry with the Debian test image
// (--debian) and returns its address. A process of its own, built without
// -race: in the -race test binary, making and pushing the image's 0.8 GiB
// took most of the test's 337 s (now ≈ 105 s).
func debianRegistry(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "registry")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/sandboxd/sandboxd/compat-tests/registry").CombinedOutput(); err != nil {
		t.Fatalf("build compat-tests/registry: %v\n%s", err, out)
	}
	logPath := filepath.Join(dir, "registry.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--open", "127.0.0.1:0", "--private", "", "--debian")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	var addr string
	e2eEventually(t, "compat-tests/registry --debian is ready", 5*time.Minute, 100*time.Millisecond, func() (bool, string) {
		b, _ := os.ReadFile(logPath)
		select {
		case <-exited:
			t.Fatalf("compat-tests/registry exited:\n%s", b)
		default:
		}
		for line := range strings.Lines(string(b)) {
			if a, ok := strings.CutPrefix(strings.TrimSpace(line), "registry "); ok {
				addr = a
			}
		}
		return addr != "" && strings.Contains(string(b), "\nready\n"), string(b)
	})
	return addr
}

// TestTemplateLayersCollectedE2E: a template deleted while a sandbox of it
// runs keeps its layers, and the sandbox its root; once the sandbox is
// gone, a later collection removes them, and those a failed build of it
// made: in the same sandboxd, or in the next one after a SIGKILL (the
// removal was queued in the store).
func TestTemplateLayersCollectedE2E(t *testing.T) {
	for _, crash := range []bool{false, true} {
		name := "same sandboxd"
		if crash {
			name = "after SIGKILL"
		}
		t.Run(name, func(t *testing.T) {
			e := newE2EEnv(t, "a")
			e.serveArgs = append(e.serveArgs, "--layer-collect-interval=200ms")
			s := e.start()
			ka := e.keys["a"]
			layers := e.templateLayers
			b := requestBuild(t, s, ka, "gone", nil)
			st := startBuild(t, s, ka, b, map[string]any{
				"steps": []map[string]any{{"type": "RUN", "args": []string{"echo built > /home/user/built.txt"}}},
			})
			if st.Status != "ready" {
				t.Fatalf("build: %s %+v %q", st.Status, st.Reason, st.Logs)
			}
			ready := layers()
			// A build that fails after a step of its own: that step's
			// layer stays, as the cache of the template's next build.
			b2 := requestBuild(t, s, ka, "gone", nil)
			st = startBuild(t, s, ka, b2, map[string]any{
				"steps": []map[string]any{
					{"type": "RUN", "args": []string{"echo again > /home/user/again.txt"}},
					{"type": "RUN", "args": []string{"exit 3"}},
				},
			})
			if st.Status != "error" {
				t.Fatalf("failing build: %s %+v", st.Status, st.Reason)
			}
			if built := layers(); len(built) <= len(ready) {
				t.Fatalf("layers of a ready and a failed build: %v; want more than the ready one's %v", built, ready)
			}
			sb, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "gone", "secure": true, "timeout": 600})
			wantStatus(t, "delete template", s.api(t, http.MethodDelete, "/templates/"+b.TemplateID, ka, nil), http.StatusNoContent)
			if crash {
				if err := s.stop(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				s = e.start()
			}
			// Collections come and go (every 200 ms): the sandbox's root
			// stays whole.
			time.Sleep(time.Second)
			if out := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "cat built.txt"); out.stdout != "built\n" {
				t.Errorf("the sandbox of the deleted template: %q", out.stdout)
			}
			// The failed build's layer went with the delete; the
			// sandbox's stay.
			if got := layers(); !slices.Equal(got, ready) {
				t.Errorf("layers while a sandbox uses them: %v; want %v", got, ready)
			}
			wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, ka, nil), http.StatusNoContent)
			e2eEventually(t, "the deleted template's layers removed", time.Minute, 100*time.Millisecond, func() (bool, string) {
				l := layers()
				return len(l) == 0, fmt.Sprint(l)
			})
		})
	}
}

// templateLayers lists the local backend's template layers (of builds,
// images and snapshots), in its run dir and data dir.
func (e *e2eEnv) templateLayers() []string {
	var out []string
	for _, root := range []string{e.runDir, e.dataDir} {
		ents, _ := os.ReadDir(filepath.Join(root, "templates", "layers"))
		for _, ent := range ents {
			if !strings.HasPrefix(ent.Name(), ".") {
				out = append(out, ent.Name())
			}
		}
	}
	return out
}
