package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestVolumesRestart: a sandbox keeps its volume mount across a crash of
// sandboxd (re-adopted) and a pause to disk; the volume's files and token
// survive the restart and the sandbox; what a crash left of a volume with
// no record is removed at the next start; and once deleted nothing of the
// volume is left mounted under the data dir.
func TestVolumesRestart(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s1 := e.start()
	key := e.keys["alice"]
	r := s1.api(t, http.MethodPost, "/volumes", key, map[string]string{"name": "data"})
	wantStatus(t, "POST /volumes", r, http.StatusCreated)
	var vol struct{ VolumeID, Name, Token string }
	if err := json.Unmarshal(r.body, &vol); err != nil || vol.Token == "" {
		t.Fatalf("create volume: %s", r)
	}
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 600,
		"volumeMounts": []map[string]string{{"name": "data", "path": "/mnt/data"}}})
	tok := *sb.EnvdAccessToken
	s1.mustRun(t, sb.SandboxID, tok, "echo before > /mnt/data/f")

	// A crash between a backend's create and the record: a volume
	// directory nobody knows of.
	orphan := filepath.Join(e.dataDir, "volumes", "00000000-0000-4000-8000-000000000000")
	if err := os.MkdirAll(orphan, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s1.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s2 := e.start()
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("the orphan volume directory is still there after a restart: %v", err)
	}
	if res := s2.mustRun(t, sb.SandboxID, tok, "cat /mnt/data/f && echo after >> /mnt/data/f"); res.stdout != "before\n" {
		t.Errorf("after restart the sandbox reads %q; want its volume", res.stdout)
	}
	wantStatus(t, "pause to disk", s2.api(t, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", key, map[string]any{"memory": false}), http.StatusNoContent)
	wantStatus(t, "delete a volume a paused sandbox mounts", s2.api(t, http.MethodDelete, "/volumes/"+vol.VolumeID, key, nil), http.StatusConflict)
	wantStatus(t, "resume", s2.api(t, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/connect", key, map[string]any{"timeout": 600}), http.StatusCreated)
	if res := s2.mustRun(t, sb.SandboxID, tok, "cat /mnt/data/f"); res.stdout != "before\nafter\n" {
		t.Errorf("after a resume from disk the sandbox reads %q; want its volume", res.stdout)
	}
	wantStatus(t, "kill", s2.api(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, key, nil), http.StatusNoContent)

	// The content API, with the token from before the restart.
	req, _ := http.NewRequest(http.MethodGet, s2.base+e2eAPIPrefix+"/volumecontent/"+vol.VolumeID+"/file?path=/f", nil)
	req.Header.Set("Authorization", "Bearer "+vol.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != "before\nafter\n" {
		t.Errorf("content API after the sandbox: %d %q", resp.StatusCode, got)
	}
	wantStatus(t, "delete volume", s2.api(t, http.MethodDelete, "/volumes/"+vol.VolumeID, key, nil), http.StatusNoContent)
	if m := e2eMountsUnder(e.dataDir); len(m) > 0 {
		t.Errorf("mounts left under the data dir: %v", m)
	}
	if _, err := os.Stat(filepath.Join(e.dataDir, "volumes", vol.VolumeID)); !os.IsNotExist(err) {
		t.Errorf("the deleted volume's directory is still there: %v", err)
	}
}
