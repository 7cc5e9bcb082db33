package httpx

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/errdefs"
)

func TestDecodeJSONLimit(t *testing.T) {
	type body struct {
		A string `json:"a"`
	}
	tests := []struct {
		in      string
		status  int // 0: decodes
		message string
	}{
		{`{"a":"x"}`, 0, ""},
		{"  {\"a\":\"x\"}\n\t ", 0, ""},
		{``, 400, "missing JSON body"},
		{`{"a":"x"}xyz`, 400, "unexpected data after the JSON value"},
		{`{"a":"x"}{}`, 400, "unexpected data after the JSON value"},
		{`{"b":1}`, 400, "unknown field"},
		{`{"a":"` + strings.Repeat("x", 64) + `"}`, 413, "request body is larger than 32 bytes"},
		{`{"a":"x"}` + strings.Repeat(" ", 64), 413, "request body is larger than 32 bytes"},
		{`{"a":`, 400, "invalid JSON body: unexpected EOF"},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tt.in))
		var v body
		err := DecodeJSONLimit(r, &v, 32)
		if tt.status == 0 {
			if err != nil || v.A != "x" {
				t.Errorf("DecodeJSONLimit(%.40q) = %v, %+v; want a decoded body", tt.in, err, v)
			}
			continue
		}
		msg, _ := errdefs.Public(err)
		if StatusOf(err) != tt.status || !strings.Contains(msg, tt.message) {
			t.Errorf("DecodeJSONLimit(%.40q) = %v (status %d); want %d with %q", tt.in, err, StatusOf(err), tt.status, tt.message)
		}
	}
}

func TestLimitJSONBody(t *testing.T) {
	var got []byte
	h := LimitJSONBody(32, func(w http.ResponseWriter, r *http.Request, err error) {
		WriteErrorStatus(w, StatusOf(err), err.Error())
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = RawBody(r.Context())
		w.WriteHeader(http.StatusNoContent)
	}))
	tests := []struct {
		in     string
		status int
	}{
		{`{"a":1}`, 204},
		{``, 204}, // the route decides whether a body is required
		{`{"a":1}xyz`, 400},
		{`{"a":1`, 400},
		{`{"a":"` + strings.Repeat("x", 64) + `"}`, 413},
	}
	for _, tt := range tests {
		got = nil
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tt.in)))
		if w.Code != tt.status {
			t.Errorf("body %.40q: status %d (%s); want %d", tt.in, w.Code, w.Body, tt.status)
		}
		if tt.status == 204 && string(got) != tt.in {
			t.Errorf("body %.40q: handler saw raw body %q", tt.in, got)
		}
	}
}

func TestCheckMap(t *testing.T) {
	lim := MapLimits{Entries: 2, KeyLen: 3, ValueLen: 4}
	tests := []struct {
		m       map[string]string
		wantErr string
	}{
		{nil, ""},
		{map[string]string{"abc": "abcd", "x": ""}, ""},
		{map[string]string{"a": "", "b": "", "c": ""}, "3 entries; at most 2"},
		{map[string]string{"": "v"}, "empty key"},
		{map[string]string{"abcd": "v"}, "is 4 bytes; at most 3"},
		{map[string]string{"a": "abcde"}, "is 5 bytes; at most 4"},
	}
	for _, tt := range tests {
		err := CheckMap("md", tt.m, lim)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("CheckMap(%v) = %v; want nil", tt.m, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument)):
			t.Errorf("CheckMap(%v) = %v; want an invalid argument with %q", tt.m, err, tt.wantErr)
		}
	}
}
