package files

import (
	"bytes"
	"compress/gzip"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func TestDownload(t *testing.T) {
	e := newEnv(t)
	data := []byte("hello, download\n")
	path := e.path("dl/hello.txt")
	writeFile(t, path, data)

	r := e.get(t, url.Values{"path": {path}}, nil)
	if r.resp.StatusCode != http.StatusOK {
		t.Fatalf("status = %d (%s); want 200", r.resp.StatusCode, r.body)
	}
	if !bytes.Equal(r.body, data) {
		t.Errorf("body = %q; want %q", r.body, data)
	}
	checks := map[string]string{
		"Content-Length":      strconv.Itoa(len(data)),
		"Content-Disposition": `inline; filename=hello.txt`,
		"Vary":                "Accept-Encoding",
		"Content-Encoding":    "",
		"Accept-Ranges":       "bytes",
	}
	for h, want := range checks {
		if got := r.resp.Header.Get(h); got != want {
			t.Errorf("%s = %q; want %q", h, got, want)
		}
	}
	if r.resp.Header.Get("Last-Modified") == "" || r.resp.Header.Get("Content-Type") == "" {
		t.Errorf("missing Last-Modified or Content-Type: %v", r.resp.Header)
	}
}

func TestDownloadEmptyFile(t *testing.T) {
	e := newEnv(t)
	path := e.path("empty")
	writeFile(t, path, nil)
	// JS reads Content-Length: 0 as an empty file; SDK clients send
	// Accept-Encoding: gzip by default, which must not change that.
	for _, accept := range []string{"", "gzip, deflate, br"} {
		r := e.get(t, url.Values{"path": {path}}, http.Header{"Accept-Encoding": {accept}})
		if r.resp.StatusCode != http.StatusOK || len(r.body) != 0 || r.resp.Header.Get("Content-Length") != "0" ||
			r.resp.Header.Get("Content-Encoding") != "" {
			t.Errorf("Accept-Encoding %q: got %d, %q, Content-Length %q, Content-Encoding %q; want 200, empty, 0, none",
				accept, r.resp.StatusCode, r.body, r.resp.Header.Get("Content-Length"), r.resp.Header.Get("Content-Encoding"))
		}
	}
}

// Files whose size stat cannot tell (procfs) are streamed whole.
func TestDownloadProcFile(t *testing.T) {
	if b, err := os.ReadFile("/proc/version"); err != nil || len(b) == 0 {
		t.Skip("no procfs")
	}
	e := newEnv(t)
	r := e.get(t, url.Values{"path": {"/proc/version"}}, nil)
	if r.resp.StatusCode != http.StatusOK || len(r.body) == 0 {
		t.Errorf("GET /proc/version = %d, %d bytes; want 200 with content", r.resp.StatusCode, len(r.body))
	}
}

func TestDownloadContentDisposition(t *testing.T) {
	e := newEnv(t)
	for _, name := range []string{"plain.txt", "with space.txt", `quo"te.txt`, "semi;colon", "ünïcödé.txt", "back\\slash"} {
		t.Run(name, func(t *testing.T) {
			path := e.path(name)
			writeFile(t, path, []byte("x"))
			r := e.get(t, url.Values{"path": {path}}, nil)
			if r.resp.StatusCode != http.StatusOK {
				t.Fatalf("status = %d (%s)", r.resp.StatusCode, r.body)
			}
			cd := r.resp.Header.Get("Content-Disposition")
			disp, params, err := mime.ParseMediaType(cd)
			if err != nil || disp != "inline" || params["filename"] != name {
				t.Errorf("Content-Disposition %q parses as %q %v (%v); want inline with filename %q",
					cd, disp, params, err, name)
			}
		})
	}
}

func TestDownloadErrors(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.path("adir"), 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := e.path("fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// msg, when set, is E2B envd's text for the same failure.
	tests := []struct {
		name   string
		query  url.Values
		status int
		msg    string
	}{
		{"directory", url.Values{"path": {e.path("adir")}}, http.StatusBadRequest, "path '" + e.path("adir") + "' is a directory"},
		{"missing", url.Values{"path": {e.path("nope.txt")}}, http.StatusNotFound, "path '" + e.path("nope.txt") + "' does not exist"},
		{"no path", url.Values{}, http.StatusBadRequest, ""},
		{"empty path", url.Values{"path": {""}}, http.StatusBadRequest, ""},
		{"fifo", url.Values{"path": {fifo}}, http.StatusBadRequest, ""},
		{"unknown user", url.Values{"path": {e.path("x")}, "username": {"no-such-user-sandboxd"}}, http.StatusUnauthorized,
			"error looking up user 'no-such-user-sandboxd': user: unknown user no-such-user-sandboxd"},
		{"other user's home", url.Values{"path": {"~root/x"}}, http.StatusBadRequest, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.get(t, tt.query, nil).wantMessage(t, tt.status, tt.msg)
		})
	}
}

// TestUploadDirectoryMessage: an upload onto a directory answers E2B envd's
// text for it.
func TestUploadDirectoryMessage(t *testing.T) {
	e := newEnv(t)
	dir := e.path("adir")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e.postRaw(t, dir, []byte("x"), nil).wantMessage(t, http.StatusBadRequest, "path is a directory: "+dir)
}

func TestUnknownUserUpload(t *testing.T) {
	e := newEnv(t)
	path := e.path("u.txt")
	r := e.post(t, url.Values{"path": {path}, "username": {"no-such-user-sandboxd"}},
		"application/octet-stream", bytes.NewReader([]byte("x")), nil)
	r.wantError(t, http.StatusUnauthorized)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("file written for an unknown user (stat err %v)", err)
	}
}

func TestDownloadRange(t *testing.T) {
	e := newEnv(t)
	path := e.path("range.txt")
	writeFile(t, path, []byte("0123456789"))
	q := url.Values{"path": {path}}

	tests := []struct {
		name   string
		hdr    http.Header
		status int
		body   string
	}{
		{"range", http.Header{"Range": {"bytes=2-5"}}, http.StatusPartialContent, "2345"},
		{"suffix range", http.Header{"Range": {"bytes=-3"}}, http.StatusPartialContent, "789"},
		// Range wins over gzip: a compressed stream has no stable offsets.
		{"range with gzip accepted", http.Header{"Range": {"bytes=0-0"}, "Accept-Encoding": {"gzip"}}, http.StatusPartialContent, "0"},
		{"unsatisfiable", http.Header{"Range": {"bytes=100-"}}, http.StatusRequestedRangeNotSatisfiable, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.get(t, q, tt.hdr)
			if r.resp.StatusCode != tt.status {
				t.Fatalf("status = %d (%s); want %d", r.resp.StatusCode, r.body, tt.status)
			}
			if tt.body != "" && string(r.body) != tt.body {
				t.Errorf("body = %q; want %q", r.body, tt.body)
			}
			if r.resp.Header.Get("Content-Encoding") != "" {
				t.Errorf("Content-Encoding = %q on a range response", r.resp.Header.Get("Content-Encoding"))
			}
		})
	}

	t.Run("range with identity refused", func(t *testing.T) {
		r := e.get(t, q, http.Header{"Range": {"bytes=0-1"}, "Accept-Encoding": {"gzip, identity;q=0"}})
		r.wantError(t, http.StatusNotAcceptable)
	})

	t.Run("conditional", func(t *testing.T) {
		r := e.get(t, q, nil)
		lm := r.resp.Header.Get("Last-Modified")
		r = e.get(t, q, http.Header{"If-Modified-Since": {lm}})
		if r.resp.StatusCode != http.StatusNotModified || len(r.body) != 0 {
			t.Errorf("If-Modified-Since: status %d, %d bytes; want 304, empty", r.resp.StatusCode, len(r.body))
		}
		old := time.Unix(0, 0).UTC().Format(http.TimeFormat)
		r = e.get(t, q, http.Header{"If-Unmodified-Since": {old}})
		if r.resp.StatusCode != http.StatusPreconditionFailed {
			t.Errorf("If-Unmodified-Since in the past: status %d; want 412", r.resp.StatusCode)
		}
	})
}

func TestDownloadGzip(t *testing.T) {
	e := newEnv(t)
	data := bytes.Repeat([]byte("compressible text "), 10000)
	path := e.path("z.txt")
	writeFile(t, path, data)
	q := url.Values{"path": {path}}

	tests := []struct {
		accept   string
		encoding string // "" = identity
		status   int
	}{
		{"", "", http.StatusOK},
		{"gzip", "gzip", http.StatusOK},
		{"gzip, deflate, br", "gzip", http.StatusOK},
		{"GZIP;q=0.5", "gzip", http.StatusOK},
		{"deflate", "", http.StatusOK},
		{"gzip;q=0", "", http.StatusOK},
		{"gzip;q=0.4, identity;q=0.8", "", http.StatusOK},
		{"*", "", http.StatusOK},
		{"*, identity;q=0", "gzip", http.StatusOK},
		{"identity;q=0", "", http.StatusNotAcceptable},
		{"deflate, identity;q=0", "", http.StatusNotAcceptable},
		{"*;q=0", "", http.StatusNotAcceptable},
		{"gzip;q=0, identity;q=0", "", http.StatusNotAcceptable},
	}
	for _, tt := range tests {
		t.Run("Accept-Encoding="+tt.accept, func(t *testing.T) {
			var hdr http.Header
			if tt.accept != "" {
				hdr = http.Header{"Accept-Encoding": {tt.accept}}
			}
			r := e.get(t, q, hdr)
			if tt.status != http.StatusOK {
				r.wantError(t, tt.status)
				return
			}
			if r.resp.StatusCode != http.StatusOK {
				t.Fatalf("status = %d (%s)", r.resp.StatusCode, r.body)
			}
			if got := r.resp.Header.Get("Content-Encoding"); got != tt.encoding {
				t.Errorf("Content-Encoding = %q; want %q", got, tt.encoding)
			}
			if got := r.resp.Header.Get("Vary"); got != "Accept-Encoding" {
				t.Errorf("Vary = %q; want Accept-Encoding", got)
			}
			if tt.encoding == "gzip" {
				if r.resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
					t.Errorf("Content-Type = %q; want the file's type", r.resp.Header.Get("Content-Type"))
				}
				zr, err := gzip.NewReader(bytes.NewReader(r.body))
				if err != nil {
					t.Fatal(err)
				}
				if r.body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(r.body, data) {
				t.Errorf("decoded body is %d bytes; want %d", len(r.body), len(data))
			}
		})
	}
}

func TestDownloadHead(t *testing.T) {
	e := newEnv(t)
	path := e.path("head.txt")
	writeFile(t, path, []byte("12345"))
	for _, accept := range []string{"", "gzip"} {
		req, err := http.NewRequest(http.MethodHead, e.url(url.Values{"path": {path}}), nil)
		if err != nil {
			t.Fatal(err)
		}
		if accept != "" {
			req.Header.Set("Accept-Encoding", accept)
		}
		r := e.do(t, req)
		if r.resp.StatusCode != http.StatusOK || len(r.body) != 0 {
			t.Errorf("HEAD (Accept-Encoding %q) = %d, %d bytes; want 200, empty", accept, r.resp.StatusCode, len(r.body))
		}
	}
}
