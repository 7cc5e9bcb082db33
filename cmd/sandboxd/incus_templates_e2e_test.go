package main

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestIncusTemplateBuildE2E: E2B's template build on `serve --backend
// incus`: from the base template with every kind of step, and from an image
// in a loopback registry; sandboxes of both see the build's files with
// their owners; a rebuild hits the layer cache. Every layer image the test
// made is deleted by the template deletions (or, failing that, the
// cleanup, which reports them).
func TestIncusTemplateBuildE2E(t *testing.T) {
	e, c := newIncusE2EEnv(t, "a")
	before := ownLayers(t, c)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for name, key := range ownLayers(t, c) {
			if _, had := before[name]; had {
				continue
			}
			t.Errorf("layer %s (%s) left after the templates were deleted", key, name)
			if err := c.DeleteInstance(ctx, name); err != nil {
				t.Errorf("delete layer instance %s: %v", name, err)
			}
		}
	})
	open := testRegistry(t, "", "")
	img, err := testimage.Busybox()
	if err != nil {
		t.Fatal(err)
	}
	pub := pushImage(t, open, "test/busybox:1", "", "", img)
	e.serveArgs = append(e.serveArgs, "--plain-http-registries="+open)
	s := e.start()
	ka := e.keys["a"]

	archive, hash := tarGz(t, map[string]string{"app/": "", "app/hello.txt": "hello from COPY\n"})
	spec := webappSpec(hash)
	var ids []string
	for i, want := range []string{"[5/5] RUN", "CACHED [5/5] RUN"} {
		b := requestBuild(t, s, ka, "webapp", nil)
		uploadFiles(t, s, ka, b.TemplateID, hash, archive)
		t0 := time.Now()
		st := startBuild(t, s, ka, b, spec)
		if st.Status != "ready" {
			t.Fatalf("build %d: %s, reason %+v, logs %q", i, st.Status, st.Reason, st.Logs)
		}
		t.Logf("build %d: %s", i, time.Since(t0).Round(time.Millisecond))
		if !logsContain(st, want) {
			t.Errorf("build %d: logs lack %q: %q", i, want, st.Logs)
		}
		ids = append(ids, b.TemplateID)
	}
	sb, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "webapp", "secure": true})
	out := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken,
		"cat built.txt hello.txt; pwd; stat -c '%U %n' built.txt hello.txt; cat /tmp/started; echo $GREETING")
	want := "hi there\nuser\nhello from COPY\n/home/user/app\nuser built.txt\nuser hello.txt\nup\nhi there\n"
	if out.stdout != want {
		t.Errorf("sandbox of the built template: got %q, want %q", out.stdout, want)
	}

	b := requestBuild(t, s, ka, "bb", nil)
	st := startBuild(t, s, ka, b, map[string]any{
		"fromImage": pub,
		"steps":     []map[string]any{{"type": "RUN", "args": []string{"echo \"$FROM_IMAGE\" > /home/user/from.txt"}}},
	})
	if st.Status != "ready" {
		t.Fatalf("build from %s: %s %+v %q", pub, st.Status, st.Reason, st.Logs)
	}
	ids = append(ids, b.TemplateID)
	sb2, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "bb", "secure": true})
	out = s.mustRun(t, sb2.SandboxID, *sb2.EnvdAccessToken, "cat /home/user/from.txt; id -un; stat -c %U /home/user/from.txt")
	if out.stdout != "yes\nuser\nuser\n" {
		t.Errorf("sandbox of an image template: %q", out.stdout)
	}

	// Deleting the templates collects their layers once no sandbox uses
	// them: kill the sandboxes first.
	for _, id := range []string{sb.SandboxID, sb2.SandboxID} {
		wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+id, ka, nil), http.StatusNoContent)
	}
	time.Sleep(2 * time.Second) // the instances' background deletion
	for _, id := range slices.Compact(ids) {
		wantStatus(t, "delete template", s.api(t, http.MethodDelete, "/templates/"+id, ka, nil), http.StatusNoContent)
	}
}
