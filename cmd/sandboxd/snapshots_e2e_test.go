package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

type e2eSnapshot struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

type e2eForkResult struct {
	Sandbox *e2eSandbox `json:"sandbox"`
	Error   *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func snapshot(t *testing.T, s *e2eServer, key, id string, body map[string]any) e2eSnapshot {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	r := s.api(t, http.MethodPost, "/sandboxes/"+id+"/snapshots", key, body)
	wantStatus(t, "snapshot "+id, r, http.StatusCreated)
	var snap e2eSnapshot
	e2eDecode(t, "snapshot", r, &snap)
	return snap
}

func listSnapshots(t *testing.T, s *e2eServer, key, query string) ([]e2eSnapshot, e2eResponse) {
	t.Helper()
	r := s.api(t, http.MethodGet, "/snapshots"+query, key, nil)
	wantStatus(t, "GET /snapshots"+query, r, http.StatusOK)
	var out []e2eSnapshot
	e2eDecode(t, "GET /snapshots", r, &out)
	return out, r
}

func snapshotIDs(l []e2eSnapshot) []string {
	var ids []string
	for _, s := range l {
		ids = append(ids, s.SnapshotID)
	}
	return ids
}

// A snapshot keeps a running sandbox's files (and its create's environment)
// as a template that sandboxes start from; a fork copies them into new
// sandboxes with the source's settings; both leave the source running and
// diverge from it; neither reaches another tenant's sandbox, nor a paused
// one; deleting a snapshot forgets it; nothing is left afterwards.
func TestSnapshotForkE2E(t *testing.T) {
	testSnapshotFork(t, newE2EEnv(t, "a", "b"))
}

// The same on Incus, where a snapshot is a layer image and a fork a copy
// of the source's instance; no layer image is left once the snapshots are
// deleted.
func TestIncusSnapshotForkE2E(t *testing.T) {
	e, c := newIncusE2EEnv(t, "a", "b")
	before := ownLayers(t, c)
	kept := testSnapshotFork(t, e)
	r := e.start().api(t, http.MethodDelete, "/templates/"+url.PathEscape(kept), e.keys["a"], nil)
	wantStatus(t, "delete the last snapshot", r, http.StatusNoContent)
	for name, key := range ownLayers(t, c) {
		if _, had := before[name]; !had {
			t.Errorf("layer %s (%s) left after the snapshots were deleted", key, name)
			_ = c.DeleteInstance(context.Background(), name)
		}
	}
}

// testSnapshotFork runs the checks on e, whose sandboxd it starts and stops,
// and returns the snapshot it keeps.
func testSnapshotFork(t *testing.T, e *e2eEnv) (kept string) {
	s := e.start()
	ka, kb := e.keys["a"], e.keys["b"]
	src, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{
		"timeout": 600, "envVars": map[string]string{"SBX_E": "from-create"}, "metadata": map[string]string{"purpose": "fork"},
	})
	tok := *src.EnvdAccessToken
	s.mustRun(t, src.SandboxID, tok, "echo one > ~/data && head -c 1048576 /dev/urandom > ~/blob && sha256sum ~/blob > ~/blob.sum")

	unnamed := snapshot(t, s, ka, src.SandboxID, nil)
	if !strings.HasSuffix(unnamed.SnapshotID, ":default") || len(unnamed.Names) != 0 {
		t.Errorf("unnamed snapshot = %+v, want <templateID>:default and no names", unnamed)
	}
	s.mustRun(t, src.SandboxID, tok, "echo two > ~/data")
	named := snapshot(t, s, ka, src.SandboxID, map[string]any{"name": "snap-a"})
	if named.SnapshotID != "snap-a:default" || !slices.Equal(named.Names, []string{"snap-a"}) {
		t.Errorf("named snapshot = %+v, want snap-a:default [snap-a]", named)
	}
	s.mustRun(t, src.SandboxID, tok, "echo three > ~/data")

	t.Run("other tenant", func(t *testing.T) {
		for _, path := range []string{"/sandboxes/" + src.SandboxID + "/snapshots", "/sandboxes/" + src.SandboxID + "/fork"} {
			wantError(t, "POST "+path+" as b", s.api(t, http.MethodPost, path, kb, map[string]any{}), http.StatusNotFound)
		}
		if l, _ := listSnapshots(t, s, kb, ""); len(l) != 0 {
			t.Errorf("b lists a's snapshots: %v", l)
		}
		r := s.api(t, http.MethodPost, "/v2/sandboxes", kb, map[string]any{"templateID": named.SnapshotID, "allow_internet_access": false})
		if r.status == http.StatusCreated {
			t.Errorf("b created a sandbox from a's snapshot: %s", r)
		}
	})

	t.Run("list", func(t *testing.T) {
		all, _ := listSnapshots(t, s, ka, "")
		if got, want := snapshotIDs(all), []string{named.SnapshotID, unnamed.SnapshotID}; !slices.Equal(got, want) {
			t.Errorf("snapshots = %v, want newest first %v", got, want)
		}
		if l, _ := listSnapshots(t, s, ka, "?sandboxID="+src.SandboxID); len(l) != 2 {
			t.Errorf("snapshots of the sandbox = %v", l)
		}
		if l, _ := listSnapshots(t, s, ka, "?sandboxID="+e2eMissingID()); len(l) != 0 {
			t.Errorf("snapshots of another sandbox = %v", l)
		}
		if l, _ := listSnapshots(t, s, ka, "?name=snap-a"); !slices.Equal(snapshotIDs(l), []string{named.SnapshotID}) {
			t.Errorf("snapshots named snap-a = %v", l)
		}
		first, r := listSnapshots(t, s, ka, "?limit=1")
		next := r.header.Get("X-Next-Token")
		if len(first) != 1 || next == "" {
			t.Fatalf("first page = %v, next %q", first, next)
		}
		second, r := listSnapshots(t, s, ka, "?limit=1&nextToken="+url.QueryEscape(next))
		if !slices.Equal(snapshotIDs(append(first, second...)), []string{named.SnapshotID, unnamed.SnapshotID}) || r.header.Get("X-Next-Token") != "" {
			t.Errorf("pages = %v + %v (next %q)", first, second, r.header.Get("X-Next-Token"))
		}
	})

	t.Run("create from snapshot", func(t *testing.T) {
		for _, tc := range []struct{ id, want string }{{unnamed.SnapshotID, "one"}, {named.SnapshotID, "two"}, {"snap-a", "two"}} {
			sb, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": tc.id})
			out := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "cat ~/data; sha256sum -c --quiet ~/blob.sum && echo blob-ok; echo $SBX_E; stat -c %U ~/data")
			if got := strings.TrimSpace(out.stdout); got != tc.want+"\nblob-ok\nfrom-create\nuser" {
				t.Errorf("sandbox from %s sees %q", tc.id, got)
			}
			if r := s.api(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, ka, nil); r.status != http.StatusNoContent {
				t.Errorf("kill: %s", r)
			}
		}
	})

	t.Run("fork", func(t *testing.T) {
		r := s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/fork", ka, map[string]any{"count": 2, "timeout": 120})
		wantStatus(t, "fork", r, http.StatusCreated)
		var forks []e2eForkResult
		e2eDecode(t, "fork", r, &forks)
		if len(forks) != 2 {
			t.Fatalf("fork answered %d results, want 2: %s", len(forks), r)
		}
		for i, f := range forks {
			if f.Sandbox == nil || f.Error != nil {
				t.Fatalf("fork %d: %s", i, r)
			}
			e.track(f.Sandbox.SandboxID, ka)
			if f.Sandbox.SandboxID == src.SandboxID || f.Sandbox.EnvdAccessToken == nil || *f.Sandbox.EnvdAccessToken == tok {
				t.Errorf("fork %d = %+v: want a new id and access token", i, f.Sandbox)
			}
			ftok := *f.Sandbox.EnvdAccessToken
			out := s.mustRun(t, f.Sandbox.SandboxID, ftok, "cat ~/data; sha256sum -c --quiet ~/blob.sum && echo blob-ok; echo $SBX_E")
			if got := strings.TrimSpace(out.stdout); got != "three\nblob-ok\nfrom-create" {
				t.Errorf("fork %d sees %q", i, got)
			}
			d := s.get(t, ka, f.Sandbox.SandboxID)
			if d.Metadata["purpose"] != "fork" {
				t.Errorf("fork %d metadata = %v, want the source's", i, d.Metadata)
			}
			if left := time.Until(d.EndAt); left > 125*time.Second || left < 60*time.Second {
				t.Errorf("fork %d ends in %v, want its own timeout of 120 s", i, left)
			}
			s.mustRun(t, f.Sandbox.SandboxID, ftok, "echo fork > ~/data")
		}
		if got := strings.TrimSpace(s.mustRun(t, src.SandboxID, tok, "cat ~/data").stdout); got != "three" {
			t.Errorf("source after its forks wrote: %q", got)
		}
		if d := s.get(t, ka, src.SandboxID); time.Until(d.EndAt) < 400*time.Second {
			t.Errorf("the source's timeout changed: ends in %v", time.Until(d.EndAt))
		}
		for _, body := range []map[string]any{{"count": 0}, {"count": 101}, {"timeout": -1}} {
			wantError(t, "fork with "+e2eJSON(body), s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/fork", ka, body), http.StatusBadRequest)
		}
	})

	t.Run("paused", func(t *testing.T) {
		wantStatus(t, "pause", s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/pause", ka, map[string]any{}), http.StatusNoContent)
		wantError(t, "snapshot of a paused sandbox", s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/snapshots", ka, map[string]any{}), http.StatusConflict)
		wantError(t, "fork of a paused sandbox", s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/fork", ka, map[string]any{}), http.StatusConflict)
	})

	t.Run("bad names", func(t *testing.T) {
		for _, name := range []string{"bad name", "base", "x:bad tag"} {
			r := s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/snapshots", ka, map[string]any{"name": name})
			if r.status != http.StatusBadRequest && r.status != http.StatusConflict {
				t.Errorf("snapshot named %q: %s, want 400 or 409", name, r)
			}
		}
	})

	t.Run("delete", func(t *testing.T) {
		r := s.api(t, http.MethodDelete, "/templates/"+url.PathEscape(named.SnapshotID), ka, nil)
		if r.status != http.StatusNoContent && r.status != http.StatusOK {
			t.Fatalf("delete snapshot: %s", r)
		}
		if l, _ := listSnapshots(t, s, ka, ""); !slices.Equal(snapshotIDs(l), []string{unnamed.SnapshotID}) {
			t.Errorf("snapshots after the delete = %v", l)
		}
		r = s.api(t, http.MethodPost, "/v2/sandboxes", ka, map[string]any{"templateID": named.SnapshotID, "allow_internet_access": false})
		if r.status == http.StatusCreated {
			t.Errorf("created a sandbox from a deleted snapshot: %s", r)
		}
		if r := s.api(t, http.MethodDelete, "/templates/"+url.PathEscape(named.SnapshotID), ka, nil); r.status != http.StatusNotFound {
			t.Errorf("delete a deleted snapshot: %s, want 404", r)
		}
	})

	e.killAll(s)
	if err := s.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if left := e.leaks(); len(left) > 0 {
		t.Errorf("left on the host: %v", left)
	}
	return unnamed.SnapshotID
}

func e2eJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// A snapshot, fork or publish cut short by SIGKILL leaves no snapshot,
// version, layer or fork once sandboxd is back, and the source (frozen at
// the time) runs on.
func TestSnapshotCrashE2E(t *testing.T) {
	for _, op := range []string{"snapshots", "fork", "publish"} {
		t.Run(op, func(t *testing.T) {
			e := newE2EEnv(t, "a")
			s := e.start()
			ka := e.keys["a"]
			src, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"timeout": 600, "memoryMB": 2048, "diskSizeMB": 2048})
			tok := *src.EnvdAccessToken
			// Enough files that the copy takes a while: many small ones.
			s.mustRun(t, src.SandboxID, tok, "mkdir ~/many && cd ~/many && for i in $(seq 1 20000); do echo $i > f$i; done")
			layers := func() []string {
				var out []string
				for _, root := range []string{e.runDir, e.dataDir} {
					m, _ := filepath.Glob(filepath.Join(root, "templates", "layers", "*snap-*"))
					out = append(out, m...)
				}
				return out
			}
			inProgress := func() bool {
				if op == "fork" {
					ents, _ := os.ReadDir(filepath.Join(e.runDir, "sandboxes"))
					return len(ents) > 1
				}
				return len(layers()) > 0
			}
			body, path := map[string]any{}, e2eAPIPrefix+"/sandboxes/"+src.SandboxID+"/"+op
			switch op {
			case "snapshots":
				body["name"] = "cut"
			case "publish": // the native API's, to a new template
				body["template"] = "cut"
				path = "/v1/sandboxes/" + src.SandboxID + "/publish"
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = s.tryDo(http.MethodPost, path, ka, body, nil)
			}()
			e2eEventually(t, "the "+op+" copying", time.Minute, time.Millisecond, func() (bool, string) { return inProgress(), "" })
			if err := s.stop(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-done
			s = e.start()
			if l, _ := listSnapshots(t, s, ka, ""); len(l) != 0 {
				t.Errorf("snapshots after a crash mid-%s: %v", op, l)
			}
			if left := layers(); len(left) > 0 {
				t.Errorf("layers left by the cut %s: %v", op, left)
			}
			if r := s.api(t, http.MethodGet, "/templates/aliases/cut", ka, nil); r.status != http.StatusNotFound {
				t.Errorf("the template of the cut %s: %s, want 404", op, r)
			}
			if l, _ := s.list(t, ka, ""); !slices.Equal(e2eIDs(l), []string{src.SandboxID}) {
				t.Errorf("sandboxes after a crash mid-%s: %v, want the source alone", op, e2eIDs(l))
			}
			s.mustRun(t, src.SandboxID, tok, "test -f ~/many/f20000")
			snapshot(t, s, ka, src.SandboxID, nil) // and it can be snapshotted again
			e.killAll(s)
			if err := s.stop(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if left := e.leaks(); len(left) > 0 {
				t.Errorf("left on the host: %v", left)
			}
		})
	}
}

// A tenant's snapshots are bounded in number and size (the server's
// --max-snapshots and --max-snapshot-mb): over either, a snapshot is 429
// naming the quota and makes nothing; deleting one frees its share.
func TestSnapshotQuotaE2E(t *testing.T) {
	e := newE2EEnv(t, "a")
	e.serveArgs = append(e.serveArgs, "--max-snapshots=1", "--max-snapshot-mb=16")
	s := e.start()
	ka := e.keys["a"]
	src, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"timeout": 600})
	tok := *src.EnvdAccessToken
	first := snapshot(t, s, ka, src.SandboxID, nil)
	msg := wantError(t, "a second snapshot", s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/snapshots", ka, map[string]any{}), http.StatusTooManyRequests)
	if !strings.Contains(msg, "1 of 1 snapshots") {
		t.Errorf("quota message %q does not name the limit", msg)
	}
	wantStatus(t, "delete", s.api(t, http.MethodDelete, "/templates/"+url.PathEscape(first.SnapshotID), ka, nil), http.StatusNoContent)
	s.mustRun(t, src.SandboxID, tok, "head -c 20971520 /dev/zero > ~/big")
	msg = wantError(t, "a 20 MB snapshot", s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/snapshots", ka, map[string]any{}), http.StatusTooManyRequests)
	if !strings.Contains(msg, "quota of 16 MiB") {
		t.Errorf("quota message %q does not name the limit", msg)
	}
	if l, _ := listSnapshots(t, s, ka, ""); len(l) != 0 {
		t.Errorf("snapshots after refusals: %v", l)
	}
	s.mustRun(t, src.SandboxID, tok, "rm ~/big")
	snapshot(t, s, ka, src.SandboxID, nil)
}
