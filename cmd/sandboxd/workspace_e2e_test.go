package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

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
