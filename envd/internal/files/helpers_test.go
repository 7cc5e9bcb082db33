package files

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
	"github.com/sandboxd/sandboxd/envd/internal/auth"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
)

// testEnv is a /files handler behind a real HTTP server, as envd mounts it;
// or, with ENVD_TEST_BINARY set, an agent binary serving /files among its
// routes (package agenttest).
type testEnv struct {
	base   string      // the server's URL
	token  *auth.Token // in process; nil against a binary
	agent  *agenttest.Agent
	dir    string // scratch directory for the test's files
	user   string // the default user: whoever runs the tests
	client *http.Client
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	cur, err := user.Current()
	if err != nil {
		t.Fatalf("user.Current() = %v", err)
	}
	e := &testEnv{dir: t.TempDir(), user: cur.Username}
	if agenttest.Enabled() {
		e.agent = agenttest.Start(t, agenttest.Options{DefaultUser: cur.Username})
		e.base = e.agent.URL
	} else {
		e.token = &auth.Token{}
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		mux := http.NewServeMux()
		mux.Handle("/files", New(log, execctx.New(cur.Username), e.token))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		e.base = srv.URL
	}
	// No transparent gzip: tests must see exactly what the server sends.
	e.client = &http.Client{Transport: &http.Transport{DisableCompression: true}}
	t.Cleanup(e.client.CloseIdleConnections)
	return e
}

// setToken sets envd's access token: in process on the handler's Token,
// against a binary through POST /init, as sandboxd does.
func (e *testEnv) setToken(t *testing.T, token string) {
	t.Helper()
	if e.agent != nil {
		e.agent.Init(t, map[string]any{"accessToken": token})
		return
	}
	e.token.Set(token)
}

// path returns an absolute path under the scratch directory.
func (e *testEnv) path(rel string) string { return filepath.Join(e.dir, rel) }

func (e *testEnv) url(q url.Values) string {
	if len(q) == 0 {
		return e.base + "/files"
	}
	return e.base + "/files?" + q.Encode()
}

// result is a response with its whole body.
type result struct {
	resp *http.Response
	body []byte
}

// do sends req and reads the whole response.
func (e *testEnv) do(t *testing.T, req *http.Request) result {
	t.Helper()
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
	}
	return result{resp, body}
}

func (e *testEnv) get(t *testing.T, q url.Values, hdr http.Header) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.url(q), nil)
	if err != nil {
		t.Fatal(err)
	}
	addHeaders(req.Header, hdr)
	return e.do(t, req)
}

func (e *testEnv) post(t *testing.T, q url.Values, contentType string, body io.Reader, hdr http.Header) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url(q), body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	addHeaders(req.Header, hdr)
	return e.do(t, req)
}

// postRaw uploads data as application/octet-stream to path.
func (e *testEnv) postRaw(t *testing.T, path string, data []byte, hdr http.Header) result {
	t.Helper()
	return e.post(t, url.Values{"path": {path}}, "application/octet-stream", bytes.NewReader(data), hdr)
}

func addHeaders(dst, src http.Header) {
	for k, vs := range src {
		for _, v := range vs {
			dst.Add(k, v)
		}
	}
}

// part is one multipart part; name defaults to "file".
type part struct {
	name     string
	filename string
	data     []byte
}

// multipartBody builds a body the way the SDKs do: the filename goes into
// Content-Disposition verbatim (multipart.Writer.CreateFormFile would too,
// but spelling the header out keeps the test independent of it).
func multipartBody(t *testing.T, parts ...part) (contentType string, body []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, p := range parts {
		name := p.name
		if name == "" {
			name = "file"
		}
		h := textproto.MIMEHeader{}
		cd := fmt.Sprintf(`form-data; name=%q`, name)
		if p.filename != "" {
			cd += fmt.Sprintf(`; filename=%q`, p.filename)
		}
		h.Set("Content-Disposition", cd)
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(p.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), buf.Bytes()
}

// postMultipart uploads parts; q may be nil.
func (e *testEnv) postMultipart(t *testing.T, q url.Values, hdr http.Header, parts ...part) result {
	t.Helper()
	ct, body := multipartBody(t, parts...)
	return e.post(t, q, ct, bytes.NewReader(body), hdr)
}

// entries decodes a 200 upload response, failing the test otherwise.
func (r result) entries(t *testing.T) []entry {
	t.Helper()
	resp, body := r.resp, r.body
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status = %d (%s); want 200", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q; want application/json", ct)
	}
	var out []entry
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	return out
}

// wantError checks an E2B error answer: the status, and a JSON body whose
// code equals it with a message.
func (r result) wantError(t *testing.T, status int) {
	t.Helper()
	r.wantMessage(t, status, "")
}

// wantMessage is wantError that also wants the message to be msg exactly,
// unless msg is empty.
func (r result) wantMessage(t *testing.T, status int, msg string) {
	t.Helper()
	resp, body := r.resp, r.body
	if resp.StatusCode != status {
		t.Fatalf("status = %d (%s); want %d", resp.StatusCode, body, status)
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	if e.Code != status || e.Message == "" || (msg != "" && e.Message != msg) {
		t.Errorf("error body = %s; want code %d and message %q", body, status, msg)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// noTempFiles fails if an upload left a stray hidden file (an editor-style
// temporary) anywhere under dir; uploads write in place and make none.
func noTempFiles(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir && strings.HasPrefix(d.Name(), ".") {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
