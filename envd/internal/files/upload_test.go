package files

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
	"github.com/sandboxd/sandboxd/envd/internal/auth"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
	"github.com/sandboxd/sandboxd/envd/internal/metadata"
)

func gzipBytes(t *testing.T, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func allBytes() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func TestUploadMultipart(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name  string
		query func() url.Values // nil: no query
		parts []part
		want  map[string][]byte // absolute path -> content, in response order
	}{
		{
			// The SDKs' single-file write: path query plus filename=<path>.
			name:  "single file with path query",
			query: func() url.Values { return url.Values{"path": {e.path("single/a.txt")}} },
			parts: []part{{filename: e.path("single/a.txt"), data: []byte("hello")}},
			want:  map[string][]byte{e.path("single/a.txt"): []byte("hello")},
		},
		{
			// The path query wins over whatever the filename says.
			name:  "path query overrides filename",
			query: func() url.Values { return url.Values{"path": {e.path("override/real.txt")}} },
			parts: []part{{filename: "ignored.txt", data: []byte("x")}},
			want:  map[string][]byte{e.path("override/real.txt"): []byte("x")},
		},
		{
			// The SDKs' multi-file write: no path query, every filename a
			// destination with directories that must not be stripped.
			name: "multiple files with slashes in filenames",
			parts: []part{
				{filename: e.path("multi/one.txt"), data: []byte("1")},
				{filename: e.path("multi/deep/er/two.txt"), data: []byte("22")},
				{name: "comment", data: []byte("not a file")},
				{filename: e.path("multi/deep/three.bin"), data: allBytes()},
			},
			want: map[string][]byte{
				e.path("multi/one.txt"):         []byte("1"),
				e.path("multi/deep/er/two.txt"): []byte("22"),
				e.path("multi/deep/three.bin"):  allBytes(),
			},
		},
		{
			name:  "empty file",
			parts: []part{{filename: e.path("empty.txt")}},
			want:  map[string][]byte{e.path("empty.txt"): {}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q url.Values
			if tt.query != nil {
				q = tt.query()
			}
			got := e.postMultipart(t, q, nil, tt.parts...).entries(t)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d entries %+v; want %d", len(got), got, len(tt.want))
			}
			for _, en := range got {
				want, ok := tt.want[en.Path]
				if !ok {
					t.Errorf("unexpected entry %+v", en)
					continue
				}
				if en.Name != filepath.Base(en.Path) || en.Type != "file" || en.Metadata != nil {
					t.Errorf("entry = %+v; want name %q, type file, no metadata", en, filepath.Base(en.Path))
				}
				if b := readFile(t, en.Path); !bytes.Equal(b, want) {
					t.Errorf("%s = %q; want %q", en.Path, b, want)
				}
			}
			noTempFiles(t, e.dir)
		})
	}
}

func TestUploadOctetStream(t *testing.T) {
	e := newEnv(t)
	data := []byte(strings.Repeat("octet-stream payload\n", 1000))
	tests := []struct {
		name string
		body []byte
		hdr  http.Header
	}{
		{"plain", data, nil},
		{"gzip", gzipBytes(t, data), http.Header{"Content-Encoding": {"gzip"}}},
		{"identity encoding", data, http.Header{"Content-Encoding": {"identity"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := e.path(tt.name + "/file.txt")
			got := e.postRaw(t, path, tt.body, tt.hdr).entries(t)
			want := []entry{{Path: path, Name: "file.txt", Type: "file"}}
			if !slices.EqualFunc(got, want, entryEqual) {
				t.Errorf("entries = %+v; want %+v", got, want)
			}
			if b := readFile(t, path); !bytes.Equal(b, data) {
				t.Errorf("content = %d bytes; want %d", len(b), len(data))
			}
		})
	}
}

func entryEqual(a, b entry) bool {
	return a.Path == b.Path && a.Name == b.Name && a.Type == b.Type &&
		len(a.Metadata) == len(b.Metadata) && func() bool {
		for k, v := range a.Metadata {
			if b.Metadata[k] != v {
				return false
			}
		}
		return true
	}()
}

// Every byte value must survive an upload and a download unchanged, both
// ways in.
func TestAllBytesRoundTrip(t *testing.T) {
	e := newEnv(t)
	data := bytes.Repeat(allBytes(), 3)
	upload := map[string]func(t *testing.T, path string) result{
		"multipart": func(t *testing.T, path string) result {
			return e.postMultipart(t, nil, nil, part{filename: path, data: data})
		},
		"octet-stream": func(t *testing.T, path string) result {
			return e.postRaw(t, path, data, nil)
		},
		"octet-stream gzip": func(t *testing.T, path string) result {
			return e.postRaw(t, path, gzipBytes(t, data), http.Header{"Content-Encoding": {"gzip"}})
		},
	}
	for name, up := range upload {
		t.Run(name, func(t *testing.T) {
			path := e.path(strings.ReplaceAll(name, " ", "-") + ".bin")
			up(t, path).entries(t)
			r := e.get(t, url.Values{"path": {path}}, nil)
			if r.resp.StatusCode != http.StatusOK {
				t.Fatalf("GET status = %d (%s)", r.resp.StatusCode, r.body)
			}
			if !bytes.Equal(r.body, data) {
				t.Errorf("downloaded %x; want %x", r.body, data)
			}
		})
	}
}

// A 10 MB file goes through both upload kinds and back out intact (the
// handler streams it; memory is bounded by copyBufSize, not the file).
func TestLargeFile(t *testing.T) {
	e := newEnv(t)
	data := make([]byte, 10<<20)
	rand.Read(data)
	want := sha256.Sum256(data)
	for _, kind := range []string{"multipart", "octet-stream"} {
		t.Run(kind, func(t *testing.T) {
			path := e.path(kind + "/big.bin")
			if kind == "multipart" {
				e.postMultipart(t, nil, nil, part{filename: path, data: data}).entries(t)
			} else {
				// Stream the body so no Content-Length is known up front.
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(writeAll(pw, data)) }()
				e.post(t, url.Values{"path": {path}}, "application/octet-stream", pr, nil).entries(t)
			}
			r := e.get(t, url.Values{"path": {path}}, nil)
			if r.resp.StatusCode != http.StatusOK {
				t.Fatalf("GET status = %d", r.resp.StatusCode)
			}
			if got := sha256.Sum256(r.body); got != want {
				t.Errorf("downloaded %d bytes with a different hash; want %d bytes", len(r.body), len(data))
			}
		})
	}
}

func writeAll(w io.Writer, data []byte) error {
	_, err := w.Write(data)
	return err
}

func TestUploadOwnership(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another user needs root")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	e := newEnv(t)
	// nobody writes with its own rights: it must be able to traverse to its
	// files and to create them in "owned", a root directory open to all.
	openToNobody(t, e.dir)
	existing := e.path("owned/existing.txt")
	writeFile(t, existing, []byte("nobody's"))
	if err := os.Chmod(e.path("owned"), 0o777); err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	if err := os.Chown(existing, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(existing, 0o640); err != nil {
		t.Fatal(err)
	}

	q := url.Values{"username": {"nobody"}}
	fresh := e.path("owned/new/dir/file.txt")
	e.postMultipart(t, q, nil, part{filename: fresh, data: []byte("a")}, part{filename: existing, data: []byte("b")}).entries(t)

	for _, p := range []string{fresh, e.path("owned/new/dir"), e.path("owned/new"), existing} {
		st := stat(t, p)
		if got := idString(st.Uid); got != nobody.Uid || idString(st.Gid) != nobody.Gid {
			t.Errorf("%s owned by %d:%d; want %s:%s", p, st.Uid, st.Gid, nobody.Uid, nobody.Gid)
		}
	}
	// A directory that already existed keeps its owner.
	if st := stat(t, e.path("owned")); st.Uid != 0 {
		t.Errorf("pre-existing dir owner = %d; want 0", st.Uid)
	}
	// Overwriting keeps the old permissions, as truncation would.
	if fi, err := os.Stat(existing); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("overwritten file mode = %v, %v; want 0640", fi.Mode(), err)
	}
}

// openToNobody makes dir and its parents below the temp dir searchable by
// every user: a test's temporary directories are 0700.
func openToNobody(t *testing.T, dir string) {
	t.Helper()
	for d := dir; strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, fi.Mode().Perm()|0o055); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFilesAsUser: a request that names a user reads and writes with that
// user's rights, as a shell of theirs would, and leaves root's requests
// unaffected on whatever thread they run next.
func TestFilesAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching to another user needs root")
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skip("no user nobody")
	}
	e := newEnv(t)
	openToNobody(t, e.dir)
	secret := e.path("secret.txt") // like /etc/shadow: root's, 0600
	writeFile(t, secret, []byte("hash"))
	if err := os.Chmod(secret, 0o600); err != nil {
		t.Fatal(err)
	}
	rootDir := e.path("rootdir") // like /root or /etc: root's, 0755
	if err := os.Mkdir(rootDir, 0o755); err != nil {
		t.Fatal(err)
	}
	asNobody := func(path string) url.Values { return url.Values{"path": {path}, "username": {"nobody"}} }
	for i := 0; i < 20; i++ { // many requests: threads get reused, or must not be
		e.get(t, asNobody(secret), nil).wantError(t, http.StatusForbidden)
		e.post(t, asNobody(filepath.Join(rootDir, "x.txt")), "application/octet-stream",
			bytes.NewReader([]byte("x")), nil).wantError(t, http.StatusForbidden)
		e.post(t, asNobody(filepath.Join(rootDir, "sub/x.txt")), "application/octet-stream",
			bytes.NewReader([]byte("x")), nil).wantError(t, http.StatusForbidden)
		asRoot := url.Values{"path": {secret}, "username": {"root"}}
		if r := e.get(t, asRoot, nil); r.resp.StatusCode != http.StatusOK || string(r.body) != "hash" {
			t.Fatalf("root GET = %d %q; want 200 %q", r.resp.StatusCode, r.body, "hash")
		}
	}
	if _, err := os.Stat(filepath.Join(rootDir, "x.txt")); !os.IsNotExist(err) {
		t.Errorf("nobody wrote into root's directory (stat err %v)", err)
	}
	if _, err := os.Stat(filepath.Join(rootDir, "sub")); !os.IsNotExist(err) {
		t.Errorf("nobody made a directory in root's directory (stat err %v)", err)
	}
	// Its own files nobody reads and writes as before.
	mine := e.path("rootdir-free/mine.txt")
	if err := os.Mkdir(filepath.Dir(mine), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(mine), 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	e.post(t, asNobody(mine), "application/octet-stream", bytes.NewReader([]byte("m")), nil).entries(t)
	if r := e.get(t, asNobody(mine), nil); r.resp.StatusCode != http.StatusOK || string(r.body) != "m" {
		t.Errorf("nobody GET own file = %d %q", r.resp.StatusCode, r.body)
	}
}

func stat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

func idString(id uint32) string { return strconv.FormatUint(uint64(id), 10) }

func TestUploadErrors(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.path("adir"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, e.path("afile"), []byte("x"))
	ct, dup := multipartBody(t, part{filename: e.path("dup.txt"), data: []byte("1")}, part{filename: e.path("dup.txt"), data: []byte("2")})
	ctAlias, dupAlias := multipartBody(t, part{filename: e.path("alias.txt")}, part{filename: e.path("sub/../alias.txt")})
	ctTwo, two := multipartBody(t, part{data: []byte("1")}, part{data: []byte("2")})
	ctNone, none := multipartBody(t, part{name: "other", filename: e.path("x"), data: []byte("1")})
	ctNoName, noName := multipartBody(t, part{data: []byte("1")})
	tests := []struct {
		name   string
		query  url.Values
		ct     string
		body   []byte
		hdr    http.Header
		status int
	}{
		{"duplicate filename", nil, ct, dup, nil, http.StatusBadRequest},
		{"duplicate after resolution", nil, ctAlias, dupAlias, nil, http.StatusBadRequest},
		{"path query with two parts", url.Values{"path": {e.path("two.txt")}}, ctTwo, two, nil, http.StatusBadRequest},
		{"no file part", nil, ctNone, none, nil, http.StatusBadRequest},
		{"file part without filename or path", nil, ctNoName, noName, nil, http.StatusBadRequest},
		{"octet-stream without path", nil, "application/octet-stream", []byte("x"), nil, http.StatusBadRequest},
		{"octet-stream into a directory", url.Values{"path": {e.path("adir")}}, "application/octet-stream", []byte("x"), nil, http.StatusBadRequest},
		{"parent is a file", url.Values{"path": {e.path("afile/sub.txt")}}, "application/octet-stream", []byte("x"), nil, http.StatusBadRequest},
		{"unsupported content type", url.Values{"path": {e.path("t.txt")}}, "text/plain", []byte("x"), nil, http.StatusBadRequest},
		{"no content type", url.Values{"path": {e.path("t.txt")}}, "", []byte("x"), nil, http.StatusBadRequest},
		{"multipart without boundary", url.Values{"path": {e.path("t.txt")}}, "multipart/form-data", []byte("x"), nil, http.StatusBadRequest},
		{"malformed multipart", nil, ct, []byte("garbage"), nil, http.StatusBadRequest},
		{"truncated multipart", nil, ct, dup[:len(dup)/2], nil, http.StatusBadRequest},
		{"unsupported content encoding", url.Values{"path": {e.path("t.txt")}}, "application/octet-stream", []byte("x"), http.Header{"Content-Encoding": {"br"}}, http.StatusBadRequest},
		{"not gzip", url.Values{"path": {e.path("t.txt")}}, "application/octet-stream", []byte("plain"), http.Header{"Content-Encoding": {"gzip"}}, http.StatusBadRequest},
		{"tilde user", url.Values{"path": {"~root/x"}}, "application/octet-stream", []byte("x"), nil, http.StatusBadRequest},
		{"malformed query", nil, "application/octet-stream", []byte("x"), nil, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := e.url(tt.query)
			if tt.name == "malformed query" {
				u = e.base + "/files?path=%zz"
			}
			req, err := http.NewRequest(http.MethodPost, u, bytes.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if tt.ct != "" {
				req.Header.Set("Content-Type", tt.ct)
			}
			addHeaders(req.Header, tt.hdr)
			r := e.do(t, req)
			r.wantError(t, tt.status)
			noTempFiles(t, e.dir)
		})
	}
	if _, err := os.Stat(e.path("t.txt")); !os.IsNotExist(err) {
		t.Errorf("a failed upload created t.txt (stat err %v)", err)
	}
}

// A failed upload of a new file leaves nothing behind.
func TestFailedUploadOfNewFileLeavesNothing(t *testing.T) {
	e := newEnv(t)
	big := make([]byte, 1<<20)
	rand.Read(big)
	gz := gzipBytes(t, big)
	path := e.path("gone/me.txt")
	ct, mp := multipartBody(t, part{filename: path, data: big})
	tests := []struct {
		name string
		ct   string
		body []byte
		hdr  http.Header
	}{
		{"truncated gzip", "application/octet-stream", gz[:len(gz)/2], http.Header{"Content-Encoding": {"gzip"}}},
		{"truncated multipart part", ct, mp[:len(mp)-1000], nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.post(t, url.Values{"path": {path}}, tt.ct, bytes.NewReader(tt.body), tt.hdr)
			r.wantError(t, http.StatusBadRequest)
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("after a failed upload the new file exists (err %v)", err)
			}
		})
	}
}

// An overwrite rewrites the file in place, as E2B's envd does: the inode
// stays, so a hard link sees the new content (and watchers see a WRITE of
// the file, not a rename of a temporary one).
func TestUploadOverwriteInPlace(t *testing.T) {
	e := newEnv(t)
	path := e.path("inplace.txt")
	writeFile(t, path, []byte("old"))
	link := e.path("hardlink.txt")
	if err := os.Link(path, link); err != nil {
		t.Fatal(err)
	}
	e.postRaw(t, path, []byte("new content"), nil).entries(t)
	if b := readFile(t, link); string(b) != "new content" {
		t.Errorf("hard link reads %q; want the new content", b)
	}
	entries, err := os.ReadDir(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range entries {
		if strings.HasPrefix(d.Name(), ".") {
			t.Errorf("unexpected hidden file %s after upload", d.Name())
		}
	}
}

// A full disk is 507, which the SDKs turn into NotEnoughSpaceError.
// /dev/full fails every write with ENOSPC.
func TestUploadNoSpace(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	if f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0); err != nil {
		t.Skipf("cannot open /dev/full: %v", err)
	} else {
		f.Close()
	}
	e := newEnv(t)
	r := e.postRaw(t, "/dev/full", []byte("data"), nil)
	r.wantError(t, http.StatusInsufficientStorage)
}

func TestUploadOverwrite(t *testing.T) {
	e := newEnv(t)
	path := e.path("over.txt")
	writeFile(t, path, []byte("a much longer old content"))
	e.postRaw(t, path, []byte("new"), nil).entries(t)
	if b := readFile(t, path); string(b) != "new" {
		t.Errorf("content = %q; want %q", b, "new")
	}
}

// Writing to a symlink replaces the file it points to, as `echo > link`
// does, and keeps the link.
func TestUploadThroughSymlink(t *testing.T) {
	e := newEnv(t)
	real := e.path("real.txt")
	link := e.path("link.txt")
	writeFile(t, real, []byte("old"))
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	got := e.postRaw(t, link, []byte("new"), http.Header{"X-Metadata-K": {"v"}}).entries(t)
	if len(got) != 1 || got[0].Path != link || got[0].Metadata["k"] != "v" {
		t.Errorf("entries = %+v; want the link path with metadata k=v", got)
	}
	if b := readFile(t, real); string(b) != "new" {
		t.Errorf("target content = %q; want %q", b, "new")
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("link replaced: mode %v, err %v", fi.Mode(), err)
	}
}

// A relative path is taken from the user's home.
func TestUploadRelativePath(t *testing.T) {
	e := newEnv(t)
	cur, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	probe, err := os.MkdirTemp(cur.HomeDir, ".sandboxd-files-test-")
	if err != nil {
		t.Skipf("home %s not writable: %v", cur.HomeDir, err)
	}
	t.Cleanup(func() { os.RemoveAll(probe) })
	rel := filepath.Join(filepath.Base(probe), "rel.txt")
	got := e.postRaw(t, rel, []byte("r"), nil).entries(t)
	want := filepath.Join(cur.HomeDir, rel)
	if len(got) != 1 || got[0].Path != want {
		t.Fatalf("entries = %+v; want path %s", got, want)
	}
	r := e.get(t, url.Values{"path": {rel}}, nil)
	if r.resp.StatusCode != http.StatusOK || string(r.body) != "r" {
		t.Errorf("GET %s = %d %q; want 200 %q", rel, r.resp.StatusCode, r.body, "r")
	}
}

func TestUploadMetadata(t *testing.T) {
	e := newEnv(t)
	if err := metadata.Replace(e.dir, map[string]string{"probe": "1"}); err != nil {
		t.Skipf("no user xattrs on %s: %v", e.dir, err)
	}
	path := e.path("meta.txt")

	t.Run("stored and returned", func(t *testing.T) {
		hdr := http.Header{
			"X-Metadata-Owner":     {"alice"},
			"X-Metadata-UPPER-Key": {"Value With Spaces"},
			"x-metadata-lower":     {"l"},
		}
		got := e.postRaw(t, path, []byte("x"), hdr).entries(t)
		want := map[string]string{"owner": "alice", "upper-key": "Value With Spaces", "lower": "l"}
		if len(got) != 1 || !entryEqual(got[0], entry{Path: path, Name: "meta.txt", Type: "file", Metadata: want}) {
			t.Errorf("entries = %+v; want metadata %v", got, want)
		}
		m, err := metadata.Read(path)
		if err != nil || !entryEqual(entry{Metadata: m}, entry{Metadata: want}) {
			t.Errorf("metadata.Read = %v, %v; want %v", m, err, want)
		}
	})
	t.Run("replaced by the next upload", func(t *testing.T) {
		got := e.postRaw(t, path, []byte("y"), http.Header{"X-Metadata-Owner": {"bob"}}).entries(t)
		if len(got) != 1 || len(got[0].Metadata) != 1 || got[0].Metadata["owner"] != "bob" {
			t.Errorf("entries = %+v; want only owner=bob", got)
		}
	})
	t.Run("cleared by an upload without any", func(t *testing.T) {
		got := e.postRaw(t, path, []byte("z"), nil).entries(t)
		if len(got) != 1 || got[0].Metadata != nil {
			t.Errorf("entries = %+v; want no metadata", got)
		}
		if m, err := metadata.Read(path); err != nil || len(m) != 0 {
			t.Errorf("metadata.Read = %v, %v; want none", m, err)
		}
	})
	t.Run("same for every multipart file", func(t *testing.T) {
		got := e.postMultipart(t, nil, http.Header{"X-Metadata-Tag": {"t"}},
			part{filename: e.path("m/1.txt")}, part{filename: e.path("m/2.txt")}).entries(t)
		if len(got) != 2 {
			t.Fatalf("entries = %+v; want 2", got)
		}
		for _, en := range got {
			if m, _ := metadata.Read(en.Path); en.Metadata["tag"] != "t" || m["tag"] != "t" {
				t.Errorf("%s: response %v, on disk %v; want tag=t", en.Path, en.Metadata, m)
			}
		}
	})

	invalid := []struct {
		name string
		hdr  http.Header
	}{
		{"non-ASCII value", http.Header{"X-Metadata-K": {"caf\xc3\xa9"}}},
		{"key too long", http.Header{"X-Metadata-" + strings.Repeat("k", metadata.MaxKeyLen+1): {"v"}}},
		{"too large in total", http.Header{"X-Metadata-A": {strings.Repeat("a", 3000)}, "X-Metadata-B": {strings.Repeat("b", 3000)}}},
	}
	for _, tt := range invalid {
		t.Run("invalid: "+tt.name, func(t *testing.T) {
			p := e.path("invalid-" + strings.ReplaceAll(tt.name, " ", "-"))
			r := e.postRaw(t, p, []byte("x"), tt.hdr)
			r.wantError(t, http.StatusBadRequest)
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("file written despite invalid metadata (stat err %v)", err)
			}
		})
	}
}

func TestMethodNotAllowed(t *testing.T) {
	e := newEnv(t)
	req, err := http.NewRequest(http.MethodDelete, e.url(url.Values{"path": {e.path("x")}}), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := e.do(t, req)
	r.wantError(t, http.StatusMethodNotAllowed)
}

// patternReader yields n bytes without holding them, so the test itself
// allocates nothing in proportion to the upload.
type patternReader struct{ n int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.n {
		b = b[:p.n]
	}
	for i := range b {
		b[i] = byte(i)
	}
	p.n -= int64(len(b))
	return len(b), nil
}

// Uploads stream: the bytes allocated while storing a 64 MB file stay a
// small fraction of its size, for both body kinds.
func TestUploadConstantMemory(t *testing.T) {
	agenttest.InProcessOnly(t, "measures the test process's own allocations (runtime.MemStats) while the handler runs in it")
	const size = 64 << 20
	cur, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	h := New(quietLog(), execctx.New(cur.Username), &auth.Token{})
	dir := t.TempDir()
	for _, kind := range []string{"octet-stream", "multipart"} {
		t.Run(kind, func(t *testing.T) {
			path := filepath.Join(dir, kind+".bin")
			var body io.Reader = &patternReader{n: size}
			ct := "application/octet-stream"
			if kind == "multipart" {
				pr, pw := io.Pipe()
				mw := multipart.NewWriter(pw)
				ct = mw.FormDataContentType()
				go func() {
					w, err := mw.CreateFormFile("file", path)
					if err == nil {
						_, err = io.Copy(w, &patternReader{n: size})
					}
					if err == nil {
						err = mw.Close()
					}
					pw.CloseWithError(err)
				}()
				body = pr
			}
			req := httptest.NewRequest(http.MethodPost, "/files?"+url.Values{"path": {path}}.Encode(), body)
			req.Header.Set("Content-Type", ct)
			rec := httptest.NewRecorder()

			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			h.ServeHTTP(rec, req)
			runtime.ReadMemStats(&after)

			if rec.Code != http.StatusOK {
				t.Fatalf("status = %d (%s)", rec.Code, rec.Body)
			}
			if fi, err := os.Stat(path); err != nil || fi.Size() != size {
				t.Fatalf("stored file: %v, %v; want %d bytes", fi, err, size)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/8 {
				t.Errorf("storing %d bytes allocated %d bytes; want streaming (< %d)", size, alloc, size/8)
			}
		})
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
