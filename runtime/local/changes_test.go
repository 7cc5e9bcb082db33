package local_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// TestChanges: a sandbox's changes come from its writable layer: added,
// modified and deleted paths (a directory that only holds changes is none),
// an opaque directory, odd names; the export is an OCI layer tar with
// whiteouts and the sandbox's owners; ReadChanged gives both versions.
func TestChanges(t *testing.T) {
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			b := newEnv(t).openMode(t, m)
			id := mustCreate(t, b, runtime.Spec{})
			t.Cleanup(func() { _ = b.Destroy(context.Background(), id) })
			run := func(user, script string) {
				t.Helper()
				res, err := runtimetest.Exec(t.Context(), b, id, user, "/bin/sh", "-c", script)
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("%q: %v %v", script, res, err)
				}
			}
			// Before any change the layer holds what envd's start made, if
			// anything; the test looks at its own paths only.
			run("root", `echo extra >> /etc/hostname && rm /etc/hosts &&
				mkdir -p /etc/opq && rm -rf /etc/opq && mkdir /etc/opq && touch /etc/opq/new`)
			run("user", `mkdir -p ~/proj/src && echo hello > ~/proj/src/main.go && printf x > "$HOME/odd
name" && ln -s main.go ~/proj/src/link && mkfifo ~/fifo && touch "$HOME/$(printf 'bad\377')"`)
			// A directory of the template replaced by a new one: opaque.
			res, err := runtimetest.Exec(t.Context(), b, id, "root", "/bin/sh", "-c",
				`d=$(find /etc -mindepth 1 -maxdepth 1 -type d | sort | head -1) && rm -rf "$d" && mkdir "$d" && touch "$d/new" && printf %s "$d"`)
			if err != nil || res.ExitCode != 0 || res.Stdout == "" {
				t.Fatalf("replace a directory of /etc: %v %v", res, err)
			}
			opaqueDir := res.Stdout
			chs, got := changesOf(t, b, id)
			for _, w := range []struct {
				path   string
				kind   runtime.ChangeKind
				opaque bool
			}{
				{"/etc/hostname", runtime.ChangeModified, false},
				{"/etc/hosts", runtime.ChangeDeleted, false},
				{"/home/user/proj", runtime.ChangeAdded, false},
				{"/home/user/proj/src/main.go", runtime.ChangeAdded, false},
				{"/home/user/proj/src/link", runtime.ChangeAdded, false},
				{"/home/user/odd\nname", runtime.ChangeAdded, false},
				{"/home/user/fifo", runtime.ChangeAdded, false},
				{"/home/user/bad\xff", runtime.ChangeAdded, false},
				{opaqueDir, runtime.ChangeModified, true},
				{opaqueDir + "/new", runtime.ChangeAdded, false},
			} {
				c, ok := got[w.path]
				if !ok || c.Kind != w.kind || c.Opaque != w.opaque {
					t.Errorf("change of %q = %+v (present %v), want %s opaque=%v", w.path, c, ok, w.kind, w.opaque)
				}
			}
			if c := got["/home/user/proj/src/main.go"]; c.Size != 6 || !c.Mode.IsRegular() {
				t.Errorf("main.go: %+v, want a 6-byte file", c)
			}
			for _, p := range []string{"/etc", "/home/user", "/home"} {
				if c, ok := got[p]; ok {
					t.Errorf("%s is listed (%+v): it only holds changes", p, c)
				}
			}
			if !slices.IsSortedFunc(chs, func(a, b runtime.Change) int { return strings.Compare(a.Path, b.Path) }) {
				t.Errorf("changes not sorted by path")
			}

			var buf bytes.Buffer
			if err := b.ExportChanges(t.Context(), id, &buf); err != nil {
				t.Fatal(err)
			}
			tr := tar.NewReader(&buf)
			entries := map[string]*tar.Header{}
			contents := map[string]string{}
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				entries[h.Name] = h
				if h.Typeflag == tar.TypeReg {
					data, _ := io.ReadAll(tr)
					contents[h.Name] = string(data)
				}
			}
			for _, name := range []string{"etc/.wh.hosts", "etc/hostname", "home/user/proj/src/main.go", "home/user/odd\nname",
				"home/user/proj/src/link", "home/user/proj/", "home/user/fifo", "home/user/bad\xff", opaqueDir[1:] + "/", opaqueDir[1:] + "/.wh..wh..opq"} {
				if entries[name] == nil {
					t.Errorf("export lacks %q", name)
				}
			}
			if h := entries["home/user/proj/src/main.go"]; h != nil && (h.Uid != 1000 || contents[h.Name] != "hello\n") {
				t.Errorf("main.go in the export: uid %d, %q; want uid 1000 (the sandbox's user), hello", h.Uid, contents[h.Name])
			}
			if h := entries["home/user/proj/src/link"]; h != nil && (h.Typeflag != tar.TypeSymlink || h.Linkname != "main.go") {
				t.Errorf("link in the export: %+v", h)
			}

			old, cur, err := b.ReadChanged(t.Context(), id, "/etc/hostname")
			if err != nil || old == nil || cur == nil {
				t.Fatalf("ReadChanged(/etc/hostname) = %v, %v, %v", old, cur, err)
			}
			o, _ := io.ReadAll(old)
			c, _ := io.ReadAll(cur)
			old.Close()
			cur.Close()
			if string(c) != string(o)+"extra\n" {
				t.Errorf("hostname: old %q, now %q", o, c)
			}
			if old, cur, err := b.ReadChanged(t.Context(), id, "/home/user/proj/src/main.go"); err != nil || old != nil || cur == nil {
				t.Errorf("ReadChanged of an added file = %v, %v, %v; want no old version", old, cur, err)
			} else {
				cur.Close()
			}
			if _, err := b.Changes(t.Context(), runtimetest.NewID()); !errors.Is(err, runtime.ErrNotFound) {
				t.Errorf("Changes of a missing sandbox: %v", err)
			}
		})
	}
	var _ runtime.Differ = (*local.Backend)(nil)
}
