package local_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxd/sandboxd/internal/testimage"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// tent is one entry of a test layer.
type tent struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	data     string // content, or link target
}

func reg(n, data string) tent { return tent{name: n, typ: tar.TypeReg, mode: 0o644, data: data} }
func tdir(n string) tent      { return tent{name: n, typ: tar.TypeDir, mode: 0o755} }
func tsym(n, target string) tent {
	return tent{name: n, typ: tar.TypeSymlink, mode: 0o777, data: target}
}

// testLayer builds an uncompressed layer in memory.
func testLayer(t *testing.T, ents ...tent) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: time.Unix(1700000000, 0)}
		switch e.typ {
		case tar.TypeReg:
			h.Size = int64(len(e.data))
		case tar.TypeSymlink, tar.TypeLink:
			h.Linkname = e.data
		case tar.TypeChar:
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testImage(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// saveTarball writes img as a docker-save tarball and returns its path.
func saveTarball(t *testing.T, img v1.Image) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	tag, err := name.NewTag("sandboxd.test/image:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// saveLayout writes imgs as an OCI layout, each named by its ref.
func saveLayout(t *testing.T, imgs map[string]v1.Image) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(p, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for ref, img := range imgs {
		if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": ref,
		})); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("unpacking keeps ownership: needs root")
	}
}

// TestImportOCI: flattening applies whiteouts and upper layers win; modes,
// owners and symlinks are kept; devices are skipped.
func TestImportOCI(t *testing.T) {
	needRoot(t)
	lower := testLayer(t,
		tdir("etc"), reg("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
		reg("gone", "whited out"), tdir("olddir"), reg("olddir/f", "x"),
		reg("over", "lower"), reg("keep", "kept"),
		tent{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		tent{name: "suid", typ: tar.TypeReg, mode: 0o4750, uid: 1234, gid: 2345, data: "s"},
		tent{name: "hl", typ: tar.TypeLink, data: "keep"},
	)
	upper := testLayer(t,
		reg(".wh.gone", ""), reg(".wh.olddir", ""),
		reg("over", "upper"), tsym("link", "/etc/passwd"),
		tent{name: "home", typ: tar.TypeDir, mode: 0o711, uid: 7, gid: 8},
	)
	dest := filepath.Join(t.TempDir(), "rootfs")
	if err := local.ImportOCI(t.Context(), saveTarball(t, testImage(t, lower, upper)), dest); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, _ := os.ReadFile(filepath.Join(dest, p))
		return string(b)
	}
	if got := read("over"); got != "upper" {
		t.Errorf("over = %q; want upper", got)
	}
	if got := read("keep"); got != "kept" {
		t.Errorf("keep = %q; want kept", got)
	}
	for _, p := range []string{"gone", "olddir/f", "dev/null"} {
		if _, err := os.Lstat(filepath.Join(dest, p)); err == nil {
			t.Errorf("%s exists; want it whited out or skipped", p)
		}
	}
	if target, err := os.Readlink(filepath.Join(dest, "link")); err != nil || target != "/etc/passwd" {
		t.Errorf("link -> %q, %v; want /etc/passwd", target, err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(dest, "suid"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o4750 || st.Uid != 1234 || st.Gid != 2345 {
		t.Errorf("suid: mode %o uid %d gid %d; want 4750 1234 2345", st.Mode&0o7777, st.Uid, st.Gid)
	}
	if err := syscall.Lstat(filepath.Join(dest, "home"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o711 || st.Uid != 7 || st.Gid != 8 {
		t.Errorf("home: mode %o uid %d gid %d; want 711 7 8", st.Mode&0o7777, st.Uid, st.Gid)
	}
	var a, b syscall.Stat_t
	if syscall.Stat(filepath.Join(dest, "hl"), &a) != nil || syscall.Stat(filepath.Join(dest, "keep"), &b) != nil || a.Ino != b.Ino {
		t.Errorf("hl is not a hard link of keep")
	}
}

// TestImportOCIWhiteouts: three layers stacked as overlayfs would: an
// opaque directory hides what lower layers had in it (but not what its own
// layer adds), ".wh.NAME" deletes a file or a whole directory, and a
// directory deleted and made again in a higher layer starts empty.
func TestImportOCIWhiteouts(t *testing.T) {
	needRoot(t)
	base := testLayer(t,
		tdir("opq"), reg("opq/old", "hidden"), tdir("opq/sub"), reg("opq/sub/deep", "hidden"),
		tdir("keep"), reg("keep/a", "a"), reg("keep/b", "b"),
		tdir("gone"), reg("gone/x", "x"),
		tdir("again"), reg("again/old", "old"),
		tdir("swap"), reg("swap/old", "old"),
	)
	mid := testLayer(t,
		tdir("opq"), reg("opq/"+".wh..wh..opq", ""), reg("opq/new", "new"),
		reg("keep/.wh.a", ""),
		reg(".wh.gone", ""),
		reg(".wh.again", ""),
		reg("swap", "a file replaces the directory"),
	)
	top := testLayer(t,
		reg("opq/top", "top"),
		tdir("again"), reg("again/fresh", "fresh"),
		tdir("swap"), reg("swap/n", "n"),
		// An opaque marker in the top layer hides lower content only.
		tdir("keep2"), reg("keep2/"+".wh..wh..opq", ""), reg("keep2/mine", "mine"),
	)
	dest := filepath.Join(t.TempDir(), "rootfs")
	if err := local.ImportOCI(t.Context(), saveTarball(t, testImage(t, base, mid, top)), dest); err != nil {
		t.Fatal(err)
	}
	got := treeOf(t, dest)
	want := []string{"again", "again/fresh", "keep", "keep/b", "keep2", "keep2/mine", "opq", "opq/new", "opq/top", "swap", "swap/n"}
	if !slices.Equal(got, want) {
		t.Errorf("imported tree = %v; want %v", got, want)
	}
}

// TestImportOCIWhiteoutSameLayer: a ".wh.NAME" deletes NAME of the lower
// layers only: the same layer may add NAME again (it sorts after its
// whiteout), as a file or as a new, empty directory.
func TestImportOCIWhiteoutSameLayer(t *testing.T) {
	needRoot(t)
	base := testLayer(t,
		reg("f", "old"),
		tdir("d"), reg("d/old", "old"),
	)
	top := testLayer(t,
		reg(".wh.d", ""), tdir("d"), reg("d/new", "new"),
		reg(".wh.f", ""), reg("f", "new"),
	)
	dest := filepath.Join(t.TempDir(), "rootfs")
	if err := local.ImportOCI(t.Context(), saveTarball(t, testImage(t, base, top)), dest); err != nil {
		t.Fatal(err)
	}
	got := treeOf(t, dest)
	if want := []string{"d", "d/new", "f"}; !slices.Equal(got, want) {
		t.Errorf("imported tree = %v; want %v", got, want)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "f")); err != nil || string(b) != "new" {
		t.Errorf("f = %q, %v; want %q", b, err, "new")
	}
}

// TestImportOCIMalicious: entries that would land outside the destination
// are refused, and nothing is written outside it.
func TestImportOCIMalicious(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name    string
		layers  func(outside string) [][]tent
		refused bool // the import fails; otherwise it must be contained
		inside  bool // contained: link/escape is a file inside dest
	}{
		{"dotdot", func(string) [][]tent { return [][]tent{{reg("../../escape", "x")}} }, true, false},
		{"dotdot-inner", func(string) [][]tent { return [][]tent{{reg("a/../../../escape", "x")}} }, true, false},
		{"absolute", func(o string) [][]tent { return [][]tent{{reg(o+"/escape", "x")}} }, true, false},
		{"symlink-abs-then-file", func(o string) [][]tent {
			// mutate.Extract drops entries under a non-directory.
			return [][]tent{{tsym("link", o), reg("link/escape", "x")}}
		}, false, false},
		{"symlink-rel-then-file", func(string) [][]tent {
			return [][]tent{{tsym("link", "../.."), reg("link/escape", "x")}}
		}, false, false},
		{"symlink-then-dir", func(o string) [][]tent {
			return [][]tent{{tsym("link", o), tdir("link/sub"), reg("link/sub/escape", "x")}}
		}, false, false},
		{"symlink-upper-file-lower", func(o string) [][]tent {
			return [][]tent{{reg("link/escape", "x")}, {tsym("link", o)}}
		}, false, false},
		{"hardlink-dotdot", func(string) [][]tent {
			return [][]tent{{tent{name: "hl", typ: tar.TypeLink, data: "../../outside/secret"}}}
		}, true, false},
		{"hardlink-through-symlink", func(o string) [][]tent {
			return [][]tent{{tsym("s", o), tent{name: "hl", typ: tar.TypeLink, data: "s/secret"}}}
		}, true, false},
		{"symlink-lower-file-upper", func(o string) [][]tent {
			return [][]tent{{tsym("link", o)}, {reg("link/escape", "x")}}
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			if err := os.MkdirAll(outside, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
				t.Fatal(err)
			}
			dest := filepath.Join(base, "a", "b")
			var layers []v1.Layer
			for _, l := range tc.layers(outside) {
				layers = append(layers, testLayer(t, l...))
			}
			err := local.ImportOCI(t.Context(), saveTarball(t, testImage(t, layers...)), dest)
			if tc.refused && err == nil {
				t.Errorf("ImportOCI succeeded; want it refused")
			}
			if !tc.refused && err != nil {
				t.Errorf("ImportOCI: %v; want it contained", err)
			}
			t.Logf("ImportOCI: %v", err)
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Errorf("outside dir has %d entries; want only secret", len(ents))
			}
			for _, p := range []string{filepath.Join(base, "escape"), filepath.Join(base, "a", "escape")} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was written", p)
				}
			}
			if tc.inside {
				if fi, err := os.Lstat(filepath.Join(dest, "link", "escape")); err != nil || !fi.Mode().IsRegular() {
					t.Errorf("link/escape inside dest: %v; want the upper layer's file", err)
				}
			}
		})
	}
}

// TestOCITemplate: templates from a docker-save tarball and from an OCI
// layout (by ref name) run envd, which reads the image's files; imports are
// reused by the next backend.
func TestOCITemplate(t *testing.T) {
	env := newEnv(t)
	// No user in this image's passwd: the import adds it.
	saved := testImage(t, testLayer(t,
		tdir("etc"), reg("etc/passwd", "root:x:0:0:root:/:/none\n"), reg("etc/group", "root:x:0:\n"),
		reg("marker", "from the tarball")))
	v1img := testImage(t, testLayer(t,
		tdir("etc"), reg("etc/passwd", "root:x:0:0:root:/root:/none\nuser:x:1000:1000::/home/user:/none\n"),
		reg("etc/group", "root:x:0:\nuser:x:1000:\n"), reg("marker", "from layout v1")))
	v2img := testImage(t, testLayer(t,
		tdir("etc"), reg("etc/passwd", "root:x:0:0:root:/root:/none\nuser:x:1000:1000::/home/user:/none\n"),
		reg("marker", "from layout v2")))
	lay := saveLayout(t, map[string]v1.Image{"v1": v1img, "v2": v2img})
	single := saveLayout(t, map[string]v1.Image{"only": v1img})

	opts := env.options(t)
	opts.Templates = map[string]string{
		"saved":  saveTarball(t, saved),
		"v2":     lay + ":v2",
		"single": single,
	}
	b, err := local.New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	names, err := b.Templates(t.Context())
	if err != nil || !slices.Equal(names, []string{"base", "host", "saved", "single", "v2"}) {
		t.Errorf("Templates() = %v, %v", names, err)
	}
	for tpl, want := range map[string]string{"saved": "from the tarball", "v2": "from layout v2", "single": "from layout v1"} {
		id := runtimetest.NewID()
		if _, err := b.Create(t.Context(), runtimetest.Finish(runtime.Spec{ID: id, Template: tpl})); err != nil {
			t.Fatalf("Create from %s: %v", tpl, err)
		}
		hc := runtimetest.EnvdClient(b, id)
		for _, user := range []string{"root", "user"} {
			resp, err := hc.Get("http://envd/files?path=/marker&username=" + user)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != want {
				t.Errorf("%s: GET /files?path=/marker as %s = %s %q; want %q", tpl, user, resp.Status, body, want)
			}
		}
		if err := b.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}

	tplDirs := func() []string {
		m, _ := filepath.Glob(filepath.Join(env.root, "templates", "oci-*"))
		return m
	}
	before := tplDirs()
	if len(before) != 3 {
		t.Errorf("imported templates = %v; want 3", before)
	}
	// The import added user to the tarball image's passwd, and nothing else.
	for _, d := range before {
		pw, _ := os.ReadFile(filepath.Join(d, "etc", "passwd"))
		if !strings.Contains(string(pw), "\nuser:x:1000:1000:") {
			t.Errorf("%s/etc/passwd has no user: %q", d, pw)
		}
		if fi, err := os.Stat(filepath.Join(d, "home", "user")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
			t.Errorf("%s/home/user: %v; want a directory owned by 1000", d, err)
		}
	}
	b2, err := local.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if after := tplDirs(); !slices.Equal(before, after) {
		t.Errorf("second backend: templates %v; want the first import's %v reused", after, before)
	}

	opts.Templates = map[string]string{"bad": lay} // two images, no ref
	if _, err := local.New(t.Context(), opts); err == nil {
		t.Errorf("New with an ambiguous layout succeeded")
	}
}

// treeOf lists the paths below dir, relative to it, in walk order.
func treeOf(t *testing.T, dir string) []string {
	t.Helper()
	var got []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(dir, p); rel != "." {
			got = append(got, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// An imported image's ENV is the template's environment (TemplateEnv),
// which the control plane gives envd's /init.
func TestOCITemplateEnv(t *testing.T) {
	env := newEnv(t)
	img, err := testimage.Busybox() // ENV PATH=/bin FROM_IMAGE=yes
	if err != nil {
		t.Fatal(err)
	}
	opts := env.options(t)
	opts.Templates = map[string]string{"bb": saveTarball(t, img)}
	b, err := local.New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"PATH": "/bin", "FROM_IMAGE": "yes"}
	if got := b.TemplateEnv("bb"); !maps.Equal(got, want) {
		t.Errorf("TemplateEnv(bb) = %v, want %v", got, want)
	}
	if got := b.TemplateEnv("base"); len(got) != 0 {
		t.Errorf("TemplateEnv(base) = %v, want none", got)
	}
}
