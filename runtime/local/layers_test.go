package local_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// layersDir is where a backend of env keeps its layers.
func (e testEnv) layersDir() string { return filepath.Join(e.root, "templates", "layers") }

// sh runs script as user in sandbox id and returns its stdout; the test
// fails unless it exits 0.
func sh(t *testing.T, b runtime.Backend, id, user, script string) string {
	t.Helper()
	res, err := runtimetest.Exec(t.Context(), b, id, user, "/bin/sh", "-c", script)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q: %v %v", script, res, err)
	}
	return res.Stdout
}

// openEnv opens a backend in mode m on a fresh env, closed at cleanup.
func openEnv(t *testing.T, m local.UserNSMode) (testEnv, *local.Backend) {
	t.Helper()
	env := newEnv(t)
	b := env.openMode(t, m)
	t.Cleanup(func() { _ = b.Close() })
	return env, b
}

// inEachMode runs f as subtests without and with user namespaces.
func inEachMode(t *testing.T, f func(t *testing.T, env testEnv, b *local.Backend)) {
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			env, b := openEnv(t, m)
			f(t, env, b)
		})
	}
}

// createFrom creates a sandbox of template tpl and destroys it at cleanup.
func createFrom(t *testing.T, b runtime.Backend, tpl string) string {
	t.Helper()
	id := mustCreate(t, b, runtime.Spec{Template: tpl, MemoryMB: 128, DiskSizeMB: 64})
	t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
	return id
}

// commit commits sandbox id as layer key, failing the test on error.
func commit(t *testing.T, b *local.Backend, id, key string) {
	t.Helper()
	if err := b.Commit(t.Context(), id, key); err != nil {
		t.Fatalf("Commit(%s, %s) = %v", id, key, err)
	}
}

func define(t *testing.T, b *local.Backend, name, base string, layers ...string) {
	t.Helper()
	if err := b.DefineTemplate(t.Context(), name, base, layers); err != nil {
		t.Fatalf("DefineTemplate(%s, %q, %v) = %v", name, base, layers, err)
	}
}

// TestLayerImportImage: an image the test builds, two layers with a
// whiteout and an opaque directory, imported as a layer, flattened and
// given E2B's user; a template of it alone (read through envd's /files,
// the image has no shell) and one of it on base (with the host's /usr, so
// a shell) show its files, without user namespaces and with.
func TestLayerImportImage(t *testing.T) {
	inEachMode(t, func(t *testing.T, env testEnv, b *local.Backend) {
		ctx := t.Context()
		img := testImage(t,
			testLayer(t, tdir("etc"), reg("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234::/app:/bin/sh\n"),
				reg("etc/group", "root:x:0:\n"), reg("gone", "deleted above"),
				tdir("opq"), reg("opq/old", "hidden above"), tdir("app"),
				tent{name: "app/owned", typ: tar.TypeReg, mode: 0o600, uid: 1234, gid: 1234, data: "app's"}),
			testLayer(t, reg(".wh.gone", ""), tdir("opq"), reg("opq/.wh..wh..opq", ""), reg("opq/new", "kept"),
				reg("marker", "from the image")))
		if err := b.ImportImage(ctx, "img-1", img); err != nil {
			t.Fatal(err)
		}
		if err := b.ImportImage(ctx, "img-1", img); err != nil {
			t.Errorf("ImportImage of an existing key = %v; want nil", err)
		}
		if ok, err := b.HasLayer(ctx, "img-1"); !ok || err != nil {
			t.Errorf("HasLayer = %v, %v; want true", ok, err)
		}
		if err := b.ImportImage(ctx, "../escape", img); !errors.Is(err, runtime.ErrInvalidSpec) {
			t.Errorf("ImportImage with a bad key = %v; want ErrInvalidSpec", err)
		}
		if got := treeOf(t, filepath.Join(env.layersDir(), "img-1")); !slices.Equal(got, []string{
			"app", "app/owned", "etc", "etc/group", "etc/passwd", "home", "home/user", "marker", "opq", "opq/new",
		}) {
			t.Errorf("layer = %v", got)
		}

		define(t, b, "img-alone", "", "img-1")
		define(t, b, "img-on-base", "base", "img-1")
		names, err := b.Templates(ctx)
		if err != nil || !slices.Equal(names, []string{"base", "host", "img-alone", "img-on-base"}) {
			t.Errorf("Templates() = %v, %v", names, err)
		}
		if r, ok := b.TemplateResources("img-alone"); !ok || r != (runtime.Resources{}) {
			t.Errorf("TemplateResources(img-alone) = %v, %v; want zero, true", r, ok)
		}

		id := createFrom(t, b, "img-alone")
		hc := runtimetest.EnvdClient(b, id)
		for path, want := range map[string]string{"/marker": "from the image", "/opq/new": "kept", "/gone": "", "/opq/old": ""} {
			resp, err := hc.Get("http://envd/files?username=root&path=" + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want == "" && resp.StatusCode == 200 || want != "" && string(body) != want {
				t.Errorf("GET %s = %s %q; want %q", path, resp.Status, body, want)
			}
		}

		// Its upper layer holds the mount point made for envd's binary (the
		// image has none): kept in a commit, it does no harm to a sandbox
		// of the stack.
		commit(t, b, id, "img-1-step")
		for _, p := range []string{"opt/sandboxd/envd"} {
			if !exists(filepath.Join(env.layersDir(), "img-1-step", p)) {
				t.Errorf("commit of a sandbox of the image alone: no %s", p)
			}
		}
		define(t, b, "img-step", "", "img-1", "img-1-step")
		resp, err := runtimetest.EnvdClient(b, createFrom(t, b, "img-step")).Get("http://envd/files?username=root&path=/marker")
		if err != nil || resp.StatusCode != 200 {
			t.Errorf("sandbox of the image and its committed step: GET /marker = %v, %v", resp, err)
		} else {
			resp.Body.Close()
		}

		id = createFrom(t, b, "img-on-base")
		got := sh(t, b, id, "root", "cat /marker; echo; ls /opq; test ! -e /gone && echo gone; "+
			"id -u user; id -u app; stat -c %u:%g:%a /app/owned /home/user; cat /proc/self/uid_map")
		wantMap := identityMap
		if b.UserNS() {
			wantMap = userNSMap
		}
		want := "from the image\nnew\ngone\n1000\n1234\n1234:1234:600\n1000:1000:755\n" + wantMap
		if strings.Join(strings.Fields(got), " ") != strings.Join(strings.Fields(want), " ") {
			t.Errorf("sandbox of the image on base sees\n%s\nwant\n%s", got, want)
		}
		if got := sh(t, b, id, "app", "cat /app/owned"); got != "app's" {
			t.Errorf("app reads its file: %q", got)
		}
	})
}

// commitScript makes, in a sandbox of base, every kind of change a layer
// must carry.
const commitScript = `set -e
echo new > /home/user/new && chown 1000:1000 /home/user/new
echo 10.9.9.9 changed >> /etc/hosts
rm /etc/shells
mkdir -p /data/sub && echo a > /data/a && echo x > /data/sub/x
ln -s /etc/hosts /home/user/link
echo h > /opt/h1 && ln /opt/h1 /opt/h2
echo s > /opt/suid && chmod 4755 /opt/suid
mkdir /opt/sticky && chmod 1777 /opt/sticky
touch -d @1600000000 /opt/old
`

// checkScript prints what commitScript changed, for comparison.
const checkScript = `cat /home/user/new; stat -c %u:%g /home/user/new
tail -n 1 /etc/hosts
test ! -e /etc/shells && echo no-shells
readlink /home/user/link
test "$(stat -c %i /opt/h1)" = "$(stat -c %i /opt/h2)" && stat -c %h /opt/h1
stat -c %a:%u /opt/suid /opt/sticky
stat -c %Y /opt/old
`

const checkWant = `new
1000:1000
10.9.9.9 changed
no-shells
/etc/hosts
2
4755:0
1777:0
1600000000
`

// TestLayerCommit: what a sandbox changed, committed as a layer and
// defined on base, is what a new sandbox of that template sees: new,
// changed and deleted files, symlinks, hard links, modes, owners and
// times; a second step on top replaces a directory (opaque in its layer)
// and the two-layer stack shows it. With user namespaces the layer holds
// the ids of inside (unshifted). The sandboxes committed keep running.
func TestLayerCommit(t *testing.T) {
	inEachMode(t, func(t *testing.T, env testEnv, b *local.Backend) {
		ctx := t.Context()

		step1 := createFrom(t, b, "base")
		sh(t, b, step1, "root", commitScript)
		commit(t, b, step1, "step-1")
		if got := sh(t, b, step1, "root", "cat /data/a"); got != "a\n" {
			t.Errorf("committed sandbox after the commit: %q", got)
		}
		commit(t, b, step1, "step-1") // an existing key is kept as it is

		layer := filepath.Join(env.layersDir(), "step-1")
		for _, tc := range []struct {
			path     string
			uid      uint32
			mode     uint32
			whiteout bool
		}{
			{"home/user/new", 1000, unix.S_IFREG | 0o644, false},
			{"opt/suid", 0, unix.S_IFREG | 0o4755, false},
			{"opt/sticky", 0, unix.S_IFDIR | 0o1777, false},
			{"etc/hosts", 0, unix.S_IFREG | 0o644, false},
			{"etc/shells", 0, unix.S_IFCHR, true},
		} {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(layer, tc.path), &st); err != nil {
				t.Errorf("layer: %v", err)
				continue
			}
			if tc.whiteout {
				if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
					t.Errorf("layer's %s: mode %o rdev %d; want a whiteout (char 0/0)", tc.path, st.Mode, st.Rdev)
				}
			} else if st.Mode != tc.mode {
				t.Errorf("layer's %s: mode %o; want %o", tc.path, st.Mode, tc.mode)
			}
			if st.Uid != tc.uid || st.Gid != tc.uid {
				t.Errorf("layer's %s: owner %d:%d; want %d (ids of inside)", tc.path, st.Uid, st.Gid, tc.uid)
			}
		}

		define(t, b, "t1", "base", "step-1")
		step2 := createFrom(t, b, "t1")
		if got := sh(t, b, step2, "root", checkScript); got != checkWant {
			t.Errorf("sandbox of base+step-1 sees\n%s\nwant\n%s", got, checkWant)
		}
		// Step 2 replaces /data (its layer makes it opaque), changes a
		// file of step 1 and deletes another, paused in memory.
		sh(t, b, step2, "root", "rm -rf /data && mkdir /data && echo c > /data/c && echo two > /home/user/new && rm /opt/h2")
		if err := b.Pause(ctx, step2, runtime.PauseMemory); err != nil {
			t.Fatal(err)
		}
		commit(t, b, step2, "step-2")
		if l, err := b.List(ctx); err != nil || !slices.ContainsFunc(l, func(s *runtime.Sandbox) bool {
			return s.ID == step2 && s.State == runtime.StatePaused
		}) {
			t.Errorf("sandbox paused in memory after a commit: not listed paused (%v)", err)
		}
		if v, err := unix.Lgetxattr(filepath.Join(env.layersDir(), "step-2", "data"), "trusted.overlay.opaque", make([]byte, 8)); err != nil || v != 1 {
			t.Errorf("layer step-2's /data: opaque xattr %d, %v; want y", v, err)
		}

		define(t, b, "t2", "base", "step-1", "step-2")
		id := createFrom(t, b, "t2")
		const stackCheck = "find /data | sort; cat /home/user/new; test ! -e /opt/h2 && cat /opt/h1; tail -n 1 /etc/hosts"
		got := sh(t, b, id, "root", stackCheck)
		if want := "/data\n/data/c\ntwo\nh\n10.9.9.9 changed\n"; got != want {
			t.Errorf("sandbox of base+step-1+step-2 sees\n%s\nwant\n%s", got, want)
		}
		// The same stack, as a layer on a defined template.
		define(t, b, "t2-on-t1", "t1", "step-2")
		id = createFrom(t, b, "t2-on-t1")
		if got2 := sh(t, b, id, "root", stackCheck); got2 != got {
			t.Errorf("t2-on-t1 sees %q; want t2's %q", got2, got)
		}
		if _, err := b.Resume(ctx, step2); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLayerCommitPausedToDisk: a sandbox paused to disk commits from its
// saved layer.
func TestLayerCommitPausedToDisk(t *testing.T) {
	_, b := openEnv(t, local.UserNSAuto)
	id := createFrom(t, b, "base")
	sh(t, b, id, "root", "echo disk > /opt/f")
	if err := b.Pause(t.Context(), id, runtime.PauseDisk); err != nil {
		t.Fatal(err)
	}
	commit(t, b, id, "from-disk")
	define(t, b, "t", "base", "from-disk")
	if got := sh(t, b, createFrom(t, b, "t"), "root", "cat /opt/f"); got != "disk\n" {
		t.Errorf("/opt/f = %q", got)
	}
	if err := b.Commit(t.Context(), runtimetest.NewID(), "nobody"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Commit of an unknown sandbox = %v; want ErrNotFound", err)
	}
}

// TestRemoveLayer: a layer that a live sandbox has in its root, running or
// paused either way, is kept; once the sandbox is gone it goes.
func TestRemoveLayer(t *testing.T) {
	env, b := openEnv(t, local.UserNSAuto)
	ctx := t.Context()
	src := createFrom(t, b, "base")
	sh(t, b, src, "root", "echo l > /opt/l")
	commit(t, b, src, "layer")
	define(t, b, "t", "base", "layer")
	id := createFrom(t, b, "t")
	for _, kind := range []runtime.PauseKind{-1, runtime.PauseMemory, runtime.PauseDisk} {
		if kind >= 0 {
			if err := b.Pause(ctx, id, kind); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.RemoveLayer(ctx, "layer"); !errors.Is(err, runtime.ErrInUse) {
			t.Errorf("%s: RemoveLayer of a layer in use = %v; want ErrInUse", kind, err)
		}
		if _, err := b.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := b.RemoveLayer(ctx, "layer"); err != nil {
		t.Errorf("RemoveLayer = %v", err)
	}
	if ok, err := b.HasLayer(ctx, "layer"); ok || err != nil {
		t.Errorf("HasLayer after RemoveLayer = %v, %v", ok, err)
	}
	if ents, _ := os.ReadDir(env.layersDir()); len(ents) != 0 {
		t.Errorf("layer store after RemoveLayer: %v", ents)
	}
	if err := b.RemoveLayer(ctx, "layer"); err != nil {
		t.Errorf("RemoveLayer of a missing layer = %v; want nil", err)
	}
	// The template still names it: creates fail, and say so.
	if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: runtimetest.NewID(), Template: "t"})); err == nil {
		t.Errorf("Create from a template whose layer was removed succeeded")
	}
}

// TestDefineTemplateErrors: what DefineTemplate refuses, and how.
func TestDefineTemplateErrors(t *testing.T) {
	env, b := openEnv(t, local.UserNSAuto)
	ctx := t.Context()
	// Long keys: 40 of them do not fit in mount(2)'s options. Each layer's
	// /f names it.
	var long []string
	for i := range 40 {
		k := fmt.Sprintf("%03d-%s", i, strings.Repeat("k", 124))
		if err := b.ImportImage(ctx, k, testImage(t, testLayer(t, reg("f", k[:3])))); err != nil {
			t.Fatal(err)
		}
		long = append(long, k)
	}
	// More than overlayfs stacks, made as the store keeps them.
	var many []string
	for i := range 501 {
		k := fmt.Sprintf("many-%d", i)
		if err := os.Mkdir(filepath.Join(env.layersDir(), k), 0o755); err != nil {
			t.Fatal(err)
		}
		many = append(many, k)
	}
	for _, tc := range []struct {
		name, tpl, base string
		layers          []string
		want            error
	}{
		{"unknown layer", "t", "base", []string{long[0], "missing"}, runtime.ErrTemplateNotFound},
		{"unknown base", "t", "nope", []string{long[0]}, runtime.ErrTemplateNotFound},
		{"bad name", "a/b", "base", []string{long[0]}, runtime.ErrInvalidSpec},
		{"backend's own", "base", "base", []string{long[0]}, runtime.ErrInvalidSpec},
		{"bad key", "t", "base", []string{"../x"}, runtime.ErrInvalidSpec},
		{"nothing", "t", "", nil, runtime.ErrInvalidSpec},
		{"layer twice", "t", "base", []string{long[0], long[0]}, runtime.ErrInvalidSpec},
		{"too many for overlayfs", "t", "", many, runtime.ErrInvalidSpec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := b.DefineTemplate(ctx, tc.tpl, tc.base, tc.layers); !errors.Is(err, tc.want) {
				t.Errorf("DefineTemplate = %v; want %v", err, tc.want)
			}
		})
	}
	if names, _ := b.Templates(ctx); !slices.Equal(names, []string{"base", "host"}) {
		t.Errorf("Templates() after failed definitions = %v", names)
	}
	// As many as mount(2) takes (with a user namespace's longer paths),
	// and more: the top layer's /f shows.
	for _, n := range []int{18, 40} {
		if n == 40 && !kernelAtLeast(6, 8) {
			continue // overlayfs takes layers one at a time from 6.8
		}
		define(t, b, "deep", "base", long[:n]...)
		want := fmt.Sprintf("%03d/usr/bin/env\n", n-1)
		if got := sh(t, b, createFrom(t, b, "deep"), "root", "cat /f; ls /usr/bin/env"); got != want {
			t.Errorf("sandbox of %d layers on base sees %q; want %q", n, got, want)
		}
	}
	define(t, b, "t", "", long[:5]...)
	if err := b.UndefineTemplate(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.TemplateResources("t"); ok {
		t.Errorf("TemplateResources of an undefined template: ok")
	}
	if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: runtimetest.NewID(), Template: "t"})); !errors.Is(err, runtime.ErrTemplateNotFound) {
		t.Errorf("Create from an undefined template = %v; want ErrTemplateNotFound", err)
	}
	if err := b.UndefineTemplate(ctx, "t"); err != nil {
		t.Errorf("UndefineTemplate of an unknown name = %v", err)
	}
	if err := b.UndefineTemplate(ctx, "base"); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("UndefineTemplate(base) = %v; want ErrInvalidSpec", err)
	}
}

// TestLayerStackRestart: a sandbox of a layer stack survives a restart of
// sandboxd, whose Reconcile keeps the layers though no template names
// them any more, and pauses and resumes both ways under the new backend,
// also after a "reboot" took all of Root but SaveDir.
func TestLayerStackRestart(t *testing.T) {
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			env := newEnv(t)
			opts := env.modeOptions(t, m)
			opts.SaveDir = filepath.Join(t.TempDir(), "saved")
			b1, err := local.New(t.Context(), opts)
			skipWithoutUserNS(t, m, err)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			src := createFrom(t, b1, "base")
			sh(t, b1, src, "root", "echo layered > /opt/f")
			commit(t, b1, src, "l1")
			define(t, b1, "stack", "base", "l1")
			id := mustCreate(t, b1, runtime.Spec{Template: "stack", MemoryMB: 128, DiskSizeMB: 64})
			// Outlives b1 and b2, and SaveDir is the test's: env's cleanup
			// would not see it paused to disk.
			t.Cleanup(func() {
				if b, err := local.New(context.Background(), opts); err == nil {
					_ = b.Destroy(context.Background(), id)
					_ = b.Close()
				}
			})
			sh(t, b1, id, "root", "echo mine > /opt/g")

			// What a crash in the middle of a commit leaves.
			debris := filepath.Join(env.layersDir(), ".tmp-l2-123456")
			if err := os.MkdirAll(filepath.Join(debris, "etc"), 0o755); err != nil {
				t.Fatal(err)
			}
			b2 := reopen(t, opts)
			if ok, _ := b2.HasLayer(ctx, "l1"); !ok {
				t.Fatal("Reconcile of a new backend removed a layer")
			}
			if exists(debris) {
				t.Errorf("Reconcile left %s", debris)
			}
			check := func(b runtime.Backend) {
				t.Helper()
				if got := sh(t, b, id, "root", "cat /opt/f /opt/g; ls /usr/bin/env"); got != "layered\nmine\n/usr/bin/env\n" {
					t.Errorf("sandbox of the stack sees %q", got)
				}
			}
			check(b2)
			if err := b2.RemoveLayer(ctx, "l1"); !errors.Is(err, runtime.ErrInUse) {
				t.Errorf("RemoveLayer after a restart = %v; want ErrInUse", err)
			}
			for _, kind := range []runtime.PauseKind{runtime.PauseMemory, runtime.PauseDisk} {
				if err := b2.Pause(ctx, id, kind); err != nil {
					t.Fatal(err)
				}
				if _, err := b2.Resume(ctx, id); err != nil {
					t.Fatalf("resume from %s: %v", kind, err)
				}
				check(b2)
			}

			// A reboot: only SaveDir and the layers survive (on a disk).
			if err := b2.Pause(ctx, id, runtime.PauseDisk); err != nil {
				t.Fatal(err)
			}
			if err := b2.Destroy(ctx, src); err != nil {
				t.Fatal(err)
			}
			if err := b2.Close(); err != nil {
				t.Fatal(err)
			}
			for _, v := range []string{"templates-idmapped", "sandboxes", "envd"} {
				_ = syscall.Unmount(filepath.Join(env.root, v), syscall.MNT_DETACH)
			}
			if err := os.RemoveAll(filepath.Join(env.root, "sandboxes")); err != nil {
				t.Fatal(err)
			}
			b3 := reopen(t, opts)
			if _, err := b3.Resume(ctx, id); err != nil {
				t.Fatal(err)
			}
			check(b3)
		})
	}
}

// reopen is sandboxd's restart: a new backend on opts, reconciled.
func reopen(t *testing.T, opts local.Options) *local.Backend {
	t.Helper()
	b, err := local.New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Reconcile(t.Context()); err != nil {
		t.Fatalf("Reconcile = %v", err)
	}
	return b
}

// TestDefineTemplateConcurrent: templates defined, redefined and
// undefined while sandboxes are created from them (run with -race).
func TestDefineTemplateConcurrent(t *testing.T) {
	_, b := openEnv(t, local.UserNSAuto)
	ctx := t.Context()
	for _, k := range []string{"a", "b"} {
		if err := b.ImportImage(ctx, k, testImage(t, testLayer(t, tdir("opt"), reg("opt/which", k)))); err != nil {
			t.Fatal(err)
		}
	}
	define(t, b, "t", "base", "a")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			layer := []string{"a", "b"}[i%2]
			if err := b.DefineTemplate(ctx, "t", "base", []string{layer}); err != nil {
				t.Errorf("DefineTemplate = %v", err)
				return
			}
			_ = b.UndefineTemplate(ctx, "other")
			if err := b.DefineTemplate(ctx, "other", "base", []string{layer}); err != nil {
				t.Errorf("DefineTemplate = %v", err)
				return
			}
			_, _ = b.Templates(ctx)
		}
	})
	var creates sync.WaitGroup
	for range 4 {
		creates.Go(func() {
			for range 3 {
				id := runtimetest.NewID()
				if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: id, Template: "t", MemoryMB: 128, DiskSizeMB: 64})); err != nil {
					t.Errorf("Create = %v", err)
					return
				}
				res, err := runtimetest.Exec(ctx, b, id, "root", "/bin/cat", "/opt/which")
				if err != nil || res.Stdout != "a" && res.Stdout != "b" {
					t.Errorf("sandbox of t: %v %v", res, err)
				}
				if err := b.Destroy(ctx, id); err != nil {
					t.Errorf("Destroy = %v", err)
				}
			}
		})
	}
	creates.Wait()
	close(stop)
	wg.Wait()
}

// BaseDigest names a base's content: stable while nothing changes, another
// for another base, and an error for none.
func TestBaseDigest(t *testing.T) {
	_, b := openEnv(t, local.UserNSAuto)
	ctx := t.Context()
	d1, err := b.BaseDigest(ctx, "base")
	if err != nil || len(d1) != 32 {
		t.Fatalf("BaseDigest(base) = %q, %v", d1, err)
	}
	if d2, _ := b.BaseDigest(ctx, "base"); d2 != d1 {
		t.Errorf("BaseDigest(base) changed with nothing changed: %s, %s", d1, d2)
	}
	if err := b.ImportImage(ctx, "img", testImage(t, testLayer(t, reg("f", "x")))); err != nil {
		t.Fatal(err)
	}
	if err := b.DefineTemplate(ctx, "fromimg", "", []string{"img"}); err != nil {
		t.Fatal(err)
	}
	if d, err := b.BaseDigest(ctx, "fromimg"); err != nil || d == d1 {
		t.Errorf("BaseDigest of another base = %q, %v", d, err)
	}
	if _, err := b.BaseDigest(ctx, "nope"); !errors.Is(err, runtime.ErrTemplateNotFound) {
		t.Errorf("BaseDigest(nope): %v", err)
	}
}
