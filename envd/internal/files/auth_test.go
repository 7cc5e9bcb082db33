package files

import (
	"bytes"
	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"
)

func TestAuth(t *testing.T) {
	const token = "secret-token"
	e := newEnv(t)
	e.setToken(t, token)
	path := e.path("auth.txt")
	writeFile(t, path, []byte("guarded"))
	future := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	past := strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)
	exp := func(s string) int64 { v, _ := strconv.ParseInt(s, 10, 64); return v }

	// signed returns the query a pre-signed URL carries.
	signed := func(path, op, user, tok, expiration string) url.Values {
		q := url.Values{"path": {path}}
		if user != "" {
			q.Set("username", user)
		}
		var x int64
		if expiration != "" {
			x = exp(expiration)
			q.Set("signature_expiration", expiration)
		}
		q.Set("signature", envdapi.Sign(path, op, user, tok, x))
		return q
	}

	tests := []struct {
		name   string
		method string
		query  url.Values
		hdr    http.Header
		status int
	}{
		{"no credentials", http.MethodGet, url.Values{"path": {path}}, nil, http.StatusUnauthorized},
		{"header token", http.MethodGet, url.Values{"path": {path}}, http.Header{envdapi.AccessTokenHeader: {token}}, http.StatusOK},
		{"wrong header token", http.MethodGet, url.Values{"path": {path}}, http.Header{envdapi.AccessTokenHeader: {"nope"}}, http.StatusUnauthorized},
		// A present header decides alone: a good signature does not rescue it.
		{"wrong header, valid signature", http.MethodGet, signed(path, envdapi.OpRead, "", token, ""), http.Header{envdapi.AccessTokenHeader: {"nope"}}, http.StatusUnauthorized},
		{"signature", http.MethodGet, signed(path, envdapi.OpRead, "", token, ""), nil, http.StatusOK},
		{"signature with user", http.MethodGet, signed(path, envdapi.OpRead, e.user, token, ""), nil, http.StatusOK},
		{"signature with expiration", http.MethodGet, signed(path, envdapi.OpRead, "", token, future), nil, http.StatusOK},
		{"expired signature", http.MethodGet, signed(path, envdapi.OpRead, "", token, past), nil, http.StatusUnauthorized},
		{"signature with another token", http.MethodGet, signed(path, envdapi.OpRead, "", "other", ""), nil, http.StatusUnauthorized},
		{"write signature on GET", http.MethodGet, signed(path, envdapi.OpWrite, "", token, ""), nil, http.StatusUnauthorized},
		{"garbage signature", http.MethodGet, url.Values{"path": {path}, "signature": {"v1_garbage"}}, nil, http.StatusUnauthorized},
		{"tampered expiration", http.MethodGet, func() url.Values {
			q := signed(path, envdapi.OpRead, "", token, past)
			q.Set("signature_expiration", future)
			return q
		}(), nil, http.StatusUnauthorized},
		{"signature for another path", http.MethodGet, func() url.Values {
			q := signed(path, envdapi.OpRead, "", token, "")
			q.Set("path", path+"x")
			return q
		}(), nil, http.StatusUnauthorized},
		{"signature for another user", http.MethodGet, func() url.Values {
			q := signed(path, envdapi.OpRead, "", token, "")
			q.Set("username", e.user)
			return q
		}(), nil, http.StatusUnauthorized},
		{"upload without credentials", http.MethodPost, url.Values{"path": {path}}, nil, http.StatusUnauthorized},
		{"upload with write signature", http.MethodPost, signed(path, envdapi.OpWrite, "", token, future), nil, http.StatusOK},
		{"upload with read signature", http.MethodPost, signed(path, envdapi.OpRead, "", token, ""), nil, http.StatusUnauthorized},
		{"upload with header token", http.MethodPost, url.Values{"path": {path}}, http.Header{envdapi.AccessTokenHeader: {token}}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r result
			if tt.method == http.MethodGet {
				r = e.get(t, tt.query, tt.hdr)
			} else {
				r = e.post(t, tt.query, "application/octet-stream", bytes.NewReader([]byte("guarded")), tt.hdr)
			}
			if tt.status == http.StatusOK {
				if r.resp.StatusCode != http.StatusOK {
					t.Fatalf("status = %d (%s); want 200", r.resp.StatusCode, r.body)
				}
				return
			}
			r.wantError(t, tt.status)
		})
	}

	// uploadUrl() without a path signs the empty path, and the multipart
	// filenames then name the files.
	t.Run("signed upload without path", func(t *testing.T) {
		q := url.Values{"signature": {envdapi.Sign("", envdapi.OpWrite, "", token, 0)}}
		got := e.postMultipart(t, q, nil, part{filename: e.path("nopath.txt"), data: []byte("n")}).entries(t)
		if len(got) != 1 || got[0].Path != e.path("nopath.txt") {
			t.Errorf("entries = %+v", got)
		}
	})

	// The 401 messages are E2B envd's texts: the SDKs' signing tests compare
	// the whole error body.
	messages := []struct {
		name  string
		query url.Values
		hdr   http.Header
		want  string
	}{
		{"expired", signed(path, envdapi.OpRead, "", token, past), nil, "signature is already expired"},
		{"missing", url.Values{"path": {path}}, nil, "missing signature query parameter"},
		{"invalid", url.Values{"path": {path}, "signature": {"v1_garbage"}}, nil, "invalid signature"},
		{"wrong header", url.Values{"path": {path}}, http.Header{envdapi.AccessTokenHeader: {"nope"}}, "access token present in header but does not match"},
	}
	for _, tt := range messages {
		t.Run("message "+tt.name, func(t *testing.T) {
			e.get(t, tt.query, tt.hdr).wantMessage(t, http.StatusUnauthorized, tt.want)
		})
	}
}

func TestNoTokenNoAuth(t *testing.T) {
	e := newEnv(t)
	path := e.path("open.txt")
	e.postRaw(t, path, []byte("open"), nil).entries(t)
	// A stray signature is ignored when envd has no token.
	r := e.get(t, url.Values{"path": {path}, "signature": {"v1_whatever"}}, nil)
	if r.resp.StatusCode != http.StatusOK || string(r.body) != "open" {
		t.Errorf("GET = %d %q; want 200 %q", r.resp.StatusCode, r.body, "open")
	}
}

// An upload refused before its body is read (401 here) keeps its
// connection when the rest of the body is small enough to drain; with more
// still to come the connection is closed after the answer, and the answer
// says so (Connection: close). Without that, a client or proxy that pools
// connections sends its next request into the close and loses it:
// sandboxd's proxy did, behind envd-rs, and its client got a 502.
func TestEarlyAnswerSaysWhetherTheConnectionCloses(t *testing.T) {
	e := newEnv(t)
	e.setToken(t, "secret-token")
	for _, tc := range []struct {
		name  string
		size  int
		close bool
	}{
		{"small body, drained", 1 << 10, false},
		{"large body, still arriving", 4 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, e.url(url.Values{"path": {e.path("early.bin")}}), bytes.NewReader(make([]byte, tc.size)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/octet-stream")
			r := e.do(t, req)
			if r.resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status = %d %s; want 401", r.resp.StatusCode, r.body)
			}
			if r.resp.Close != tc.close {
				t.Errorf("Connection: close = %v; want %v", r.resp.Close, tc.close)
			}
		})
	}
}
