package mcp_test

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/runtime/local"
)

type changeOut struct {
	Path       string `json:"path"`
	PathBase64 string `json:"path_base64"`
	Kind       string `json:"kind"`
	Type       string `json:"type"`
	Size       int64  `json:"size"`
	Opaque     bool   `json:"opaque"`
	// The tool's writer has the native API's shape.
	Writer *nativeapi.ChangeWriter `json:"writer"`
}

type changesOut struct {
	Changes          []changeOut `json:"changes"`
	WritersTruncated bool        `json:"writers_truncated"`
	Total            int         `json:"total"`
	Note             string      `json:"note"`
}

type exportOut struct {
	Format    string `json:"format"`
	Encoding  string `json:"encoding"`
	Content   string `json:"content"`
	Bytes     int    `json:"bytes"`
	Finalized bool   `json:"finalized"`
}

type versionsOut struct {
	StartedFrom string `json:"started_from"`
	Versions    []struct {
		Template string `json:"template"`
		Version  int    `json:"version"`
		BuildID  string `json:"build_id"`
		Parent   string `json:"parent"`
		Sandbox  string `json:"sandbox"`
		Paths    int    `json:"paths"`
		Current  bool   `json:"current"`
	} `json:"versions"`
}

type publishOut struct {
	Template string `json:"template"`
	Version  int    `json:"version"`
	BuildID  string `json:"build_id"`
	Paths    int    `json:"paths"`
}

// run runs script in sandbox id as user and fails the test unless it
// exits 0.
func run(t *testing.T, cs *sdk.ClientSession, id, user, script string) string {
	t.Helper()
	var x execOut
	mustCall(t, cs, "sandbox_exec", map[string]any{"sandbox_id": id, "command": script, "user": user}, &x)
	if x.ExitCode != 0 {
		t.Fatalf("%q: %+v", script, x)
	}
	return x.Stdout
}

// TestWorkspaceTools: the changes (with an opaque directory and a name
// that is not UTF-8), the diff, both exports and their limit, a publish,
// the template's versions, a conflict, and an export that finalizes.
func TestWorkspaceTools(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.session("acme", nil, full...)
	sb := e.create(cs, nil)
	id := map[string]any{"sandbox_id": sb.ID}

	run(t, cs, sb.ID, "user", `mkdir -p ~/proj && printf 'one\ntwo\n' > ~/proj/app.txt && touch "$HOME/$(printf 'bad\377')"`)
	// A directory of the template removed and made again: opaque.
	opq := run(t, cs, sb.ID, "root",
		`d=$(find /etc -mindepth 1 -maxdepth 1 -type d | sort | head -1) && rm -rf "$d" && mkdir "$d" && touch "$d/new" && printf %s "$d"`)

	var ch changesOut
	mustCall(t, cs, "sandbox_changes", id, &ch)
	type seen struct {
		kind, typ string
		size      int64
		opaque    bool
		raw       string
	}
	got := map[string]seen{}
	for _, c := range ch.Changes {
		raw := c.Path
		if c.PathBase64 != "" {
			b, err := base64.StdEncoding.DecodeString(c.PathBase64)
			if err != nil {
				t.Fatalf("path_base64 %q: %v", c.PathBase64, err)
			}
			raw = string(b)
		}
		got[raw] = seen{c.Kind, c.Type, c.Size, c.Opaque, c.Path}
	}
	for path, want := range map[string]seen{
		"/home/user/proj/app.txt": {"added", "file", 8, false, "/home/user/proj/app.txt"},
		"/home/user/bad\xff":      {"added", "file", 0, false, "/home/user/bad\uFFFD"},
		opq:                       {"modified", "dir", 0, true, opq},
		opq + "/new":              {"added", "file", 0, false, opq + "/new"},
	} {
		if g, ok := got[path]; !ok || g != want {
			t.Errorf("sandbox_changes: %q = %+v (listed %v), want %+v", path, g, ok, want)
		}
	}
	if ch.Total != len(ch.Changes) || ch.Note != "" {
		t.Errorf("sandbox_changes: total %d of %d listed, note %q", ch.Total, len(ch.Changes), ch.Note)
	}

	var d struct{ Patch string }
	mustCall(t, cs, "sandbox_diff", id, &d)
	hunk := "--- /dev/null\n+++ b/home/user/proj/app.txt\n@@ -0,0 +1,2 @@\n+one\n+two\n"
	if !strings.Contains(d.Patch, hunk) {
		t.Errorf("sandbox_diff: %q, want %q in it", d.Patch, hunk)
	}

	// The patch export is sandbox_diff's patch, whole.
	var x exportOut
	mustCall(t, cs, "sandbox_export", id, &x)
	if x.Format != "patch" || x.Encoding != "text" || x.Content != d.Patch || x.Bytes != len(d.Patch) || x.Finalized {
		t.Errorf("sandbox_export (patch): %+v, want the diff %q", x, d.Patch)
	}
	// The tar export is an OCI layer: the files, and the opaque marker.
	mustCall(t, cs, "sandbox_export", map[string]any{"sandbox_id": sb.ID, "format": "tar"}, &x)
	names := tarNames(t, x)
	for _, n := range []string{"home/user/proj/app.txt", "home/user/bad\xff", opq[1:] + "/.wh..wh..opq", opq[1:] + "/new"} {
		if !names[n] {
			t.Errorf("sandbox_export (tar): no %q in %v", n, names)
		}
	}
	if msg := call(t, cs, "sandbox_export", map[string]any{"sandbox_id": sb.ID, "format": "zip"}, nil); !strings.HasPrefix(msg, "invalid_argument:") {
		t.Errorf("sandbox_export as zip: %q", msg)
	}

	var vs versionsOut
	mustCall(t, cs, "template_versions", id, &vs)
	if vs.StartedFrom != "base" || len(vs.Versions) != 0 {
		t.Errorf("template_versions of a built-in template's sandbox: %+v", vs)
	}

	var p publishOut
	mustCall(t, cs, "sandbox_publish", map[string]any{"sandbox_id": sb.ID, "template": "mcp-proj"}, &p)
	if p.Template != "mcp-proj" || p.Version != 1 || p.BuildID == "" || p.Paths != len(ch.Changes) {
		t.Fatalf("sandbox_publish: %+v (%d changes)", p, len(ch.Changes))
	}

	// Two sandboxes of version 1 change the same file: the first
	// publishes version 2, the second is refused naming the path.
	a := e.create(cs, map[string]any{"template": "mcp-proj"})
	b := e.create(cs, map[string]any{"template": "mcp-proj"})
	if out := run(t, cs, a.ID, "user", "cat ~/proj/app.txt"); out != "one\ntwo\n" {
		t.Errorf("a sandbox of version 1 has app.txt %q", out)
	}
	mustCall(t, cs, "template_versions", map[string]any{"sandbox_id": a.ID}, &vs)
	if vs.StartedFrom != p.BuildID || len(vs.Versions) != 1 || vs.Versions[0].BuildID != p.BuildID ||
		vs.Versions[0].Version != 1 || !vs.Versions[0].Current || vs.Versions[0].Sandbox != sb.ID || vs.Versions[0].Template != "mcp-proj" {
		t.Errorf("template_versions after a publish: %+v", vs)
	}
	run(t, cs, a.ID, "user", "echo three >> ~/proj/app.txt")
	run(t, cs, b.ID, "user", "echo four >> ~/proj/app.txt")
	var p2 publishOut
	mustCall(t, cs, "sandbox_publish", map[string]any{"sandbox_id": a.ID}, &p2)
	if p2.Template != "mcp-proj" || p2.Version != 2 {
		t.Errorf("sandbox_publish of a sandbox of version 1: %+v", p2)
	}
	msg := call(t, cs, "sandbox_publish", map[string]any{"sandbox_id": b.ID}, nil)
	if !strings.HasPrefix(msg, "conflict: ") || !strings.HasSuffix(msg, ": /home/user/proj/app.txt") {
		t.Errorf("sandbox_publish over a newer version that changed the same file: %q", msg)
	}
	mustCall(t, cs, "template_versions", map[string]any{"sandbox_id": b.ID}, &vs)
	if vs.StartedFrom != p.BuildID || len(vs.Versions) != 2 || vs.Versions[0].BuildID != p2.BuildID || !vs.Versions[0].Current ||
		vs.Versions[0].Parent != p.BuildID || vs.Versions[1].Current {
		t.Errorf("template_versions after the second publish (newest first): %+v", vs)
	}

	// An export over the limit is refused and does not finalize; one
	// within it with finalize kills the sandbox.
	run(t, cs, b.ID, "user", "head -c 1100000 /dev/urandom > ~/big")
	msg = call(t, cs, "sandbox_export", map[string]any{"sandbox_id": b.ID, "format": "tar", "finalize": true}, nil)
	if !strings.HasPrefix(msg, "resource_exhausted: the tar is larger than 1048576 bytes") || !strings.Contains(msg, "/v1/sandboxes/"+b.ID+"/export") {
		t.Errorf("sandbox_export over the limit: %q", msg)
	}
	run(t, cs, b.ID, "user", "rm ~/big")
	mustCall(t, cs, "sandbox_export", map[string]any{"sandbox_id": b.ID, "finalize": true}, &x)
	if !x.Finalized || !strings.Contains(x.Content, "+four\n") {
		t.Errorf("sandbox_export with finalize: %+v", x)
	}
	if msg := call(t, cs, "sandbox_changes", map[string]any{"sandbox_id": b.ID}, nil); !strings.HasPrefix(msg, "not_found:") {
		t.Errorf("sandbox_changes after a finalizing export: %q, want not_found", msg)
	}
}

// tarNames are the entries of a tar export.
func tarNames(t *testing.T, x exportOut) map[string]bool {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(x.Content)
	if x.Format != "tar" || x.Encoding != "base64" || err != nil || len(raw) != x.Bytes {
		t.Fatalf("sandbox_export (tar): %s %s, %d bytes (%d decoded): %v", x.Format, x.Encoding, x.Bytes, len(raw), err)
	}
	names := map[string]bool{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatalf("sandbox_export (tar): %v", err)
		}
		names[h.Name] = true
	}
}

// workspaceCalls are the workspace tools with the scope each needs, and
// arguments naming sandbox id.
func workspaceCalls(id string) []struct {
	tool  string
	scope string
	args  map[string]any
} {
	return []struct {
		tool  string
		scope string
		args  map[string]any
	}{
		{"sandbox_changes", jwtauth.ScopeRead, map[string]any{"sandbox_id": id}},
		{"sandbox_diff", jwtauth.ScopeRead, map[string]any{"sandbox_id": id}},
		{"template_versions", jwtauth.ScopeRead, map[string]any{"sandbox_id": id}},
		{"sandbox_export", jwtauth.ScopeWrite, map[string]any{"sandbox_id": id, "finalize": true}},
		{"sandbox_export", jwtauth.ScopeWrite, map[string]any{"sandbox_id": id, "format": "tar", "finalize": true}},
		{"sandbox_publish", jwtauth.ScopeWrite, map[string]any{"sandbox_id": id, "template": "taken", "finalize": true}},
	}
}

// TestWorkspaceScopes: each workspace tool needs its scope, the native
// API's for the same route (changes, diff and versions read; export and
// publish write), and does nothing without it.
func TestWorkspaceScopes(t *testing.T) {
	e := newEnv(t, nil)
	full := e.session("acme", nil, full...)
	sb := e.create(full, nil)
	run(t, full, sb.ID, "user", "echo x > ~/f")
	sessions := map[string]*sdk.ClientSession{
		jwtauth.ScopeRead:  e.session("acme", nil, jwtauth.ScopeRead),
		jwtauth.ScopeWrite: e.session("acme", nil, jwtauth.ScopeWrite),
	}
	other := map[string]string{jwtauth.ScopeRead: jwtauth.ScopeWrite, jwtauth.ScopeWrite: jwtauth.ScopeRead}
	for _, c := range workspaceCalls(sb.ID) {
		if msg := call(t, sessions[other[c.scope]], c.tool, c.args, nil); msg != "permission_denied: missing scope "+c.scope {
			t.Errorf("%s%v with %s only: %q, want it refused", c.tool, c.args, other[c.scope], msg)
		}
	}
	// Nothing was published or finalized.
	var vs versionsOut
	mustCall(t, full, "template_versions", map[string]any{"sandbox_id": sb.ID}, &vs)
	if len(vs.Versions) != 0 {
		t.Errorf("a refused publish made a version: %+v", vs)
	}
	var ch changesOut
	mustCall(t, full, "sandbox_changes", map[string]any{"sandbox_id": sb.ID}, &ch)

	// With its scope alone, each read tool answers; the write tools are
	// checked with a call their scope admits and that changes nothing
	// (a publish of a built-in template's sandbox needs a template name).
	for _, c := range workspaceCalls(sb.ID) {
		if c.scope == jwtauth.ScopeRead {
			mustCall(t, sessions[c.scope], c.tool, c.args, nil)
		}
	}
	if msg := call(t, sessions[jwtauth.ScopeWrite], "sandbox_publish", map[string]any{"sandbox_id": sb.ID}, nil); !strings.HasPrefix(msg, "invalid_argument: the sandbox runs built-in template") {
		t.Errorf("sandbox_publish with sandboxes:write only: %q", msg)
	}
	var x exportOut
	mustCall(t, sessions[jwtauth.ScopeWrite], "sandbox_export", map[string]any{"sandbox_id": sb.ID}, &x)
	if !strings.Contains(x.Content, "+x\n") {
		t.Errorf("sandbox_export with sandboxes:write only: %+v", x)
	}
}

// TestWorkspaceTenantIsolation: another tenant's sandbox is, for every
// workspace tool, exactly what a missing one is, and the call does
// nothing to it.
func TestWorkspaceTenantIsolation(t *testing.T) {
	e := newEnv(t, nil)
	acme := e.session("acme", nil, full...)
	sb := e.create(acme, nil)
	run(t, acme, sb.ID, "user", "echo x > ~/f")

	other := e.session("other", nil, full...)
	const missing = "i0000000000000000000"
	absent := workspaceCalls(missing)
	for i, c := range workspaceCalls(sb.ID) {
		msg := call(t, other, c.tool, c.args, nil)
		want := strings.ReplaceAll(call(t, other, c.tool, absent[i].args, nil), missing, sb.ID)
		if !strings.HasPrefix(msg, "not_found:") || msg != want {
			t.Errorf("%s%v on another tenant's sandbox: %q, want %q (as for a missing one)", c.tool, c.args, msg, want)
		}
	}
	var vs versionsOut
	mustCall(t, acme, "template_versions", map[string]any{"sandbox_id": sb.ID}, &vs) // not finalized
	if len(vs.Versions) != 0 {
		t.Errorf("another tenant's publish made a version: %+v", vs)
	}
	var list struct{ Sandboxes []sandboxOut }
	mustCall(t, other, "sandbox_list", nil, &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("another tenant's publish made it a sandbox: %+v", list)
	}
}

// TestWorkspaceWriters: sandbox_changes names the process that wrote a
// path, where the backend records it (runtime/local's TestWriters has the
// cases): envd for a file written through sandbox_write_file (envd is
// always there to be looked at, where a command may have exited); none
// for a deletion.
func TestWorkspaceWriters(t *testing.T) {
	e := newEnv(t, nil)
	cs := e.session("acme", nil, full...)
	sb := e.create(cs, nil)
	if err := e.be.WriterTracking(); errors.Is(err, local.ErrWritersUnsupported) {
		t.Skipf("kernel refuses writer tracking: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	mustCall(t, cs, "sandbox_write_file", map[string]any{"sandbox_id": sb.ID, "path": "/home/user/notes.txt", "content": "x"}, nil)
	run(t, cs, sb.ID, "root", "rm /etc/hosts")

	var ch changesOut
	mustCall(t, cs, "sandbox_changes", map[string]any{"sandbox_id": sb.ID}, &ch)
	got := map[string]changeOut{}
	for _, c := range ch.Changes {
		got[c.Path] = c
	}
	if w := got["/home/user/notes.txt"].Writer; w == nil || w.Pid != 1 || w.Comm != "envd" || w.EnvdPid != nil {
		t.Errorf("writer of notes.txt: %+v, want envd (pid 1)", w)
	}
	if c := got["/etc/hosts"]; c.Kind != "deleted" || c.Writer != nil {
		t.Errorf("/etc/hosts: %+v, want deleted without a writer", c)
	}
	if ch.WritersTruncated {
		t.Errorf("writers_truncated on a record of a few paths")
	}
}
