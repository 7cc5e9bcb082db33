package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/incus"
)

// incusState is what Incus holds that a namespace-less sandboxd (the e2e
// tests') could have made: layer images (which live only inside an image
// import), sandbox and layer instances and volumes (custom volumes, by
// type and name).
type incusState struct {
	images, instances, volumes []string
}

func takeIncusState(t *testing.T, c *incus.Client) incusState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st incusState
	ims, err := c.Images(ctx)
	if err != nil {
		t.Fatalf("list images: %v", err)
	}
	for _, im := range ims {
		if _, layer := im.Properties["sandboxd.layer"]; !layer || im.Properties["sandboxd.namespace"] != "" {
			continue
		}
		st.images = append(st.images, im.Fingerprint)
	}
	ins, err := c.Instances(ctx, "")
	if err != nil {
		t.Fatalf("list instances: %v", err)
	}
	for _, in := range ins {
		if in.Config["user.sandboxd.namespace"] != "" || in.Config[incusE2EKey] == "" && in.Config[incusLayerKey] == "" {
			continue
		}
		st.instances = append(st.instances, in.Name)
	}
	vs, err := c.StorageVolumes(ctx, "sandboxd")
	if err != nil {
		t.Fatalf("list volumes: %v", err)
	}
	for _, v := range vs {
		if v.Type == "custom" && (v.Config["user.sandboxd.volume"] == "" || v.Config["user.sandboxd.namespace"] != "") {
			continue
		}
		st.volumes = append(st.volumes, v.Type+"/"+v.Name)
	}
	return st
}

// newSince lists what st holds that before did not, but for keep.
func (st incusState) newSince(before incusState, keep ...string) []string {
	var out []string
	for _, l := range [][2][]string{{st.images, before.images}, {st.instances, before.instances}, {st.volumes, before.volumes}} {
		for _, x := range l[0] {
			if !slices.Contains(l[1], x) && !slices.ContainsFunc(keep, func(k string) bool { return strings.Contains(x, k) }) {
				out = append(out, x)
			}
		}
	}
	return out
}

// incusOpsSettled waits until Incus runs no operation: what sandboxd began
// before it was killed goes on inside incusd, and may make its image or
// instance after the restart.
func incusOpsSettled(t *testing.T, c *incus.Client) {
	t.Helper()
	e2eEventually(t, "Incus's operations end", 5*time.Minute, 200*time.Millisecond, func() (bool, string) {
		ops, err := c.RunningOperations(context.Background())
		if err != nil {
			return false, err.Error()
		}
		var d []string
		for _, op := range ops {
			if op.Class == "task" {
				d = append(d, op.Description)
			}
		}
		return len(d) == 0, strings.Join(d, ", ")
	})
}

// TestIncusSnapshotCrashE2E is TestSnapshotCrashE2E on Incus: sandboxd is
// SIGKILLed while Incus makes a snapshot's layer (the commit's instance
// snapshot of the source's root, 256 MiB of it written, copied into a
// layer instance) or a fork's instance, and restarted. Incus
// finishes, or fails, what it was doing on its own; the restart must leave
// no snapshot listed, no image, instance, instance snapshot or volume of
// the cut operation, now or once Incus is done, and the source running and
// able to be snapshotted and forked again.
func TestIncusSnapshotCrashE2E(t *testing.T) {
	for _, op := range []string{"snapshots", "fork"} {
		t.Run(op, func(t *testing.T) {
			e, c := newIncusE2EEnv(t, "a")
			before := takeIncusState(t, c)
			s := e.start()
			ka := e.keys["a"]
			src, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"timeout": 900})
			tok := *src.EnvdAccessToken
			srcName := incus.InstanceName("", src.SandboxID)
			s.mustRun(t, src.SandboxID, tok, "head -c 268435456 /dev/zero > ~/big && echo kept > ~/data && sync")

			inProgress := func() (bool, string) {
				ctx := context.Background()
				if op == "fork" {
					// The fork's instance, made by Incus for sandboxd.
					st := takeIncusState(t, c)
					fresh := st.newSince(before, srcName)
					return len(fresh) > 0, fmt.Sprint(fresh)
				}
				// The commit's instance snapshot, which lives from before
				// the copy into the layer's instance until it is named
				// (a few hundred ms: looked for every 2 ms).
				snaps, err := c.Snapshots(ctx, srcName)
				if err != nil || !slices.ContainsFunc(snaps, func(n string) bool { return strings.HasPrefix(n, "sandboxd-commit-") }) {
					return false, fmt.Sprint(snaps, err)
				}
				return true, ""
			}
			body := map[string]any{}
			if op == "snapshots" {
				body["name"] = "cut"
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = s.tryDo(http.MethodPost, e2eAPIPrefix+"/sandboxes/"+src.SandboxID+"/"+op, ka, body, nil)
			}()
			e2eEventually(t, "the "+op+" under way in Incus", 2*time.Minute, 2*time.Millisecond, inProgress)
			if err := s.stop(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-done

			s = e.start()
			check := func(when string) {
				t.Helper()
				if l, _ := listSnapshots(t, s, ka, ""); len(l) != 0 {
					t.Errorf("snapshots %s: %v", when, l)
				}
				if l, _ := s.list(t, ka, ""); !slices.Equal(e2eIDs(l), []string{src.SandboxID}) {
					t.Errorf("sandboxes %s: %v, want the source alone", when, e2eIDs(l))
				}
			}
			check("after the restart")
			incusOpsSettled(t, c)
			// What Incus made for the cut operation, and the commit's
			// snapshot of the source, are deleted once Incus is done
			// with them (in the background of the restart).
			e2eEventually(t, "nothing of the cut "+op+" in Incus", time.Minute, 200*time.Millisecond, func() (bool, string) {
				left := takeIncusState(t, c).newSince(before, srcName)
				snaps, err := c.Snapshots(context.Background(), srcName)
				if err != nil {
					t.Fatalf("snapshots of the source's instance: %v", err)
				}
				return len(left)+len(snaps) == 0, fmt.Sprint(left, snaps)
			})
			check("once Incus is done")
			// What the restart found to finish (seen with -v).
			for _, l := range s.logLines() {
				if msg, _ := l["msg"].(string); strings.HasPrefix(msg, "incus:") || strings.Contains(msg, "reconcile") {
					t.Logf("restart: %s %v", msg, l)
				}
			}

			if got := s.mustRun(t, src.SandboxID, tok, "cat ~/data; stat -c %s ~/big").stdout; got != "kept\n268435456\n" {
				t.Errorf("the source after the crash reads %q", got)
			}
			// And it can be snapshotted and forked again.
			snap := snapshot(t, s, ka, src.SandboxID, map[string]any{"name": "again"})
			r := s.api(t, http.MethodPost, "/sandboxes/"+src.SandboxID+"/fork", ka, map[string]any{"count": 1})
			wantStatus(t, "fork again", r, http.StatusCreated)
			var forks []e2eForkResult
			e2eDecode(t, "fork", r, &forks)
			if len(forks) != 1 || forks[0].Sandbox == nil {
				t.Fatalf("fork again: %s", r)
			}
			e.track(forks[0].Sandbox.SandboxID, ka)
			if got := s.mustRun(t, forks[0].Sandbox.SandboxID, *forks[0].Sandbox.EnvdAccessToken, "cat ~/data").stdout; got != "kept\n" {
				t.Errorf("the new fork reads %q", got)
			}
			sb, _ := e.create(t, "/v2/sandboxes", ka, map[string]any{"templateID": snap.SnapshotID})
			if got := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "cat ~/data").stdout; got != "kept\n" {
				t.Errorf("a sandbox of the new snapshot reads %q", got)
			}

			e.killAll(s)
			wantStatus(t, "delete the snapshot", s.api(t, http.MethodDelete, "/templates/again", ka, nil), http.StatusNoContent)
			e2eEventually(t, "nothing of the test's left in Incus", time.Minute, 200*time.Millisecond, func() (bool, string) {
				left := takeIncusState(t, c).newSince(before)
				return len(left) == 0, fmt.Sprint(left)
			})
		})
	}
}
