package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/incus"
	"github.com/sandboxd/sandboxd/runtime"
)

// buildFaultSandboxd builds sandboxd with the build tag faultinject (see
// internal/faultinject) into a directory of t's: the only binary whose
// pause points do anything. Release builds (make build, the e2e binaries)
// have none. Each test builds its own; Go's build cache makes all but the
// first a link.
func buildFaultSandboxd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sandboxd-faultinject")
	cmd := exec.Command("go", "build", "-tags", "seccomp,faultinject", "-trimpath", "-o", bin, "github.com/sandboxd/sandboxd/cmd/sandboxd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build sandboxd with faultinject: %v\n%s", err, out)
	}
	return bin
}

// volumeResidue says what is left on the host of volume id, on one
// backend: nothing when the volume is wholly gone.
type volumeResidue func(t *testing.T, id string) []string

// localVolumeResidue: the volume's directory (its image), a mount of it or
// a loop device over its image.
func localVolumeResidue(e *e2eEnv) volumeResidue {
	return func(t *testing.T, id string) []string {
		dir := filepath.Join(e.dataDir, "volumes", id)
		var left []string
		if e2eExists(dir) {
			left = append(left, dir)
		}
		left = append(left, e2eMountsUnder(dir)...)
		loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, l := range loops {
			b, err := os.ReadFile(l)
			if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
				left = append(left, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(l)))+" over "+strings.TrimSpace(string(b)))
			}
		}
		return left
	}
}

// incusVolumeResidue: the volume's custom storage volume on the pool.
func incusVolumeResidue(c *incus.Client) volumeResidue {
	return func(t *testing.T, id string) []string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.StorageVolume(ctx, "sandboxd", "sbxv-"+id)
		if errors.Is(err, runtime.ErrNotFound) {
			return nil
		}
		if err != nil {
			t.Fatalf("look up custom volume sbxv-%s: %v", id, err)
		}
		return []string{"custom volume sbxv-" + id}
	}
}

// TestVolumeCrashE2E SIGKILLs sandboxd inside a volume create and inside a
// volume delete, on both backends, at each step where the two halves of a
// volume (the backend's files, the store's record) could disagree, and
// checks what the next start makes of it: the volume is wholly there
// (listed, mounted by a sandbox that reads and writes it, deletable) or
// wholly gone (not listed, nothing of it on the host: no image, mount or
// loop device on the local backend, no custom volume on Incus), a delete
// of a gone one is a clean 404, and its name can be used again.
//
// No step of these is reliably slow enough to catch from outside (mkfs of
// a sparse image with lazy init, a btrfs subvolume, a record insert are
// all milliseconds), so sandboxd is a build with fault injection that
// stops at the step named (internal/faultinject) and says so in a file.
func TestVolumeCrashE2E(t *testing.T) {
	cases := []struct {
		point string
		op    string // "create" or "delete"
		kept  bool   // the volume is there after the restart
	}{
		{"volume-create-backend", "create", false},    // files half made, no record
		{"volume-create-unrecorded", "create", false}, // files made, no record
		{"volume-create-recorded", "create", true},    // both, never answered
		{"volume-delete-marked", "delete", false},     // record hidden, files whole
		{"volume-delete-backend", "delete", false},    // files half removed
	}
	bin := buildFaultSandboxd(t)
	for _, backend := range []string{"local", "incus"} {
		t.Run(backend, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.point, func(t *testing.T) {
					var e *e2eEnv
					var residue volumeResidue
					if backend == "incus" {
						var c *incus.Client
						e, c = newIncusE2EEnv(t, "a")
						skipForeignIncusVolumes(t, c)
						residue = incusVolumeResidue(c)
					} else {
						e = newE2EEnv(t, "a")
						residue = localVolumeResidue(e)
					}
					testVolumeCrash(t, e, bin, tc.point, tc.op, tc.kept, residue)
				})
			}
		})
	}
}

// skipForeignIncusVolumes skips when Incus holds a volume of another
// namespace-less sandboxd: the restart's prune would remove it as one
// without a record.
func skipForeignIncusVolumes(t *testing.T, c *incus.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vs, err := c.StorageVolumes(ctx, "sandboxd")
	if err != nil {
		t.Fatalf("list custom volumes: %v", err)
	}
	for _, v := range vs {
		if v.Config["user.sandboxd.volume"] != "" && v.Config["user.sandboxd.namespace"] == "" {
			t.Skipf("another sandboxd's Incus volume (%s) exists; a restart would prune it", v.Name)
		}
	}
}

func testVolumeCrash(t *testing.T, e *e2eEnv, bin, point, op string, kept bool, residue volumeResidue) {
	ka := e.keys["a"]
	marker := filepath.Join(t.TempDir(), "paused")
	e.launch = e2eLaunch{bin: bin, env: []string{"SANDBOXD_FAULT_PAUSE=" + point + ":" + marker}}
	s := e.start()
	var id string
	if op == "delete" {
		id = createVolume(t, s, ka, "vol").VolumeID
		if left := residue(t, id); len(left) == 0 {
			t.Fatalf("the volume made for the delete has nothing on the host")
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if op == "create" {
			_, _ = s.tryDo(http.MethodPost, e2eAPIPrefix+"/volumes", ka, map[string]string{"name": "vol"}, nil)
		} else {
			_, _ = s.tryDo(http.MethodDelete, e2eAPIPrefix+"/volumes/"+id, ka, nil, nil)
		}
	}()
	e2eEventually(t, "sandboxd stopped at "+point, 2*time.Minute, 10*time.Millisecond, func() (bool, string) {
		return e2eExists(marker), ""
	})
	b, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	if op == "create" {
		id = string(b)
	} else if string(b) != id {
		t.Fatalf("stopped in the delete of %q, want %s", b, id)
	}
	if err := s.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done

	e.launch = e2eLaunch{}
	s = e.start()
	listed := listVolumeIDs(t, s, ka)
	get := s.api(t, http.MethodGet, "/volumes/"+id, ka, nil)
	if kept {
		if !slices.Equal(listed, []string{id}) || get.status != http.StatusOK {
			t.Fatalf("after a crash at %s: volumes %v, GET %s; want %s wholly there", point, listed, get, id)
		}
		useVolume(t, e, s, ka, "vol", "after the crash")
		wantStatus(t, "delete the kept volume", s.api(t, http.MethodDelete, "/volumes/"+id, ka, nil), http.StatusNoContent)
	} else {
		if len(listed) != 0 || get.status != http.StatusNotFound {
			t.Errorf("after a crash at %s: volumes %v, GET %s; want %s wholly gone", point, listed, get, id)
		}
		if left := residue(t, id); len(left) > 0 {
			t.Errorf("after a crash at %s, left of volume %s: %v", point, id, left)
		}
		// A retried delete of a volume the restart finished is a clean
		// 404, and the name is free again.
		wantStatus(t, "retry the delete", s.api(t, http.MethodDelete, "/volumes/"+id, ka, nil), http.StatusNotFound)
		again := createVolume(t, s, ka, "vol").VolumeID
		useVolume(t, e, s, ka, "vol", "made again")
		wantStatus(t, "delete the new volume", s.api(t, http.MethodDelete, "/volumes/"+again, ka, nil), http.StatusNoContent)
		id = again
	}
	if left := listVolumeIDs(t, s, ka); len(left) != 0 {
		t.Errorf("volumes after the delete: %v", left)
	}
	if left := residue(t, id); len(left) > 0 {
		t.Errorf("left of volume %s after its delete: %v", id, left)
	}
}

func listVolumeIDs(t *testing.T, s *e2eServer, key string) []string {
	t.Helper()
	r := s.api(t, http.MethodGet, "/volumes", key, nil)
	wantStatus(t, "GET /volumes", r, http.StatusOK)
	var vs []struct{ VolumeID string }
	e2eDecode(t, "GET /volumes", r, &vs)
	var ids []string
	for _, v := range vs {
		ids = append(ids, v.VolumeID)
	}
	return ids
}

// useVolume mounts volume name in a new sandbox, which writes a file and
// reads it back, and kills the sandbox.
func useVolume(t *testing.T, e *e2eEnv, s *e2eServer, key, name, what string) {
	t.Helper()
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 300,
		"volumeMounts": []map[string]string{{"name": name, "path": "/mnt/vol"}}})
	want := fmt.Sprintf("%s %s", what, e2eRandHex(4))
	res := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "echo '"+want+"' > /mnt/vol/f && cat /mnt/vol/f && ls /mnt/vol")
	if res.stdout != want+"\nf\n" {
		t.Errorf("volume %s (%s) in a sandbox: %q %q, want it written and read back alone", name, what, res.stdout, res.stderr)
	}
	wantStatus(t, "kill the sandbox of volume "+name, s.api(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, key, nil), http.StatusNoContent)
}
