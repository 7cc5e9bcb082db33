package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/openapi/nativeapi"
)

type e2eChange struct {
	Path   string `json:"path"`
	Kind   string `json:"kind"`
	Type   string `json:"type"`
	Size   int64  `json:"size"`
	Opaque bool   `json:"opaque"`

	// With --local-track-writers.
	Writer *nativeapi.ChangeWriter `json:"writer"`
}

type e2eVersion struct {
	TemplateID string `json:"template_id"`
	Template   string `json:"template"`
	BuildID    string `json:"build_id"`
	Number     int    `json:"number"`
	Parent     string `json:"parent"`
	Sandbox    string `json:"sandbox"`
	Paths      int    `json:"paths"`
	Current    bool   `json:"current"`
}

func (s *e2eServer) native(t *testing.T, method, path, key string, body any) e2eResponse {
	t.Helper()
	return s.do(t, method, "/v1/sandboxes"+path, key, body)
}

// wantNativeError checks r is an error of the native API's shape with
// status want and returns its message.
func wantNativeError(t *testing.T, what string, r e2eResponse, want int) string {
	t.Helper()
	var eb struct {
		Error *struct {
			Code, Message string
		}
		RequestID string `json:"request_id"`
	}
	if r.status != want || json.Unmarshal(r.body, &eb) != nil || eb.Error == nil || eb.Error.Code == "" || eb.Error.Message == "" || eb.RequestID == "" {
		t.Errorf("%s: %s, want %d with the native error shape", what, r, want)
		return ""
	}
	return eb.Error.Message
}

func publish(t *testing.T, s *e2eServer, key, id string, body map[string]any) (e2eVersion, e2eResponse) {
	t.Helper()
	r := s.native(t, http.MethodPost, "/"+id+"/publish", key, body)
	var v e2eVersion
	if r.status == http.StatusCreated {
		if err := json.Unmarshal(r.body, &v); err != nil {
			t.Fatalf("publish: %v: %s", err, r)
		}
	}
	return v, r
}

// The worked example of the README: two agents start from one version of
// a project; the first publishes; the second's publish that touched the
// same file is rejected with the path, a third's on other files is merged
// in; two racing publishes of the same file: exactly one wins. Changes,
// the diff and the export show what each sandbox did; finalize ends it.
func TestWorkspaceE2E(t *testing.T) {
	e := newE2EEnv(t, "a", "b")
	e.serveArgs = append(e.serveArgs, "--local-track-writers")
	s := e.start()
	ka, kb := e.keys["a"], e.keys["b"]
	seed, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"timeout": 600})
	s.mustRun(t, seed.SandboxID, *seed.EnvdAccessToken, "mkdir -p ~/proj && printf 'line 1\\nline 2\\nline 3\\n' > ~/proj/app.txt")
	// Written by envd itself (PID 1, alive whenever the server looks):
	// its writer is certain, where a command's may have exited.
	s.writeFile(t, seed.SandboxID, *seed.EnvdAccessToken, "/home/user/proj/notes.txt", []byte("by upload\n"))

	t.Run("changes, diff, export", func(t *testing.T) {
		r := s.native(t, http.MethodGet, "/"+seed.SandboxID+"/changes", ka, nil)
		wantStatus(t, "changes", r, http.StatusOK)
		var cl struct{ Changes []e2eChange }
		e2eDecode(t, "changes", r, &cl)
		var paths []string
		for _, c := range cl.Changes {
			paths = append(paths, c.Kind+" "+c.Path)
		}
		for _, want := range []string{"added /home/user/proj", "added /home/user/proj/app.txt"} {
			if !slices.Contains(paths, want) {
				t.Errorf("changes %q lack %q", paths, want)
			}
		}
		// With --local-track-writers each change names its writer.
		for _, c := range cl.Changes {
			switch w := c.Writer; c.Path {
			case "/home/user/proj/notes.txt":
				if w == nil || w.Pid != 1 || w.Comm != "envd" || w.Command == nil || !strings.Contains(*w.Command, "envd") || w.EnvdPid != nil {
					t.Errorf("writer of notes.txt: %+v, want envd (pid 1)", w)
				}
			case "/home/user/proj/app.txt":
				// The command's shell, envd's command itself, unless it
				// was gone before the server looked (its argv, once it
				// had exited).
				if w != nil && (w.Comm != "sh" && w.Comm != "bash" || w.EnvdPid == nil || *w.EnvdPid != w.Pid || w.Pid <= 1) {
					t.Errorf("writer of app.txt: %+v, want the command's shell", w)
				}
			}
		}
		if out, errOut, err := cli(t, s.base, ka, "", "changes", seed.SandboxID); err != nil || !strings.Contains(out, `"writer": {`) || !strings.Contains(out, `"comm": "envd"`) {
			t.Errorf("sandboxd sandbox changes: %v %s\n%s", err, errOut, out)
		}
		// diff --writers: the same patch, a comment naming the writer
		// before a file's section.
		out, errOut, err := cli(t, s.base, ka, "", "diff", "--writers", seed.SandboxID)
		var plain []string
		for line := range strings.SplitAfterSeq(out, "\n") {
			if !strings.HasPrefix(line, "# writer of ") {
				plain = append(plain, line)
			}
		}
		if err != nil || !strings.Contains(out, "# writer of /home/user/proj/notes.txt: envd (pid 1): ") ||
			!strings.Contains(out, "\ndiff --git a/home/user/proj/notes.txt b/home/user/proj/notes.txt\n") ||
			strings.Join(plain, "") != string(s.native(t, http.MethodGet, "/"+seed.SandboxID+"/diff", ka, nil).body) {
			t.Errorf("sandboxd sandbox diff --writers: %v %s\n%s", err, errOut, out)
		}
		r = s.native(t, http.MethodGet, "/"+seed.SandboxID+"/diff", ka, nil)
		wantStatus(t, "diff", r, http.StatusOK)
		diffBody := r.body
		if d := string(r.body); !strings.Contains(d, "diff --git a/home/user/proj/app.txt b/home/user/proj/app.txt\nnew file mode 100644\n--- /dev/null\n+++ b/home/user/proj/app.txt\n@@ -0,0 +1,3 @@\n+line 1\n") {
			t.Errorf("diff:\n%s", d)
		}
		r = s.native(t, http.MethodGet, "/"+seed.SandboxID+"/export", ka, nil)
		wantStatus(t, "export", r, http.StatusOK)
		tr := tar.NewReader(bytes.NewReader(r.body))
		found := false
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Name == "home/user/proj/app.txt" {
				b, _ := io.ReadAll(tr)
				found = string(b) == "line 1\nline 2\nline 3\n" && h.Uid == 1000
			}
		}
		if !found {
			t.Errorf("the export lacks app.txt as written by user")
		}
		// git takes the patch: applied to an empty tree it makes the file.
		if git, err := exec.LookPath("git"); err == nil {
			dir := t.TempDir()
			patch := filepath.Join(t.TempDir(), "p.diff")
			_ = os.WriteFile(patch, diffBody, 0o644)
			if out, err := exec.Command(git, "-C", dir, "apply", patch).CombinedOutput(); err != nil {
				t.Errorf("git apply: %v: %s", err, out)
			} else if b, _ := os.ReadFile(filepath.Join(dir, "home/user/proj/app.txt")); string(b) != "line 1\nline 2\nline 3\n" {
				t.Errorf("git apply made %q", b)
			}
		}
		// The CLI says the same.
		if out, errOut, err := cli(t, s.base, ka, "", "diff", seed.SandboxID); err != nil || out != string(s.native(t, http.MethodGet, "/"+seed.SandboxID+"/diff", ka, nil).body) {
			t.Errorf("sandboxd sandbox diff: %v %s\n%s", err, errOut, out)
		}
		tarPath := filepath.Join(t.TempDir(), "changes.tar")
		if _, errOut, err := cli(t, s.base, ka, "", "export", "-o", tarPath, seed.SandboxID); err != nil {
			t.Errorf("sandboxd sandbox export: %v %s", err, errOut)
		} else if b, _ := os.ReadFile(tarPath); len(b) == 0 || !bytes.Contains(b, []byte("line 2\n")) {
			t.Errorf("the CLI's export (%d bytes) lacks app.txt", len(b))
		}
		for _, path := range []string{"/changes", "/diff", "/export"} {
			wantStatus(t, "b's "+path, s.native(t, http.MethodGet, "/"+seed.SandboxID+path, kb, nil), http.StatusNotFound)
		}
	})

	// Version 1 of "proj": the seed's changes on base.
	if _, r := publish(t, s, ka, seed.SandboxID, map[string]any{}); r.status != http.StatusBadRequest {
		t.Errorf("publish of a base sandbox without a template name: %s, want 400", r)
	}
	v1, r := publish(t, s, ka, seed.SandboxID, map[string]any{"template": "proj", "finalize": true})
	wantStatus(t, "publish v1", r, http.StatusCreated)
	if v1.Number != 1 || !v1.Current || v1.Template != "proj" || v1.Sandbox != seed.SandboxID {
		t.Errorf("v1 = %+v", v1)
	}
	if r := s.api(t, http.MethodGet, "/sandboxes/"+seed.SandboxID, ka, nil); r.status != http.StatusNotFound {
		t.Errorf("the finalized seed: %s, want gone", r)
	}

	agent := func(script string) e2eSandbox {
		sb, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": "proj", "timeout": 600})
		s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, script)
		return sb
	}
	first := agent("sed -i 's/line 2/line 2 by first/' ~/proj/app.txt && echo a > ~/proj/a.txt")
	second := agent("echo 'line 4 by second' >> ~/proj/app.txt")
	third := agent("echo b > ~/proj/b.txt && rm ~/proj/app.txt && echo again > ~/proj/app.txt")

	v2, r := publish(t, s, ka, first.SandboxID, nil)
	wantStatus(t, "first's publish", r, http.StatusCreated)
	if v2.Number != 2 || v2.Parent != v1.BuildID {
		t.Errorf("v2 = %+v, want number 2 from v1 %s", v2, v1.BuildID)
	}
	_, r = publish(t, s, ka, second.SandboxID, nil)
	msg := wantNativeError(t, "second's stale publish", r, http.StatusConflict)
	var eb struct {
		Error struct{ Conflicts []string }
	}
	_ = json.Unmarshal(r.body, &eb)
	if !slices.Equal(eb.Error.Conflicts, []string{"/home/user/proj/app.txt"}) || !strings.Contains(msg, "app.txt") {
		t.Errorf("conflict: %q %v, want app.txt listed", msg, eb.Error.Conflicts)
	}
	_, r = publish(t, s, ka, third.SandboxID, nil)
	wantNativeError(t, "third's publish (it rewrote app.txt too)", r, http.StatusConflict)

	fourth := agent("echo b > ~/proj/b.txt")
	v3, r := publish(t, s, ka, fourth.SandboxID, nil)
	wantStatus(t, "a publish of other files from v1, after v2", r, http.StatusCreated)
	if v3.Number != 3 || v3.Parent != v2.BuildID {
		t.Errorf("v3 = %+v, want from v2", v3)
	}
	fresh := agent("true")
	out := s.mustRun(t, fresh.SandboxID, *fresh.EnvdAccessToken, "cd ~/proj && cat app.txt a.txt b.txt").stdout
	if out != "line 1\nline 2 by first\nline 3\na\nb\n" {
		t.Errorf("a new sandbox of proj sees %q, want v1 + the first's and fourth's changes", out)
	}
	if got := s.mustRun(t, second.SandboxID, *second.EnvdAccessToken, "cat ~/proj/a.txt 2>&1 || true").stdout; !strings.Contains(got, "No such file") {
		t.Errorf("a running sandbox changed with a publish: %q", got)
	}

	r = s.native(t, http.MethodGet, "/"+fresh.SandboxID+"/versions", ka, nil)
	wantStatus(t, "versions", r, http.StatusOK)
	var vl struct {
		Versions    []e2eVersion
		StartedFrom string `json:"started_from"`
	}
	e2eDecode(t, "versions", r, &vl)
	if len(vl.Versions) != 3 || vl.Versions[0].BuildID != v3.BuildID || !vl.Versions[0].Current || vl.StartedFrom != v3.BuildID {
		t.Errorf("versions = %+v", vl)
	}

	// Racing publishes of the same file from the same version.
	racers := []e2eSandbox{agent("echo r1 > ~/proj/race.txt"), agent("echo r2 > ~/proj/race.txt")}
	codes := make([]int, len(racers))
	var wg sync.WaitGroup
	for i, sb := range racers {
		wg.Go(func() {
			r, err := s.tryDo(http.MethodPost, "/v1/sandboxes/"+sb.SandboxID+"/publish", ka, map[string]any{}, nil)
			if err == nil {
				codes[i] = r.status
			}
		})
	}
	wg.Wait()
	slices.Sort(codes)
	if !slices.Equal(codes, []int{http.StatusCreated, http.StatusConflict}) {
		t.Errorf("racing publishes answered %v, want one 201 and one 409", codes)
	}

	t.Run("refusals", func(t *testing.T) {
		_, r := publish(t, s, kb, fresh.SandboxID, nil)
		wantStatus(t, "b publishes a's sandbox", r, http.StatusNotFound)
		_, r = publish(t, s, ka, fresh.SandboxID, nil)
		wantNativeError(t, "a publish without changes", r, http.StatusBadRequest)
		wantStatus(t, "pause", s.api(t, http.MethodPost, "/sandboxes/"+second.SandboxID+"/pause", ka, map[string]any{}), http.StatusNoContent)
		_, r = publish(t, s, ka, second.SandboxID, nil)
		wantNativeError(t, "a publish of a paused sandbox", r, http.StatusConflict)
	})
}

// seedTemplate makes version 1 of template name: what script wrote in a
// sandbox of base, published with finalize.
func seedTemplate(t *testing.T, e *e2eEnv, key, name, script string) e2eVersion {
	t.Helper()
	seed, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 600})
	e.current().mustRun(t, seed.SandboxID, *seed.EnvdAccessToken, script)
	v, r := publish(t, e.current(), key, seed.SandboxID, map[string]any{"template": name, "finalize": true})
	wantStatus(t, "publish version 1 of "+name, r, http.StatusCreated)
	return v
}

// e2eLayers lists the publish and snapshot layers on the host.
func (e *e2eEnv) e2eLayers() []string {
	var out []string
	for _, root := range []string{e.runDir, e.dataDir} {
		m, _ := filepath.Glob(filepath.Join(root, "templates", "layers", "*snap-*"))
		out = append(out, m...)
	}
	slices.Sort(out)
	return out
}

// versionIDs lists the build ids of the versions sandbox id's template
// has, newest first.
func versionIDs(t *testing.T, s *e2eServer, key, id string) []string {
	t.Helper()
	r := s.native(t, http.MethodGet, "/"+id+"/versions", key, nil)
	wantStatus(t, "versions", r, http.StatusOK)
	var vl struct{ Versions []e2eVersion }
	e2eDecode(t, "versions", r, &vl)
	var out []string
	for _, v := range vl.Versions {
		out = append(out, v.BuildID)
	}
	return out
}

// Faults of a publish: over the server's limits (set low here), from a
// killed sandbox and from a paused one, each refused with the status the
// native API documents and a body saying why, and none leaving a version
// or a layer behind.
func TestWorkspaceFaultsE2E(t *testing.T) {
	e := newE2EEnv(t, "a")
	e.serveArgs = append(e.serveArgs, "--max-publish-paths=5", "--max-publish-mb=1")
	s := e.start()
	ka := e.keys["a"]
	v1 := seedTemplate(t, e, ka, "lim", "mkdir ~/proj && echo 1 > ~/proj/one.txt")
	agent := func(script string) e2eSandbox {
		sb, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": "lim", "timeout": 600})
		s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, script)
		return sb
	}
	watch := agent("true")
	layers := e.e2eLayers()
	nothingMade := func(t *testing.T, what string) {
		t.Helper()
		if got := versionIDs(t, s, ka, watch.SandboxID); !slices.Equal(got, []string{v1.BuildID}) {
			t.Errorf("versions after %s: %v, want v1 %s alone", what, got, v1.BuildID)
		}
		if got := e.e2eLayers(); !slices.Equal(got, layers) {
			t.Errorf("layers after %s: %v, want %v", what, got, layers)
		}
	}

	for _, tc := range []struct {
		name, script, want string
	}{
		{"paths", "cd ~/proj && for i in 1 2 3 4 5 6; do echo $i > f$i; done", "at most 5 paths (--max-publish-paths)"},
		{"bytes", "head -c 1048577 /dev/zero > ~/proj/big", "at most 1 MiB (--max-publish-mb)"},
	} {
		t.Run("over the "+tc.name+" limit", func(t *testing.T) {
			sb := agent(tc.script)
			_, r := publish(t, s, ka, sb.SandboxID, nil)
			if msg := wantNativeError(t, "publish", r, http.StatusBadRequest); !strings.Contains(msg, tc.want) {
				t.Errorf("publish over the %s limit: %q does not name it (%q)", tc.name, msg, tc.want)
			}
			nothingMade(t, "a publish over the "+tc.name+" limit")
		})
	}

	t.Run("killed", func(t *testing.T) {
		sb := agent("echo k > ~/proj/k.txt")
		wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, ka, nil), http.StatusNoContent)
		_, r := publish(t, s, ka, sb.SandboxID, nil)
		if msg := wantNativeError(t, "publish of a killed sandbox", r, http.StatusNotFound); !strings.Contains(msg, sb.SandboxID) {
			t.Errorf("publish of a killed sandbox: %q does not name it", msg)
		}
		for _, path := range []string{"/changes", "/diff", "/export", "/versions"} {
			wantNativeError(t, path+" of a killed sandbox", s.native(t, http.MethodGet, "/"+sb.SandboxID+path, ka, nil), http.StatusNotFound)
		}
		nothingMade(t, "a publish of a killed sandbox")
	})

	t.Run("paused", func(t *testing.T) {
		for _, memory := range []bool{true, false} {
			sb := agent("echo p > ~/proj/p.txt")
			wantStatus(t, "pause", s.api(t, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", ka, map[string]any{"memory": memory}), http.StatusNoContent)
			// What it changed can still be read, from its saved layer.
			r := s.native(t, http.MethodGet, "/"+sb.SandboxID+"/changes", ka, nil)
			wantStatus(t, "changes of a paused sandbox", r, http.StatusOK)
			if !strings.Contains(string(r.body), `"/home/user/proj/p.txt"`) {
				t.Errorf("changes of a paused sandbox (memory=%v): %s", memory, r.body)
			}
			r = s.native(t, http.MethodGet, "/"+sb.SandboxID+"/diff", ka, nil)
			if wantStatus(t, "diff of a paused sandbox", r, http.StatusOK); !strings.Contains(string(r.body), "+p\n") {
				t.Errorf("diff of a paused sandbox (memory=%v): %s", memory, r.body)
			}
			r = s.native(t, http.MethodGet, "/"+sb.SandboxID+"/export", ka, nil)
			if wantStatus(t, "export of a paused sandbox", r, http.StatusOK); !bytes.Contains(r.body, []byte("home/user/proj/p.txt")) {
				t.Errorf("export of a paused sandbox (memory=%v) lacks p.txt (%d bytes)", memory, len(r.body))
			}
			_, r = publish(t, s, ka, sb.SandboxID, map[string]any{"finalize": true})
			if msg := wantNativeError(t, "publish of a paused sandbox", r, http.StatusConflict); !strings.Contains(msg, "paused") {
				t.Errorf("publish of a paused sandbox (memory=%v): %q does not say it is paused", memory, msg)
			}
			nothingMade(t, "a publish of a paused sandbox")
			// Not finalized: it resumes with its work.
			wantStatus(t, "resume", s.api(t, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/connect", ka, map[string]any{"timeout": 600}), http.StatusCreated)
			s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "grep -qx p ~/proj/p.txt")
		}
	})

	// Exactly at both limits: 5 paths, 1 MiB.
	sb := agent("head -c 1048568 /dev/zero > ~/proj/big && for i in 1 2 3 4; do echo $i > ~/proj/g$i; done")
	if v, r := publish(t, s, ka, sb.SandboxID, nil); r.status != http.StatusCreated || v.Paths != 5 {
		t.Errorf("a publish at the limits: %s, want version 2 of 5 paths", r)
	}
}

// The real default path limit: 100,001 files are refused, naming it.
func TestWorkspacePathLimitE2E(t *testing.T) {
	e := newE2EEnv(t, "a")
	s := e.start()
	ka := e.keys["a"]
	sb, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"timeout": 600, "memoryMB": 2048, "diskSizeMB": 2048})
	s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "mkdir ~/many && cd ~/many && i=0; while [ $i -le 100000 ]; do : > f$i; i=$((i+1)); done")
	_, r := publish(t, s, ka, sb.SandboxID, map[string]any{"template": "many"})
	if msg := wantNativeError(t, "a publish of 100,001 files", r, http.StatusBadRequest); !strings.Contains(msg, "at most 100000 paths") {
		t.Errorf("publish of 100,001 files: %q does not name the limit", msg)
	}
	if got := e.e2eLayers(); len(got) > 0 {
		t.Errorf("layers after a refused publish: %v", got)
	}
	if r := s.api(t, http.MethodGet, "/templates/aliases/many", ka, nil); r.status != http.StatusNotFound {
		t.Errorf("the template of a refused publish: %s, want 404", r)
	}
}

// SIGKILL during the publish of version 2 of a template: once sandboxd is
// back the template has version 1 alone and no layer of the cut publish,
// new sandboxes start from version 1, and the same publish then makes
// version 2.
func TestPublishCrashE2E(t *testing.T) {
	e := newE2EEnv(t, "a")
	s := e.start()
	ka := e.keys["a"]
	v1 := seedTemplate(t, e, ka, "crash", "echo v1 > ~/version")
	kept := e.e2eLayers()
	if len(kept) != 1 {
		t.Fatalf("layers after v1: %v, want one", kept)
	}
	src, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": "crash", "timeout": 600, "memoryMB": 2048, "diskSizeMB": 2048})
	tok := *src.EnvdAccessToken
	// Enough files that the copy takes a while: many small ones.
	s.mustRun(t, src.SandboxID, tok, "echo v2 > ~/version && mkdir ~/many && cd ~/many && for i in $(seq 1 20000); do echo $i > f$i; done")
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.tryDo(http.MethodPost, "/v1/sandboxes/"+src.SandboxID+"/publish", ka, map[string]any{}, nil)
	}()
	e2eEventually(t, "the publish copying", time.Minute, time.Millisecond, func() (bool, string) {
		return len(e.e2eLayers()) > len(kept), ""
	})
	if err := s.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	s = e.start()
	if got := versionIDs(t, s, ka, src.SandboxID); !slices.Equal(got, []string{v1.BuildID}) {
		t.Errorf("versions after a crash mid-publish: %v, want v1 %s alone", got, v1.BuildID)
	}
	if got := e.e2eLayers(); !slices.Equal(got, kept) {
		t.Errorf("layers after a crash mid-publish: %v, want v1's %v", got, kept)
	}
	fresh, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": "crash", "timeout": 600})
	if out := s.mustRun(t, fresh.SandboxID, *fresh.EnvdAccessToken, "cat ~/version; test -e ~/many && echo many; true").stdout; out != "v1\n" {
		t.Errorf("a new sandbox after the crash sees %q, want v1's files alone", out)
	}
	s.mustRun(t, src.SandboxID, tok, "test -f ~/many/f20000")
	v2, r := publish(t, s, ka, src.SandboxID, nil)
	wantStatus(t, "the publish again", r, http.StatusCreated)
	if v2.Number != 2 || v2.Parent != v1.BuildID || !v2.Current {
		t.Errorf("the publish again made %+v, want version 2 from v1 %s", v2, v1.BuildID)
	}
	newer, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": "crash", "timeout": 600})
	if out := s.mustRun(t, newer.SandboxID, *newer.EnvdAccessToken, "cat ~/version; test -f ~/many/f20000 && echo many").stdout; out != "v2\nmany\n" {
		t.Errorf("a new sandbox of version 2 sees %q", out)
	}
}

// sandboxdClient runs `sandboxd sandbox ARGS...` (the binary) against s as
// key and returns its output and exit code.
func sandboxdClient(t *testing.T, s *e2eServer, key string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	full := append([]string{"sandbox", args[0], "--url", s.base, "--token", key}, args[1:]...)
	cmd := exec.CommandContext(t.Context(), filepath.Join(e2eBinDir, "sandboxd"), full...)
	cmd.Env = e2eSandboxdEnviron()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("sandboxd %s: %v", strings.Join(full, " "), err)
	}
	return out.String(), errOut.String(), code
}

// The workspace commands of the CLI, run as a user runs them, against a
// real server: what each prints and its exit status, a stale publish's
// conflict and a missing sandbox being failures that say why.
func TestWorkspaceCLIE2E(t *testing.T) {
	e := newE2EEnv(t, "a")
	s := e.start()
	ka := e.keys["a"]
	seed, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"timeout": 600})
	s.mustRun(t, seed.SandboxID, *seed.EnvdAccessToken, "mkdir ~/proj && printf 'one\\n' > ~/proj/app.txt")
	run := func(want int, args ...string) (string, string) {
		t.Helper()
		out, errOut, code := sandboxdClient(t, s, ka, args...)
		if code != want {
			t.Errorf("sandboxd sandbox %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out, errOut)
		}
		return out, errOut
	}
	var ch struct{ Changes []e2eChange }
	if out, _ := run(0, "changes", seed.SandboxID); json.Unmarshal([]byte(out), &ch) != nil || !slices.ContainsFunc(ch.Changes, func(c e2eChange) bool {
		return c.Path == "/home/user/proj/app.txt" && c.Kind == "added" && c.Size == 4
	}) {
		t.Errorf("sandboxd sandbox changes printed %q, want app.txt added", out)
	}
	if out, _ := run(0, "diff", seed.SandboxID); !strings.Contains(out, "+++ b/home/user/proj/app.txt\n@@ -0,0 +1 @@\n+one\n") {
		t.Errorf("sandboxd sandbox diff printed %q", out)
	}
	tarPath := filepath.Join(t.TempDir(), "seed.tar")
	if out, _ := run(0, "export", "-o", tarPath, seed.SandboxID); out != "" {
		t.Errorf("sandboxd sandbox export -o printed %q, want nothing", out)
	}
	if names := tarNames(t, tarPath); !slices.Contains(names, "home/user/proj/app.txt") {
		t.Errorf("the exported tar holds %v, want app.txt", names)
	}
	var v1 e2eVersion
	if out, _ := run(0, "publish", "--template", "cli", "--finalize", seed.SandboxID); json.Unmarshal([]byte(out), &v1) != nil || v1.Number != 1 || v1.Template != "cli" {
		t.Errorf("sandboxd sandbox publish printed %q, want version 1 of cli", out)
	}
	if _, errOut := run(1, "changes", seed.SandboxID); !strings.Contains(errOut, "not found") {
		t.Errorf("changes of the finalized seed: stderr %q, want not found", errOut)
	}

	agents := make([]e2eSandbox, 2)
	for i := range agents {
		agents[i], _ = e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": "cli", "timeout": 600})
		s.mustRun(t, agents[i].SandboxID, *agents[i].EnvdAccessToken, fmt.Sprintf("echo 'agent %d' >> ~/proj/app.txt", i))
	}
	var v2 e2eVersion
	if out, _ := run(0, "publish", agents[0].SandboxID); json.Unmarshal([]byte(out), &v2) != nil || v2.Number != 2 || v2.Parent != v1.BuildID {
		t.Errorf("the first agent's publish printed %q, want version 2 from %s", out, v1.BuildID)
	}
	if out, errOut := run(1, "publish", agents[1].SandboxID); out != "" || !strings.Contains(errOut, "conflict") || !strings.Contains(errOut, "/home/user/proj/app.txt") {
		t.Errorf("the stale publish: stdout %q stderr %q, want the conflict on app.txt", out, errOut)
	}
	var vl struct {
		Versions    []e2eVersion
		StartedFrom string `json:"started_from"`
	}
	if out, _ := run(0, "versions", agents[1].SandboxID); json.Unmarshal([]byte(out), &vl) != nil || len(vl.Versions) != 2 ||
		vl.Versions[0].BuildID != v2.BuildID || !vl.Versions[0].Current || vl.StartedFrom != v1.BuildID {
		t.Errorf("sandboxd sandbox versions printed %q, want v2 then v1, started from v1", out)
	}
	// The stale agent keeps its work: export it instead.
	tarPath = filepath.Join(t.TempDir(), "stale.tar")
	run(0, "export", "--finalize", "-o", tarPath, agents[1].SandboxID)
	if names := tarNames(t, tarPath); !slices.Contains(names, "home/user/proj/app.txt") {
		t.Errorf("the stale agent's export holds %v", names)
	}
	if r := s.api(t, http.MethodGet, "/sandboxes/"+agents[1].SandboxID, ka, nil); r.status != http.StatusNotFound {
		t.Errorf("after export --finalize: %s, want the sandbox gone", r)
	}
	for _, args := range [][]string{{"publish", "nosuchsandbox"}, {"diff", "nosuchsandbox"}, {"publish"}, {"versions", "a", "b"}} {
		if out, errOut := run(1, args...); out != "" || errOut == "" {
			t.Errorf("sandboxd sandbox %v: stdout %q stderr %q, want a message on stderr alone", args, out, errOut)
		}
	}
}

// tarNames lists the entries of the tar file at path.
func tarNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		names = append(names, h.Name)
	}
}

// Odd paths survive a publish: names with spaces, a newline, bytes that
// are not UTF-8, a leading dash, 255 bytes, a deep directory, a symlink,
// a hard link, a FIFO and an empty file; a new sandbox of the version sees
// the same tree, and the next version's deletion of an odd name holds.
func TestPublishOddPathsE2E(t *testing.T) {
	e := newE2EEnv(t, "a")
	s := e.start()
	ka := e.keys["a"]
	const (
		write = `mkdir ~/odd && cd ~/odd && echo s > 'with space' && echo n > "$(printf 'new\nline')" &&
echo x > "$(printf 'bad\377\376name')" && echo d > ./-dash && echo l > "$(printf '%0255d' 7)" &&
mkdir -p a/b/c/d/e/f/g/h && echo deep > a/b/c/d/e/f/g/h/leaf && ln -s 'with space' link && ln ./-dash hard &&
mkfifo fifo && : > empty && printf '\0\1\2' > bin`
		// The tree as find tells it (a directory's size is the file
		// system's, not the sandbox's), kept ASCII by od.
		list = `cd ~/odd && { find . -type d -printf '%y %m %p\n'; find . ! -type d -printf '%y %s %m %n %p -> %l\n'; } | LC_ALL=C sort | od -An -c; cat ./-dash ./hard a/b/c/d/e/f/g/h/leaf`
	)
	v1 := seedTemplate(t, e, ka, "odd", write)
	if v1.Paths < 14 {
		t.Errorf("v1 = %+v, want every odd path counted", v1)
	}
	seed, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"timeout": 600})
	want := s.mustRun(t, seed.SandboxID, *seed.EnvdAccessToken, write+" && "+list).stdout
	sb, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": "odd", "timeout": 600})
	if got := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, list).stdout; got != want {
		t.Errorf("a sandbox of the published version sees\n%s\nwant (what was written)\n%s", got, want)
	}
	s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, `cd ~/odd && rm "$(printf 'bad\377\376name')" "$(printf 'new\nline')" && rm -r a/b/c`)
	if _, r := publish(t, s, ka, sb.SandboxID, nil); r.status != http.StatusCreated {
		t.Fatalf("the deletion's publish: %s", r)
	}
	after, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": "odd", "timeout": 600})
	check := `cd ~/odd && for f in "$(printf 'bad\377\376name')" "$(printf 'new\nline')" a/b/c; do test -e "$f" && echo "left: $f"; done; test -d a/b && test -e ./-dash && echo kept`
	if out := s.mustRun(t, after.SandboxID, *after.EnvdAccessToken, check).stdout; out != "kept\n" {
		t.Errorf("after the deletion's version: %s", out)
	}
}
