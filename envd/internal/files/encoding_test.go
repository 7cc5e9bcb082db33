package files

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
	"github.com/sandboxd/sandboxd/envd/internal/auth"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
)

func TestNegotiateEncoding(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of negotiateEncoding")
	tests := []struct {
		accept []string // nil: header absent
		want   string
		err    bool
	}{
		{nil, codingIdentity, false},
		{[]string{""}, codingIdentity, false},
		{[]string{"gzip"}, codingGzip, false},
		{[]string{"x-gzip"}, codingGzip, false},
		{[]string{"br", "gzip;q=0.1"}, codingGzip, false}, // several header lines
		{[]string{"gzip;q=bogus"}, codingIdentity, false}, // malformed q: element ignored
		{[]string{"gzip;q=2"}, codingIdentity, false},
		{[]string{"gzip, identity"}, codingGzip, false}, // a tie goes to the named gzip
		{[]string{"identity, gzip;q=0.9"}, codingIdentity, false},
		{[]string{"*;q=0, identity"}, codingIdentity, false},
		{[]string{"*;q=0, gzip"}, codingGzip, false},
		{[]string{"*;q=0"}, "", true},
		{[]string{"identity;q=0"}, "", true},
		{[]string{"identity;q=0, *"}, codingGzip, false},
		{[]string{" , ,"}, codingIdentity, false},
	}
	for _, tt := range tests {
		h := http.Header{}
		for _, v := range tt.accept {
			h.Add("Accept-Encoding", v)
		}
		got, err := negotiateEncoding(h)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("negotiateEncoding(%q) = %q, %v; want %q, error %v", tt.accept, got, err, tt.want, tt.err)
		}
	}
}

func FuzzNegotiateEncoding(f *testing.F) {
	agenttest.InProcessOnly(f, "unit test of negotiateEncoding")
	for _, s := range []string{"gzip", "gzip;q=0.5, identity;q=0", "*;q=0", ";;,;q=", "identity;q=1e309"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, accept string) {
		h := http.Header{"Accept-Encoding": {accept}}
		got, err := negotiateEncoding(h)
		switch {
		case err != nil:
			if !errors.Is(err, errNotAcceptable) || identityAcceptable(h) {
				t.Errorf("negotiateEncoding(%q) = %v while identity is acceptable", accept, err)
			}
		case got != codingIdentity && got != codingGzip:
			t.Errorf("negotiateEncoding(%q) = %q", accept, got)
		case got == codingIdentity && !identityAcceptable(h):
			t.Errorf("negotiateEncoding(%q) = identity, which the client refused", accept)
		}
	})
}

// FuzzUploadMultipart feeds arbitrary multipart bodies to the handler: it
// must never panic, answer only 200 or a JSON 4xx, and never leave a
// temporary file. The path query pins every file into a scratch directory.
func FuzzUploadMultipart(f *testing.F) {
	const boundary = "fuzzboundary"
	seeds := []string{
		"--fuzzboundary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a/b\"\r\n\r\nhello\r\n--fuzzboundary--\r\n",
		"--fuzzboundary\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx\r\n--fuzzboundary\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\ny\r\n--fuzzboundary--\r\n",
		"--fuzzboundary\r\nContent-Disposition: form-data; name=\"file\r\n\r\nx\r\n--fuzzboundary--\r\n",
		"--fuzzboundary\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n--fuzzboundary--\r\n",
		"--fuzzboundary\r\n\r\n",
		"",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	cur, err := user.Current()
	if err != nil {
		f.Fatal(err)
	}
	var h http.Handler = New(slog.New(slog.NewTextHandler(io.Discard, nil)), execctx.New(cur.Username), &auth.Token{})
	if agenttest.Enabled() {
		h = agentHandler(f, cur.Username)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		dir := t.TempDir()
		target := filepath.Join(dir, "sub", "out.bin")
		req := httptest.NewRequest(http.MethodPost, "/files?"+url.Values{"path": {target}}.Encode(), bytes.NewReader(body))
		req.Header.Set("Content-Type", "multipart/form-data; boundary="+boundary)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch {
		case rec.Code == http.StatusOK:
			if _, err := os.Stat(target); err != nil {
				t.Errorf("200 but %s missing: %v", target, err)
			}
		case rec.Code >= 400 && rec.Code < 500:
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("error Content-Type = %q", ct)
			}
		default:
			t.Errorf("status %d: %s", rec.Code, rec.Body)
		}
		noTempFiles(t, dir)
	})
}

// agentHandler is an http.Handler that passes each request on to an agent
// binary (package agenttest) over HTTP and copies back its answer, so a
// test that feeds a handler directly checks the binary's /files instead.
func agentHandler(tb testing.TB, user string) http.Handler {
	a := agenttest.Start(tb, agenttest.Options{DefaultUser: user})
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	tb.Cleanup(client.CloseIdleConnections)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, err := http.NewRequestWithContext(r.Context(), r.Method, a.URL+r.URL.RequestURI(), r.Body)
		if err != nil {
			tb.Fatal(err)
		}
		out.Header = r.Header.Clone()
		resp, err := client.Do(out)
		if err != nil {
			tb.Fatalf("%s %s: %v", r.Method, out.URL, err)
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		if _, err := io.Copy(w, resp.Body); err != nil {
			tb.Fatalf("%s %s: reading the answer: %v", r.Method, out.URL, err)
		}
	})
}
