package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/server/httpx"
)

// bigMetadata is a metadata object of about n bytes in one value.
func bigMetadata(n int) string {
	return `{"templateID":"base","metadata":{"k":"` + strings.Repeat("x", n) + `"}}`
}

func manyMetadata(n int) string {
	m := map[string]any{}
	md := map[string]string{}
	for i := range n {
		md[fmt.Sprintf("key-%d", i)] = "v"
	}
	m["templateID"] = "base"
	m["metadata"] = md
	b, _ := json.Marshal(m)
	return string(b)
}

// TestStrictInput: both APIs refuse what their specs do not allow, with
// their own error bodies, before anything reaches the lifecycle manager.
func TestStrictInput(t *testing.T) {
	e := newNativeEnv(t, false)
	key := e.keys["acme"]
	tok := e.full()
	tests := []struct {
		name         string
		method, path string
		auth, body   string
		status       int
		native       bool
		msg          string // a substring of the message
		allow        string // the Allow header
	}{
		{"e2b trailing garbage", "POST", "/sandboxes", key, `{"templateID":"base"}xyz`, 400, false, "after the JSON value", ""},
		{"e2b two values", "POST", "/v2/sandboxes", key, `{"templateID":"base"} {}`, 400, false, "after the JSON value", ""},
		{"e2b empty templateID", "POST", "/sandboxes", key, `{"templateID":""}`, 400, false, "templateID must not be empty", ""},
		{"e2b v2 empty templateID", "POST", "/v2/sandboxes", key, `{"templateID":""}`, 400, false, "templateID must not be empty", ""},
		{"e2b body too large", "POST", "/sandboxes", key, bigMetadata(2 << 20), 413, false, "larger than", ""},
		{"e2b metadata value too long", "POST", "/sandboxes", key, bigMetadata(5000), 400, false, "metadata: value", ""},
		{"e2b too many metadata entries", "POST", "/sandboxes", key, manyMetadata(101), 400, false, "101 entries", ""},
		{"e2b refresh duration null", "POST", "/sandboxes/nosuchsandbox0000000/refreshes", key, `{"duration":null}`, 400, false, "duration: must not be null", ""},
		{"e2b method not allowed", "PATCH", "/sandboxes", key, ``, 405, false, "not allowed", "GET, POST"},
		{"native trailing garbage", "POST", "/v1/sandboxes", tok, `{"template":"base"}xyz`, 400, true, "after the JSON value", ""},
		{"native body too large", "POST", "/v1/sandboxes", tok, `{"metadata":{"k":"` + strings.Repeat("x", httpx.MaxJSONBody) + `"}}`, 413, true, "larger than", ""},
		{"native metadata value too long", "POST", "/v1/sandboxes", tok, `{"metadata":{"k":"` + strings.Repeat("x", 5000) + `"}}`, 400, true, "metadata: value", ""},
		{"native method not allowed", "PATCH", "/v1/sandboxes/abc", tok, ``, 405, true, "not allowed", "GET, DELETE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(tt.method, tt.path, tt.auth, strings.NewReader(tt.body))
			if r.status != tt.status {
				t.Fatalf("%s %s = %.300s; want %d", tt.method, tt.path, r, tt.status)
			}
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type = %q; want JSON", ct)
			}
			var msg string
			if tt.native {
				if r.errCode() == "" {
					t.Errorf("body %s is not the native error shape", r)
				}
				var b struct{ Error struct{ Message string } }
				_ = json.Unmarshal(r.body, &b)
				msg = b.Error.Message
			} else {
				var b httpx.ErrorBody
				if err := json.Unmarshal(r.body, &b); err != nil || b.Code != tt.status {
					t.Errorf("body %s is not E2B's error shape with code %d", r, tt.status)
				}
				msg = b.Message
			}
			if got := r.header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q; want %q", got, tt.allow)
			}
			if !strings.Contains(msg, tt.msg) {
				t.Errorf("message %q; want it to contain %q", msg, tt.msg)
			}
		})
	}
}

// TestExecWebsocketNeedsUpgrade: a plain GET of a live sandbox's exec/ws is
// a JSON 400 naming the missing upgrade, not the upgrader's text/plain.
func TestExecWebsocketNeedsUpgrade(t *testing.T) {
	e := newNativeEnv(t, true)
	tok := e.full()
	sb := e.create(tok, nil)
	r := e.do(http.MethodGet, "/v1/sandboxes/"+sb.Id+"/exec/ws", tok, nil)
	if r.status != http.StatusBadRequest || r.errCode() != "invalid_argument" || !bytes.Contains(r.body, []byte("websocket upgrade")) {
		t.Fatalf("GET exec/ws without upgrade = %s (%s); want a native 400 about the upgrade", r, r.header.Get("Content-Type"))
	}
}
