package main

// Issue 23's quotas and tenant boundaries over HTTP against the real
// binary: the volume quota, forks against the sandbox quota, the snapshot,
// fork and volume routes across tenants, and a snapshot racing a kill.

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/incus"
)

// e2eVolume is E2B's VolumeAndToken.
type e2eVolume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token"`
}

func createVolume(t *testing.T, s *e2eServer, key, name string) e2eVolume {
	t.Helper()
	r := s.api(t, http.MethodPost, "/volumes", key, map[string]string{"name": name})
	wantStatus(t, "create volume "+name, r, http.StatusCreated)
	var v e2eVolume
	e2eDecode(t, "create volume", r, &v)
	if v.VolumeID == "" {
		t.Fatalf("create volume: %s", r)
	}
	return v
}

func listVolumes(t *testing.T, s *e2eServer, key string) []string {
	t.Helper()
	r := s.api(t, http.MethodGet, "/volumes", key, nil)
	wantStatus(t, "GET /volumes", r, http.StatusOK)
	var vs []e2eVolume
	e2eDecode(t, "GET /volumes", r, &vs)
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	slices.Sort(names)
	return names
}

// content calls the volume content API with a bearer token ("" sends none)
// and, when key is set, an API key too.
func (s *e2eServer) content(t *testing.T, method, id, rest, token, key string) e2eResponse {
	t.Helper()
	hdr := http.Header{}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	}
	r, err := s.tryDo(method, e2eAPIPrefix+"/volumecontent/"+id+rest, key, nil, hdr)
	if err != nil {
		t.Fatalf("%s /volumecontent/%s%s: %v", method, id, rest, err)
	}
	return r
}

// localVolumeIDs lists the volumes the local backend holds (a directory
// each under the data dir).
func localVolumeIDs(e *e2eEnv) func(*testing.T) []string {
	return func(t *testing.T) []string {
		ents, err := os.ReadDir(filepath.Join(e.dataDir, "volumes"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		var ids []string
		for _, ent := range ents {
			ids = append(ids, ent.Name())
		}
		return ids
	}
}

// incusVolumeIDs lists the volumes of sandboxd's storage pool in Incus
// (custom volumes labelled with their volume id).
func incusVolumeIDs(c *incus.Client) func(*testing.T) []string {
	return func(t *testing.T) []string {
		vs, err := c.StorageVolumes(t.Context(), "sandboxd")
		if err != nil {
			t.Fatalf("list Incus volumes: %v", err)
		}
		var ids []string
		for _, v := range vs {
			if id := v.Config["user.sandboxd.volume"]; id != "" {
				ids = append(ids, id)
			}
		}
		return ids
	}
}

// A tenant's volumes are bounded in number (--max-volumes, the server's)
// and total size (--max-volumes-mb, here a tenant's own through `tenants
// set`): up to the quota creates work, one more is 400 with E2B's body
// naming the quota and makes nothing (no record, no backend volume, its
// name still free), and deleting one frees its share.
func TestVolumeQuotaE2E(t *testing.T) {
	e := newE2EEnv(t, "a", "b")
	testVolumeQuota(t, e, localVolumeIDs(e))
}

// The same on Incus, where a volume is a custom storage volume.
func TestIncusVolumeQuotaE2E(t *testing.T) {
	e, c := newIncusE2EEnv(t, "a", "b")
	testVolumeQuota(t, e, incusVolumeIDs(c))
}

func testVolumeQuota(t *testing.T, e *e2eEnv, backendIDs func(*testing.T) []string) {
	e.serveArgs = append(e.serveArgs, "--max-volumes=2", "--volume-size-mb=16")
	// b: no count limit of its own, 40 MiB in all: room for two 16 MiB
	// volumes, not three.
	e.sandboxdCLI(t, "tenants", "set", "b", "--data-dir", e.dataDir, "--max-volumes", "0", "--max-volumes-mb", "40")
	s := e.start()
	for _, tc := range []struct {
		tenant, want string
	}{
		{"a", "the tenant has 2 of 2 volumes"},
		{"b", "would total 48 MiB, above its limit of 40 MiB"},
	} {
		t.Run(tc.tenant, func(t *testing.T) {
			key := e.keys[tc.tenant]
			var made []e2eVolume
			for i := range 2 {
				made = append(made, createVolume(t, s, key, fmt.Sprintf("q%d", i)))
			}
			t.Cleanup(func() {
				for _, v := range made {
					_, _ = s.tryDo(http.MethodDelete, e2eAPIPrefix+"/volumes/"+v.VolumeID, key, nil, nil)
				}
			})
			before := backendIDs(t)
			for _, v := range made {
				if !slices.Contains(before, v.VolumeID) {
					t.Fatalf("volume %s is not among the backend's: %v", v.VolumeID, before)
				}
			}
			msg := wantError(t, "a volume over the quota", s.api(t, http.MethodPost, "/volumes", key, map[string]string{"name": "over"}), http.StatusBadRequest)
			if !strings.Contains(msg, "volume quota exceeded") || !strings.Contains(msg, tc.want) {
				t.Errorf("quota message %q: want it to name the quota (%q)", msg, tc.want)
			}
			if got := backendIDs(t); !sameSet(got, before) {
				t.Errorf("the refused create changed the backend's volumes: %v, before %v", got, before)
			}
			if got := listVolumes(t, s, key); !slices.Equal(got, []string{"q0", "q1"}) {
				t.Errorf("volumes after the refusal = %v, want q0 q1", got)
			}
			wantStatus(t, "delete q0", s.api(t, http.MethodDelete, "/volumes/"+made[0].VolumeID, key, nil), http.StatusNoContent)
			made[0] = createVolume(t, s, key, "over") // the name was never taken
			if got := listVolumes(t, s, key); !slices.Equal(got, []string{"over", "q1"}) {
				t.Errorf("volumes after a delete freed a share = %v, want over q1", got)
			}
			// The new volume is a working one.
			r := s.content(t, http.MethodPut, made[0].VolumeID, "/file?path=/f", made[0].Token, "")
			wantStatus(t, "write to the new volume", r, http.StatusCreated)
		})
	}
}

// startWithSource starts e's sandboxd with args added, and a sandbox of
// tenant a (for 10 minutes) whose ~/f holds line.
func startWithSource(t *testing.T, e *e2eEnv, line string, args ...string) (*e2eServer, e2eSandbox) {
	t.Helper()
	e.serveArgs = append(e.serveArgs, args...)
	s := e.start()
	src, _ := e.create(t, "/v2/sandboxes", e.keys["a"], map[string]any{"timeout": 600})
	s.mustRun(t, src.SandboxID, *src.EnvdAccessToken, "echo "+line+" > ~/f")
	return s, src
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// Forks are sandboxes of the tenant: at its --max-sandboxes quota a fork
// is refused as a create over quota is (429, E2B's body) and makes
// nothing, the source running on untouched; once a sandbox is killed the
// fork starts. With room for only some of a request's forks, each fork
// answers for itself. A full snapshot quota does not hold forks back:
// a fork makes no snapshot.
func TestForkQuotaE2E(t *testing.T) {
	e := newE2EEnv(t, "a")
	s, src := startWithSource(t, e, "kept", "--max-sandboxes=3", "--max-snapshots=1")
	ka, tok := e.keys["a"], *src.EnvdAccessToken
	o1, _ := e.create(t, "/v2/sandboxes", ka, nil)
	o2, _ := e.create(t, "/v2/sandboxes", ka, nil)
	endAt := s.get(t, ka, src.SandboxID).EndAt

	states := func() []string {
		ents, _ := os.ReadDir(filepath.Join(e.runDir, "sandboxes"))
		var out []string
		for _, ent := range ents {
			out = append(out, ent.Name())
		}
		return out
	}
	beforeStates := states()
	create := wantError(t, "a create at the quota", s.api(t, http.MethodPost, "/v2/sandboxes", ka,
		map[string]any{"templateID": "base", "allow_internet_access": false}), http.StatusTooManyRequests)
	fork := wantError(t, "a fork at the quota", s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/fork", ka, map[string]any{}), http.StatusTooManyRequests)
	if !strings.Contains(fork, "sandbox quota reached: 3 of 3") || fork != create {
		t.Errorf("fork refused with %q, want the create's %q", fork, create)
	}
	if l, _ := s.list(t, ka, ""); !sameSet(e2eIDs(l), []string{src.SandboxID, o1.SandboxID, o2.SandboxID}) {
		t.Errorf("sandboxes after the refused fork: %v", e2eIDs(l))
	}
	if got := states(); !sameSet(got, beforeStates) {
		t.Errorf("the refused fork left state on the host: %v, before %v", got, beforeStates)
	}
	if d := s.get(t, ka, src.SandboxID); d.State != "running" || !d.EndAt.Equal(endAt) {
		t.Errorf("source after the refused fork: %s, ends %v (was %v)", d.State, d.EndAt, endAt)
	}
	s.mustRun(t, src.SandboxID, tok, "grep -qx kept ~/f")

	forks := func(what string, body map[string]any) []e2eForkResult {
		t.Helper()
		r := s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/fork", ka, body)
		wantStatus(t, what, r, http.StatusCreated)
		var out []e2eForkResult
		e2eDecode(t, what, r, &out)
		for _, f := range out {
			if f.Sandbox != nil {
				e.track(f.Sandbox.SandboxID, ka)
			}
		}
		return out
	}
	wantStatus(t, "kill o1", s.api(t, http.MethodDelete, "/sandboxes/"+o1.SandboxID, ka, nil), http.StatusNoContent)
	got := forks("a fork after a kill", map[string]any{})
	if len(got) != 1 || got[0].Sandbox == nil {
		t.Fatalf("fork after a kill: %+v", got)
	}
	f1 := got[0].Sandbox
	s.mustRun(t, f1.SandboxID, *f1.EnvdAccessToken, "grep -qx kept ~/f")

	// Room for one of two: one fork starts, the other is refused on its own.
	wantStatus(t, "kill the fork", s.api(t, http.MethodDelete, "/sandboxes/"+f1.SandboxID, ka, nil), http.StatusNoContent)
	got = forks("two forks with room for one", map[string]any{"count": 2})
	var started, refused int
	for _, f := range got {
		switch {
		case f.Sandbox != nil && f.Error == nil:
			started++
			wantStatus(t, "kill the fork", s.api(t, http.MethodDelete, "/sandboxes/"+f.Sandbox.SandboxID, ka, nil), http.StatusNoContent)
		case f.Error != nil && f.Error.Code == http.StatusTooManyRequests && strings.Contains(f.Error.Message, "sandbox quota reached"):
			refused++
		default:
			t.Errorf("fork result %+v", f)
		}
	}
	if started != 1 || refused != 1 {
		t.Errorf("two forks with room for one: %d started, %d refused, want 1 and 1", started, refused)
	}

	// The snapshot quota (1) full: forks still start.
	snapshot(t, s, ka, src.SandboxID, nil)
	wantError(t, "a second snapshot", s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/snapshots", ka, map[string]any{}), http.StatusTooManyRequests)
	got = forks("a fork with the snapshot quota full", map[string]any{})
	if len(got) != 1 || got[0].Sandbox == nil {
		t.Fatalf("fork with the snapshot quota full: %+v", got)
	}
	if l, _ := listSnapshots(t, s, ka, ""); len(l) != 1 {
		t.Errorf("snapshots after a fork: %v, want the one taken", l)
	}
}

// Tenant b reaches none of tenant a's snapshots, sandboxes (to fork) or
// volumes, on any route: each answers as for something that does not
// exist, and a's objects are intact afterwards. (Snapshot and fork of a's
// sandbox, and b's snapshot list, are TestSnapshotForkE2E's.)
func TestCrossTenant23E2E(t *testing.T) {
	e := newE2EEnv(t, "a", "b")
	s, src := startWithSource(t, e, "snap")
	ka, kb := e.keys["a"], e.keys["b"]
	named := snapshot(t, s, ka, src.SandboxID, map[string]any{"name": "a-snap"})
	unnamed := snapshot(t, s, ka, src.SandboxID, nil)
	volA := createVolume(t, s, ka, "shared-name")
	volB := createVolume(t, s, kb, "b-own")
	wantStatus(t, "write a's volume", s.content(t, http.MethodPut, volA.VolumeID, "/file?path=/secret", volA.Token, ""), http.StatusCreated)
	missingVol := "00000000-0000-4000-8000-000000000000"
	missingTpl := e2eMissingID()

	// same fails unless b's answer about id is the one about missingID,
	// which does not exist.
	same := func(what string, got e2eResponse, id string, missing e2eResponse, missingID string, status int) {
		t.Helper()
		if got.status != status || strings.ReplaceAll(string(got.body), id, missingID) != string(missing.body) {
			t.Errorf("%s: %s, want %d as for a missing one: %s", what, got, status, missing)
		}
	}
	t.Run("snapshots", func(t *testing.T) {
		for _, id := range []string{named.SnapshotID, unnamed.SnapshotID, "a-snap"} {
			r := s.api(t, http.MethodDelete, "/templates/"+url.PathEscape(id), kb, nil)
			wantError(t, "b deletes a's snapshot "+id, r, http.StatusNotFound)
		}
		tplID := strings.TrimSuffix(unnamed.SnapshotID, ":default")
		same("b gets a's snapshot template", s.api(t, http.MethodGet, "/templates/"+tplID, kb, nil), tplID,
			s.api(t, http.MethodGet, "/templates/"+missingTpl, kb, nil), missingTpl, http.StatusNotFound)
		wantError(t, "b gets a's snapshot alias", s.api(t, http.MethodGet, "/templates/aliases/a-snap", kb, nil), http.StatusNotFound)
		if l, _ := listSnapshots(t, s, kb, "?sandboxID="+src.SandboxID); len(l) != 0 {
			t.Errorf("b lists a's sandbox's snapshots: %v", l)
		}
		for _, id := range []string{named.SnapshotID, unnamed.SnapshotID} {
			r := s.api(t, http.MethodPost, "/v2/sandboxes", kb, map[string]any{"templateID": id, "allow_internet_access": false})
			missing := s.api(t, http.MethodPost, "/v2/sandboxes", kb, map[string]any{"templateID": missingTpl + ":default", "allow_internet_access": false})
			if r.status != missing.status || r.status/100 != 4 {
				t.Errorf("b creates from a's snapshot %s: %s, want as for a missing one: %s", id, r, missing)
			}
		}
	})
	t.Run("fork", func(t *testing.T) {
		missing := e2eMissingID()
		same("b forks a's sandbox", s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/fork", kb, map[string]any{"count": 1}), src.SandboxID,
			s.api(t, http.MethodPost, "/sandboxes/"+missing+"/fork", kb, map[string]any{"count": 1}), missing, http.StatusNotFound)
	})
	t.Run("volumes", func(t *testing.T) {
		for _, m := range []string{http.MethodGet, http.MethodDelete} {
			wantError(t, m+" a's volume as b", s.api(t, m, "/volumes/"+volA.VolumeID, kb, nil), http.StatusNotFound)
		}
		if got := listVolumes(t, s, kb); !slices.Equal(got, []string{"b-own"}) {
			t.Errorf("b lists %v", got)
		}
		// A mount of a's volume by name is a mount of a missing one.
		mount := func(name string) e2eResponse {
			return s.api(t, http.MethodPost, "/v2/sandboxes", kb, map[string]any{"templateID": "base", "allow_internet_access": false,
				"volumeMounts": []map[string]string{{"name": name, "path": "/mnt/v"}}})
		}
		r, missing := mount("shared-name"), mount("no-such-volume")
		if r.status != http.StatusBadRequest || missing.status != r.status ||
			strings.ReplaceAll(string(r.body), "shared-name", "no-such-volume") != string(missing.body) {
			t.Errorf("b mounts a's volume: %s, want as for a missing one: %s", r, missing)
		}
		// The content API opens a volume with its own token only: b's key,
		// b's volume's token, or no token on a's volume answer what a
		// missing volume does, and so does a's token on b's volume.
		for _, tc := range []struct {
			what, id, token, key string
		}{
			{"b's API key on a's volume", volA.VolumeID, "", kb},
			{"b's API key as bearer on a's volume", volA.VolumeID, kb, ""},
			{"b's volume token on a's volume", volA.VolumeID, volB.Token, ""},
			{"a's volume token on b's volume", volB.VolumeID, volA.Token, ""},
		} {
			for _, rest := range []string{"/file?path=/secret", "/path?path=/"} {
				got := s.content(t, http.MethodGet, tc.id, rest, tc.token, tc.key)
				want := s.content(t, http.MethodGet, missingVol, rest, tc.token, tc.key)
				if got.status != http.StatusUnauthorized || string(got.body) != string(want.body) {
					t.Errorf("%s (%s): %s, want as for a missing volume: %s", tc.what, rest, got, want)
				}
			}
		}
		r = s.content(t, http.MethodDelete, volA.VolumeID, "/file?path=/secret", volB.Token, "")
		if r.status != http.StatusUnauthorized {
			t.Errorf("b's token deletes a's file: %s", r)
		}
	})

	// a's objects are intact.
	if l, _ := listSnapshots(t, s, ka, ""); !sameSet(snapshotIDs(l), []string{named.SnapshotID, unnamed.SnapshotID}) {
		t.Errorf("a's snapshots after b's calls: %v", l)
	}
	sb, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": "a-snap"})
	s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "grep -qx snap ~/f")
	if d := s.get(t, ka, src.SandboxID); d.State != "running" {
		t.Errorf("a's sandbox is %s", d.State)
	}
	r := s.content(t, http.MethodGet, volA.VolumeID, "/file?path=/secret", volA.Token, "")
	if r.status != http.StatusOK {
		t.Errorf("a's volume file after b's calls: %s", r)
	}
	if got := listVolumes(t, s, ka); !slices.Equal(got, []string{"shared-name"}) {
		t.Errorf("a's volumes after b's calls: %v", got)
	}
	for k, v := range map[string]e2eVolume{ka: volA, kb: volB} {
		wantStatus(t, "delete volume "+v.Name, s.api(t, http.MethodDelete, "/volumes/"+v.VolumeID, k, nil), http.StatusNoContent)
	}
}

// A snapshot racing a kill of its sandbox, in both orders and together,
// several times each: whichever wins, both answer clearly (the snapshot
// 201, or 404/409 for a sandbox gone or going; the kill 204), a snapshot
// is listed only if it was answered 201 and then has every file, no layer
// is left but those of listed snapshots, and nothing of the sandbox is
// left on the host.
func TestSnapshotKillRaceE2E(t *testing.T) {
	e := newE2EEnv(t, "a")
	layers := func() []string {
		inRun, _ := filepath.Glob(filepath.Join(e.runDir, "templates", "layers", "*snap-*"))
		inData, _ := filepath.Glob(filepath.Join(e.dataDir, "templates", "layers", "*snap-*"))
		return append(inRun, inData...)
	}
	// A sandbox's state dir, mounts and cgroups (a cgroup goes only once
	// its processes have) are named by its id; sandboxd's own mounts under
	// the run dir are not.
	left := func(t *testing.T, id string) []string {
		var out []string
		for _, l := range e.leaks() {
			if strings.Contains(l, id) {
				out = append(out, l)
			}
		}
		return out
	}
	testSnapshotKillRace(t, e, layers, left)
}

// The same on Incus, where a snapshot publishes a layer image (named once
// the copy is done) and a killed sandbox's instance is deleted in the
// background.
func TestIncusSnapshotKillRaceE2E(t *testing.T) {
	e, c := newIncusE2EEnv(t, "a")
	before := ownLayers(t, c)
	layers := func() []string {
		var out []string
		for name, key := range ownLayers(t, c) {
			if _, had := before[name]; !had && strings.HasPrefix(key, "snap-") {
				out = append(out, name)
			}
		}
		return out
	}
	left := func(t *testing.T, id string) []string {
		var out []string
		e2eEventually(t, "the killed sandbox's instance deleted", time.Minute, 100*time.Millisecond, func() (bool, string) {
			out = incusInstancesOf(t, c, []string{id})
			return len(out) == 0, fmt.Sprint(out)
		})
		return out
	}
	testSnapshotKillRace(t, e, layers, left)
}

// testSnapshotKillRace runs the races on e, whose sandboxd it starts and
// stops. layers lists the snapshot layers the backend holds; left what
// sandbox id left on the host once killed.
func testSnapshotKillRace(t *testing.T, e *e2eEnv, layers func() []string, left func(t *testing.T, id string) []string) {
	s := e.start()
	ka := e.keys["a"]
	const files = 20000
	snap := func(id string) e2eResponse {
		r, err := s.tryDo(http.MethodPost, e2eAPIPrefix+"/sandboxes/"+id+"/snapshots", ka, map[string]any{}, nil)
		if err != nil {
			t.Errorf("snapshot: %v", err)
		}
		return r
	}
	kill := func(id string) e2eResponse {
		r, err := s.tryDo(http.MethodDelete, e2eAPIPrefix+"/sandboxes/"+id, ka, nil, nil)
		if err != nil {
			t.Errorf("kill: %v", err)
		}
		return r
	}
	// Each order starts both calls: the kill once the snapshot copies, the
	// snapshot once the kill is under way, or both at about the same time.
	orders := []string{"kill mid-copy", "snapshot mid-kill", "together"}
	var kept []string // snapshots answered 201
	for _, order := range orders {
		for i := range 3 {
			t.Run(fmt.Sprintf("%s/%d", order, i), func(t *testing.T) {
				src, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"timeout": 600, "memoryMB": 2048, "diskSizeMB": 2048})
				s.mustRun(t, src.SandboxID, *src.EnvdAccessToken,
					fmt.Sprintf("mkdir ~/many && cd ~/many && seq 1 %d | xargs touch", files))
				layersBefore := layers()
				var snapR, killR e2eResponse
				var wg sync.WaitGroup
				switch order {
				case "together":
					// The kill follows the snapshot by 0, 4 and 8 ms: into
					// the checks a snapshot makes before it copies.
					wg.Go(func() { snapR = snap(src.SandboxID) })
					time.Sleep(time.Duration(4*i) * time.Millisecond)
					killR = kill(src.SandboxID)
				case "kill mid-copy":
					wg.Go(func() { snapR = snap(src.SandboxID) })
					e2eEventually(t, "the snapshot copying", time.Minute, time.Millisecond, func() (bool, string) {
						return len(layers()) > len(layersBefore), ""
					})
					killR = kill(src.SandboxID)
				case "snapshot mid-kill":
					wg.Go(func() { killR = kill(src.SandboxID) })
					// Under way: the sandbox is no longer running.
					e2eEventually(t, "the kill under way", time.Minute, time.Millisecond, func() (bool, string) {
						r, err := s.tryDo(http.MethodGet, e2eAPIPrefix+"/sandboxes/"+src.SandboxID, ka, nil, nil)
						return err == nil && (r.status == http.StatusNotFound || !strings.Contains(string(r.body), `"running"`)), ""
					})
					snapR = snap(src.SandboxID)
				}
				wg.Wait()
				t.Logf("snapshot %d, kill %d", snapR.status, killR.status)
				if killR.status != http.StatusNoContent {
					t.Errorf("kill: %s, want 204", killR)
				}
				var id string
				switch snapR.status {
				case http.StatusCreated:
					var sn e2eSnapshot
					e2eDecode(t, "snapshot", snapR, &sn)
					id = sn.SnapshotID
					kept = append(kept, id)
				case http.StatusNotFound, http.StatusConflict:
					wantError(t, "snapshot", snapR, snapR.status)
				default:
					t.Errorf("snapshot: %s, want 201, 404 or 409", snapR)
				}
				if l, _ := listSnapshots(t, s, ka, ""); !sameSet(snapshotIDs(l), kept) {
					t.Errorf("snapshots listed: %v, want those answered 201: %v", snapshotIDs(l), kept)
				}
				if got := layers(); len(got) != len(kept) {
					t.Errorf("layers on disk: %v, want one per kept snapshot (%d)", got, len(kept))
				}
				if id != "" { // nothing lost
					sb, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": id})
					out := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "ls ~/many | wc -l")
					if got := strings.TrimSpace(out.stdout); got != fmt.Sprint(files) {
						t.Errorf("a sandbox of the snapshot has %s files, want %d", got, files)
					}
					wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, ka, nil), http.StatusNoContent)
				}
				if l := left(t, src.SandboxID); len(l) > 0 {
					t.Errorf("left on the host by the killed sandbox: %v", l)
				}
			})
		}
	}
	for _, id := range kept {
		wantStatus(t, "delete snapshot", s.api(t, http.MethodDelete, "/templates/"+url.PathEscape(id), ka, nil), http.StatusNoContent)
	}
	if left := layers(); len(left) > 0 {
		t.Errorf("layers left once the snapshots are deleted: %v", left)
	}
	if err := s.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if left := e.leaks(); len(left) > 0 {
		t.Errorf("left on the host: %v", left)
	}
}
