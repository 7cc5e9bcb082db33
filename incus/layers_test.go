package incus_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxd/sandboxd/incus"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// tarEntry is one entry of a test image layer.
type tarEntry struct {
	name, link string
	typ        byte
	mode       int64
	uid        int
	body       string
}

func layerOf(t *testing.T, entries []tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.uid, Size: int64(len(e.body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			_, _ = tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	raw := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// busyboxImage is a two-layer image of the host's static busybox, without
// /etc/passwd, /home or /usr (the import adds them), whose upper layer
// deletes a file, makes a directory opaque and adds a file of uid 1000.
func busyboxImage(t *testing.T) v1.Image {
	t.Helper()
	bin, err := os.ReadFile("/usr/bin/busybox")
	if err != nil {
		t.Skipf("no static busybox on this host: %v", err)
	}
	lower := []tarEntry{
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		{name: "bin/busybox", mode: 0o755, body: string(bin)},
		{name: "data/", typ: tar.TypeDir, mode: 0o755},
		{name: "data/keep", mode: 0o644, body: "keep\n"},
		{name: "data/gone", mode: 0o644, body: "gone\n"},
		{name: "data/dir/", typ: tar.TypeDir, mode: 0o755},
		{name: "data/dir/old", mode: 0o644, body: "old\n"},
	}
	for _, tool := range []string{"sh", "id", "cat", "ls", "stat", "test", "echo", "rm", "mkdir", "chown", "sleep", "tar", "cp"} {
		lower = append(lower, tarEntry{name: "bin/" + tool, typ: tar.TypeSymlink, link: "busybox", mode: 0o777})
	}
	upper := []tarEntry{
		// A hard link before its target's layer: the import writes links last.
		{name: "data/link", typ: tar.TypeLink, link: "data/keep"},
		{name: "data/.wh.gone", mode: 0o644},
		{name: "data/dir/", typ: tar.TypeDir, mode: 0o755},
		{name: "data/dir/.wh..wh..opq", mode: 0o644},
		{name: "data/dir/new", mode: 0o644, body: "new\n"},
		{name: "data/owned", mode: 0o600, uid: 1000, body: "mine\n"},
	}
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, lower), layerOf(t, upper))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// newLayerKey returns a fresh layer key whose layer is removed when the
// test ends, after every sandbox of b is gone; the test fails if the image
// stays.
func newLayerKey(t *testing.T, b *incus.Backend) string {
	key := layerKey()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		l, _ := b.List(ctx)
		for _, s := range l {
			_ = b.Destroy(ctx, s.ID)
		}
		_ = b.WaitDeletes(ctx)
		if err := b.RemoveLayer(ctx, key); err != nil {
			t.Errorf("cleanup: RemoveLayer(%s): %v", key, err)
		}
		if have, err := b.HasLayer(ctx, key); err != nil || have {
			t.Errorf("cleanup: layer %s still there (%v)", key, err)
		}
	})
	return key
}

// layerInstances returns the instances that hold layer key, made or half
// made, and counts the images that carry it (which only an import under
// way has).
func layerInstances(t *testing.T, b *incus.Backend, key string) (ins []*incus.Instance, images int) {
	t.Helper()
	all, err := b.Client().Instances(t.Context(), "user.sandboxd.layer")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range all {
		if in.Config["user.sandboxd.layer"] == key {
			ins = append(ins, in)
		}
	}
	ims, err := b.Client().Images(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range ims {
		if im.Properties["sandboxd.layer"] == key {
			images++
		}
	}
	return ins, images
}

// oneLayer fails the test unless layer key is one whole instance (no half
// made one, no image left by the import) that holds none of the config of
// the sandbox it was made from.
func oneLayer(t *testing.T, b *incus.Backend, key string) {
	t.Helper()
	ins, images := layerInstances(t, b, key)
	if len(ins) != 1 || images != 0 {
		t.Fatalf("layer %s: %d instances, %d images; want 1 instance, no image", key, len(ins), images)
	}
	in := ins[0]
	if !strings.HasPrefix(in.Name, "sbl-") || in.Status != "Stopped" || in.Ephemeral {
		t.Errorf("layer %s: instance %s, %s, ephemeral %v; want a stopped persistent sbl- instance", key, in.Name, in.Status, in.Ephemeral)
	}
	for k := range in.Config {
		if strings.HasPrefix(k, "environment.") || k == "raw.lxc" || k == "user.sandboxd.spec" || k == "user.sandboxd.id" || strings.HasPrefix(k, "limits.") {
			t.Errorf("layer %s keeps the sandbox's %s", key, k)
		}
	}
	if d := slices.Sorted(maps.Keys(in.Devices)); !slices.Equal(d, []string{"root"}) {
		t.Errorf("layer %s: devices %v; want root only", key, d)
	}
	// With full quota groups (not simple quotas), what its root references.
	if n, err := strconv.ParseInt(in.Config["user.sandboxd.layer-size"], 10, 64); !incus.QuotaGuardOf(b).Simple() && (err != nil || n < 1<<20) {
		t.Errorf("layer %s: size %q; want the bytes its root references", key, in.Config["user.sandboxd.layer-size"])
	}
}

func layerKey() string { return "test-" + randHex() + randHex() }

// sh runs script in sandbox id as user and returns its stdout; a failure
// fails the test.
func sh(t *testing.T, b runtime.Backend, id, user, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	r, err := runtimetest.Exec(ctx, b, id, user, "/bin/sh", "-c", script)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("%s in %s as %q: %v %s", script, id, user, err, r)
	}
	return r.Stdout
}

func create(t *testing.T, b runtime.Backend, spec runtime.Spec) string {
	t.Helper()
	spec = runtimetest.Finish(spec)
	if spec.ID == "" {
		spec.ID = runtimetest.NewID()
	}
	if _, err := b.Create(t.Context(), spec); err != nil {
		t.Fatalf("Create(%s from %q): %v", spec.ID, spec.Template, err)
	}
	return spec.ID
}

// TestLayersImportImage: an imported image is a template of its flattened
// root (whiteouts, opaque directory, hard link, owners) with E2B's user
// added; envd runs in it, with and without internet access.
func TestLayersImportImage(t *testing.T) {
	b, _ := newBackend(t)
	ctx := t.Context()
	key := newLayerKey(t, b)
	img := busyboxImage(t)
	t0 := time.Now()
	if err := b.ImportImage(ctx, key, img); err != nil {
		t.Fatalf("ImportImage: %v", err)
	}
	t.Logf("ImportImage of a busybox image (2 MB): %s", time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	if err := b.ImportImage(ctx, key, img); err != nil {
		t.Fatalf("ImportImage again: %v", err)
	}
	t.Logf("ImportImage of an existing key: %s", time.Since(t0).Round(time.Millisecond))
	if have, err := b.HasLayer(ctx, key); err != nil || !have {
		t.Fatalf("HasLayer = %v, %v; want true", have, err)
	}
	oneLayer(t, b, key)
	// Concurrent imports of one new key: both succeed, one layer stays.
	key2 := newLayerKey(t, b)
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- b.ImportImage(ctx, key2, img) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent ImportImage: %v", err)
		}
	}
	oneLayer(t, b, key2)
	tpl := "imp-" + randHex()
	if err := b.DefineTemplate(ctx, tpl, "", []string{key}); err != nil {
		t.Fatalf("DefineTemplate: %v", err)
	}
	if names, _ := b.Templates(ctx); !slices.Contains(names, tpl) {
		t.Errorf("Templates() = %v; want %s in it", names, tpl)
	}
	for _, internet := range []bool{false, true} {
		t0 := time.Now()
		id := create(t, b, runtime.Spec{Template: tpl, AllowInternet: internet})
		t.Logf("Create from the imported image (internet %v): %s", internet, time.Since(t0).Round(time.Millisecond))
		if got := sh(t, b, id, "user", "id -un; id -u; echo $HOME"); got != "user\n1000\n/home/user\n" {
			t.Errorf("as user: %q; want user, 1000, /home/user", got)
		}
		if got := sh(t, b, id, "root", "id -un"); got != "root\n" {
			t.Errorf("as root: id -un = %q", got)
		}
		got := sh(t, b, id, "root", `cd /data && echo $(ls -A) && echo $(ls -A dir) && stat -c '%n %u %h' owned keep link && stat -c '%n %u' /home/user && cat link && test -d /usr && echo usr`)
		want := "dir keep link owned\nnew\nowned 1000 1\nkeep 0 2\nlink 0 2\n/home/user 1000\nkeep\nusr\n"
		if got != want {
			t.Errorf("the imported root:\n%s\nwant:\n%s", got, want)
		}
		if err := b.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLayersCommit: Commit keeps what a sandbox changed (new, changed and
// deleted files, owners of uid 1000 files) in a layer; a template of base
// plus that layer gives new sandboxes exactly that root; a second step
// stacks on it; RemoveLayer waits for the sandboxes that use a layer.
func TestLayersCommit(t *testing.T) {
	b, ns := newBackend(t)
	ctx := t.Context()
	k1, k2 := newLayerKey(t, b), newLayerKey(t, b)

	// Step 1 on base, with internet access as the template builder does.
	box := create(t, b, runtime.Spec{AllowInternet: true, Env: map[string]string{"LAYER_SECRET": "s3"}})
	sh(t, b, box, "root", `set -e
head -c 67108864 /dev/zero > /big && sync
echo changed >> /etc/hostname
rm /etc/issue
mkdir -p /srv/app && echo app > /srv/app/main && chown -R 1000:1000 /srv/app
chmod 4755 /srv/app/main`)
	sh(t, b, box, "user", `echo by-user > /home/user/note`)
	t0 := time.Now()
	if err := b.Commit(ctx, box, k1); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	t.Logf("Commit of base + a few files: %s", time.Since(t0).Round(time.Millisecond))
	// The sandbox keeps running, without the commit's snapshot, and a
	// second Commit of the key is a no-op.
	sh(t, b, box, "root", "true")
	if snaps, err := b.Client().Snapshots(ctx, incus.InstanceName("test-"+ns, box)); err != nil || len(snaps) > 0 {
		t.Errorf("snapshots after Commit: %v, %v; want none", snaps, err)
	}
	if err := b.Commit(ctx, box, k1); err != nil {
		t.Fatalf("Commit again: %v", err)
	}
	oneLayer(t, b, k1)
	if err := b.Destroy(ctx, box); err != nil {
		t.Fatal(err)
	}

	t1 := "one-" + randHex()
	if err := b.DefineTemplate(ctx, t1, incus.DefaultTemplate, []string{k1}); err != nil {
		t.Fatalf("DefineTemplate(base, [k1]): %v", err)
	}
	t0 = time.Now()
	box2 := create(t, b, runtime.Spec{Template: t1, AllowInternet: true, DiskSizeMB: 64})
	t.Logf("first Create from a committed layer: %s", time.Since(t0).Round(time.Millisecond))
	// Nothing of the source sandbox's config comes with its layer; its
	// root's size allows for what the layer holds (base and /big), so
	// the sandbox can write its own 64 MiB, and not much more.
	if got := sh(t, b, box2, "root", `echo "[$LAYER_SECRET]"`); got != "[]\n" {
		t.Errorf("the source sandbox's env in a sandbox of its layer: %q", got)
	}
	sh(t, b, box2, "root", `head -c 50000000 /dev/zero > /mine && sync && rm /mine && sync`)
	if r, err := runtimetest.Exec(ctx, b, box2, "root", "/bin/sh", "-c", `head -c 200000000 /dev/zero > /mine; rc=$?; sync; rm -f /mine; exit $rc`); err != nil || r.ExitCode == 0 {
		t.Errorf("200 MB into a sandbox of 64 MiB disk from a layer: %v, %+v; want a failure", err, r)
	}
	check := `tail -n1 /etc/hostname; test -e /etc/issue && echo issue; stat -c '%n %U %u %a' /srv/app /srv/app/main /home/user/note; cat /home/user/note`
	want1 := "changed\n/srv/app user 1000 755\n/srv/app/main user 1000 4755\n/home/user/note user 1000 644\nby-user\n"
	if got := sh(t, b, box2, "root", check); got != want1 {
		t.Errorf("sandbox of base+[k1]:\n%s\nwant:\n%s", got, want1)
	}
	// Step 2 on the first.
	sh(t, b, box2, "user", `rm /home/user/note && echo two > /srv/app/two`)
	t0 = time.Now()
	if err := b.Commit(ctx, box2, k2); err != nil {
		t.Fatalf("Commit k2: %v", err)
	}
	t.Logf("Commit of a second step: %s", time.Since(t0).Round(time.Millisecond))
	if err := b.Destroy(ctx, box2); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name, base string
		layers     []string
		err        error
	}{
		{"stack", incus.DefaultTemplate, []string{k1, k2}, nil},
		{"on a defined template", t1, []string{k2}, nil},
		{"layer on another stack", incus.DefaultTemplate, []string{k2}, runtime.ErrInvalidSpec},
		{"layers swapped", incus.DefaultTemplate, []string{k2, k1}, runtime.ErrInvalidSpec},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := "two-" + randHex()
			err := b.DefineTemplate(ctx, name, c.base, c.layers)
			if !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
				t.Fatalf("DefineTemplate(%s, %v) = %v; want %v", c.base, c.layers, err, c.err)
			}
			if err != nil {
				return
			}
			defer b.UndefineTemplate(ctx, name)
			id := create(t, b, runtime.Spec{Template: name})
			defer b.Destroy(ctx, id)
			got := sh(t, b, id, "root", `tail -n1 /etc/hostname; test -e /home/user/note && echo note; stat -c '%n %U' /srv/app/two; cat /srv/app/two`)
			if want := "changed\n/srv/app/two user\ntwo\n"; got != want {
				t.Errorf("sandbox of %s+%v:\n%s\nwant:\n%s", c.base, c.layers, got, want)
			}
		})
	}

	// A sandbox on k2 keeps it; once destroyed, the layer can go.
	t2 := "two-" + randHex()
	if err := b.DefineTemplate(ctx, t2, incus.DefaultTemplate, []string{k1, k2}); err != nil {
		t.Fatal(err)
	}
	user := create(t, b, runtime.Spec{Template: t2})
	if err := b.RemoveLayer(ctx, k2); !errors.Is(err, runtime.ErrInUse) {
		t.Fatalf("RemoveLayer of a layer in use = %v; want ErrInUse", err)
	}
	if err := b.UndefineTemplate(ctx, t2); err != nil {
		t.Fatal(err)
	}
	if err := b.RemoveLayer(ctx, k2); !errors.Is(err, runtime.ErrInUse) {
		t.Fatalf("RemoveLayer of a layer in use, template undefined = %v; want ErrInUse", err)
	}
	sh(t, b, user, "root", "test -e /srv/app/two")
	// A template stays defined on a layer that goes (definitions are the
	// caller's), but it no longer starts.
	t3 := "three-" + randHex()
	if err := b.DefineTemplate(ctx, t3, incus.DefaultTemplate, []string{k1, k2}); err != nil {
		t.Fatal(err)
	}
	if err := b.Destroy(ctx, user); err != nil {
		t.Fatal(err)
	}
	if err := b.RemoveLayer(ctx, k2); err != nil {
		t.Fatalf("RemoveLayer after Destroy: %v", err)
	}
	if have, err := b.HasLayer(ctx, k2); err != nil || have {
		t.Fatalf("HasLayer after RemoveLayer = %v, %v", have, err)
	}
	if err := b.RemoveLayer(ctx, k2); err != nil {
		t.Fatalf("RemoveLayer of a missing layer: %v", err)
	}
	for _, tpl := range []string{t2, t3} { // undefined; defined on the removed layer
		if _, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: runtimetest.NewID(), Template: tpl})); !errors.Is(err, runtime.ErrTemplateNotFound) {
			t.Errorf("Create from %s = %v; want ErrTemplateNotFound", tpl, err)
		}
	}
}

// TestDefineTemplateErrors: what DefineTemplate and UndefineTemplate refuse.
func TestDefineTemplateErrors(t *testing.T) {
	b, _ := newBackend(t)
	ctx := t.Context()
	missing := layerKey()
	cases := []struct {
		name, tpl, base string
		layers          []string
		err             error
	}{
		{"unknown layer", "t", incus.DefaultTemplate, []string{missing}, runtime.ErrTemplateNotFound},
		{"unknown layer on an image", "t", "", []string{missing}, runtime.ErrTemplateNotFound},
		{"unknown base", "t", "nope", nil, runtime.ErrTemplateNotFound},
		{"bad name", "a/b", incus.DefaultTemplate, nil, runtime.ErrInvalidSpec},
		{"backend's own", incus.DefaultTemplate, incus.DefaultTemplate, nil, runtime.ErrInvalidSpec},
		{"bad key", "t", incus.DefaultTemplate, []string{"../x"}, runtime.ErrInvalidSpec},
		{"nothing", "t", "", nil, runtime.ErrInvalidSpec},
		{"layer twice", "t", incus.DefaultTemplate, []string{missing, missing}, runtime.ErrInvalidSpec},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := b.DefineTemplate(ctx, c.tpl, c.base, c.layers); !errors.Is(err, c.err) {
				t.Errorf("DefineTemplate(%q, %q, %v) = %v; want %v", c.tpl, c.base, c.layers, err, c.err)
			}
		})
	}
	if err := b.UndefineTemplate(ctx, incus.DefaultTemplate); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("UndefineTemplate(base) = %v; want ErrInvalidSpec", err)
	}
	if err := b.UndefineTemplate(ctx, "never-defined"); err != nil {
		t.Errorf("UndefineTemplate of an undefined name = %v", err)
	}
	// A base-only template is base's image.
	if err := b.DefineTemplate(ctx, "alias-"+randHex(), incus.DefaultTemplate, nil); err != nil {
		t.Errorf("DefineTemplate(base, no layers) = %v", err)
	}
	if _, err := b.HasLayer(ctx, "../x"); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("HasLayer(bad key) = %v; want ErrInvalidSpec", err)
	}
	if err := b.Commit(ctx, runtimetest.NewID(), missing); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Commit of an unknown sandbox = %v; want ErrNotFound", err)
	}
}

// TestLayersRestart: layers outlive the backend (a restarted sandboxd) and
// definitions do not; an adopted sandbox commits on the stack it was made
// from.
func TestLayersRestart(t *testing.T) {
	b1, ns := newBackend(t)
	ctx := t.Context()
	k1, k2 := newLayerKey(t, b1), newLayerKey(t, b1)
	box := create(t, b1, runtime.Spec{})
	sh(t, b1, box, "root", "echo one > /one")
	if err := b1.Commit(ctx, box, k1); err != nil {
		t.Fatal(err)
	}
	t1 := "one-" + randHex()
	if err := b1.DefineTemplate(ctx, t1, incus.DefaultTemplate, []string{k1}); err != nil {
		t.Fatal(err)
	}
	box2 := create(t, b1, runtime.Spec{Template: t1})

	b2 := reopen(t, options(t, ns))
	if have, err := b2.HasLayer(ctx, k1); err != nil || !have {
		t.Fatalf("HasLayer after a restart = %v, %v; want true", have, err)
	}
	if names, _ := b2.Templates(ctx); slices.Contains(names, t1) {
		t.Errorf("Templates() after a restart = %v; definitions do not survive", names)
	}
	sh(t, b2, box2, "root", "echo two > /two")
	if err := b2.Commit(ctx, box2, k2); err != nil {
		t.Fatalf("Commit of an adopted sandbox: %v", err)
	}
	t2 := "two-" + randHex()
	if err := b2.DefineTemplate(ctx, t2, incus.DefaultTemplate, []string{k1, k2}); err != nil {
		t.Fatalf("DefineTemplate on the adopted sandbox's layer: %v", err)
	}
	id := create(t, b2, runtime.Spec{Template: t2})
	if got := sh(t, b2, id, "root", "cat /one /two"); got != "one\ntwo\n" {
		t.Errorf("sandbox of base+[k1,k2] after a restart: %q", got)
	}
	for _, s := range []string{box, box2, id} {
		_ = b2.Destroy(ctx, s)
	}
	_ = b2.WaitDeletes(ctx)
}

// TestLayersReconcile: Reconcile deletes what a dead process's layer
// making left in its namespace (unnamed layer images, half-made layer
// instances), and nothing else: not another namespace's, not what this
// process is making, not a finished layer; a named layer image of an older
// version becomes a layer instance.
func TestLayersReconcile(t *testing.T) {
	b, ns := newBackend(t)
	ctx := t.Context()
	c := b.Client()
	upload := func(namespace, owner string, key ...string) string {
		layer := "orphan"
		if len(key) > 0 {
			layer = key[0]
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		meta := "architecture: x86_64\ncreation_date: 1\nproperties:\n  sandboxd.layer: \"" + layer + "\"\n  sandboxd.stack: \"," + layer + "\"\n  sandboxd.namespace: \"" + namespace + "\"\n  sandboxd.owner: \"" + owner + "\"\n"
		_ = tw.WriteHeader(&tar.Header{Name: "metadata.yaml", Mode: 0o644, Size: int64(len(meta))})
		_, _ = tw.Write([]byte(meta))
		_ = tw.WriteHeader(&tar.Header{Name: "rootfs/", Typeflag: tar.TypeDir, Mode: 0o755})
		_ = tw.Close()
		fp, err := c.UploadImage(ctx, &buf)
		if err != nil {
			t.Fatalf("upload: %v", err)
		}
		t.Cleanup(func() { _ = c.DeleteImage(context.Background(), fp) })
		return fp
	}
	mine, other, live := upload("test-"+ns, "dead"), upload("test-other-"+ns, "dead"), upload("test-"+ns, incus.OwnerOf(b))
	legacyKey := newLayerKey(t, b)
	legacy := upload("test-"+ns, "dead", legacyKey)
	if err := c.CreateImageAlias(ctx, "sandboxd-layer-"+randHex()+"-"+legacyKey, legacy, "an older version's layer"); err != nil {
		t.Fatal(err)
	}
	base, err := c.ImageAlias(ctx, "sandboxd-base")
	if err != nil {
		t.Fatal(err)
	}
	layer := func(name, namespace, owner string) string {
		name += "-" + randHex()
		op, err := c.CreateInstance(ctx, incus.InstancesPost{
			Name: name, Type: "container", Source: incus.InstanceSource{Type: "image", Fingerprint: base},
			Config:   map[string]string{"user.sandboxd.layer": "k", "user.sandboxd.namespace": namespace, "user.sandboxd.owner": owner},
			Devices:  map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": "sandboxd"}},
			Profiles: []string{},
		})
		if err == nil {
			_, err = c.Wait(ctx, op)
		}
		if err != nil {
			t.Fatalf("instance %s: %v", name, err)
		}
		t.Cleanup(func() { _ = c.DeleteInstance(context.Background(), name) })
		return name
	}
	deadTemp := layer("sbt-dead", "test-"+ns, "dead")
	keep := []string{
		layer("sbt-other", "test-other-"+ns, "dead"),
		layer("sbt-"+incus.OwnerOf(b), "test-"+ns, incus.OwnerOf(b)),
		layer("sbl-done", "test-"+ns, "dead"),
	}
	if err := b.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Image(ctx, mine); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("a dead process's layer image of the namespace after Reconcile: %v; want it gone", err)
	}
	if _, err := c.Image(ctx, other); err != nil {
		t.Errorf("another namespace's layer image after Reconcile: %v; want it kept", err)
	}
	if _, err := c.Image(ctx, live); err != nil {
		t.Errorf("this process's layer image after Reconcile: %v; want it kept", err)
	}
	if _, err := c.Instance(ctx, deadTemp); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("a dead process's half-made layer instance after Reconcile: %v; want it gone", err)
	}
	for _, name := range keep {
		if _, err := c.Instance(ctx, name); err != nil {
			t.Errorf("instance %s after Reconcile: %v; want it kept", name, err)
		}
	}
	if _, err := c.Image(ctx, legacy); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("an older version's layer image after Reconcile: %v; want it made an instance and gone", err)
	}
	if have, err := b.HasLayer(ctx, legacyKey); err != nil || !have {
		t.Errorf("HasLayer of a migrated layer image = %v, %v; want true", have, err)
	}
	if err := b.DefineTemplate(ctx, "legacy-"+randHex(), "", []string{legacyKey}); err != nil {
		t.Errorf("DefineTemplate on a migrated layer: %v", err)
	}
}

// TestCancelledAfterThePost: a context that ends once Incus has queued an
// instance's create, before the answer reaches the caller (a stop of
// sandboxd during a replica's copy or a layer's import did this), leaves
// no instance: the POST is seen through, and what it made is deleted.
func TestCancelledAfterThePost(t *testing.T) {
	if os.Getenv("SANDBOXD_INCUS_URL") != "" {
		t.Skip("the test wraps the transport of the unix socket")
	}
	for _, tc := range []struct {
		name string
		do   func(ctx context.Context, b *incus.Backend) error
	}{
		{"a layer's import", func(ctx context.Context, b *incus.Backend) error {
			return b.ImportImage(ctx, layerKey(), busyboxImage(t))
		}},
		{"a sandbox's create", func(ctx context.Context, b *incus.Backend) error {
			_, err := b.Create(ctx, runtimetest.Finish(runtime.Spec{ID: runtimetest.NewID()}))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if skipReason != "" {
				t.Skip(skipReason)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			tr := &cancelAfterPost{base: unixTransport(env("SANDBOXD_INCUS_SOCKET", incus.DefaultSocket)), cancel: cancel}
			ns := randHex()
			opts := options(t, ns)
			opts.Client = incus.NewClientWith(&http.Client{Transport: tr}, "http://incus")
			b, err := incus.New(t.Context(), opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cleanupBackend(t, b, ns) })
			if err := tc.do(ctx, b); !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v; want context.Canceled", err)
			}
			if n := tr.posted.Load(); n != 1 {
				t.Fatalf("%d creates posted; want 1", n)
			}
			if err := b.WaitDeletes(t.Context()); err != nil {
				t.Fatal(err)
			}
			all, err := b.Client().Instances(t.Context(), "user.sandboxd.namespace")
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range all {
				if in.Config["user.sandboxd.namespace"] == opts.Namespace {
					t.Errorf("instance %s (%s) left", in.Name, in.Status)
				}
			}
		})
	}
}

// cancelAfterPost sends requests over base; a POST of an instance is sent
// whole and answered, and then cancel is called, as by a stop between
// Incus queueing the create and its answer reaching the caller. A request
// whose context has ended by then gets that error in place of the answer.
type cancelAfterPost struct {
	base   http.RoundTripper
	cancel context.CancelFunc
	posted atomic.Int32
}

func (c *cancelAfterPost) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || r.URL.Path != "/1.0/instances" {
		return c.base.RoundTrip(r)
	}
	resp, err := c.base.RoundTrip(r.WithContext(context.WithoutCancel(r.Context())))
	c.posted.Add(1)
	c.cancel()
	if err == nil && r.Context().Err() != nil {
		_ = resp.Body.Close()
		return nil, r.Context().Err()
	}
	return resp, err
}

// unixTransport sends requests over the unix socket at path.
func unixTransport(path string) http.RoundTripper {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		DisableKeepAlives: true,
	}
}
