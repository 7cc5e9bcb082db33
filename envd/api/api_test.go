package envdapi

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
)

// TestInitRequestWire pins the /init body to E2B's field names: the body
// E2B's orchestrator sends decodes in full (its Firecracker-only fields
// ignored), and what the control plane encodes uses the same names.
func TestInitRequestWire(t *testing.T) {
	const e2b = `{"envVars":{"A":"1"},"accessToken":"tok","hyperloopIP":"10.0.0.1",` +
		`"timestamp":"2026-01-02T03:04:05Z","defaultUser":"user","defaultWorkdir":"/work",` +
		`"volumeMounts":[{"nfsTarget":"x","path":"/mnt"}]}`
	var got InitRequest
	if err := json.Unmarshal([]byte(e2b), &got); err != nil {
		t.Fatal(err)
	}
	tok := "tok"
	want := InitRequest{EnvVars: map[string]string{"A": "1"}, AccessToken: &tok,
		Timestamp: "2026-01-02T03:04:05Z", DefaultUser: "user", DefaultWorkdir: "/work"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded %+v; want %+v", got, want)
	}

	tests := []struct {
		name string
		req  InitRequest
		want string
	}{
		{"full", want, `{"envVars":{"A":"1"},"accessToken":"tok","timestamp":"2026-01-02T03:04:05Z","defaultUser":"user","defaultWorkdir":"/work"}`},
		{"empty token clears it", InitRequest{AccessToken: new(string)}, `{"accessToken":""}`},
		{"nothing set", InitRequest{}, `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("encoded %s; want %s", b, tt.want)
			}
		})
	}
}

func TestSetAuth(t *testing.T) {
	tests := []struct {
		name, token, user string
		want              http.Header
	}{
		{"both", "tok", "user", http.Header{"X-Access-Token": {"tok"}, "Authorization": {"Basic dXNlcjo="}}},
		{"no token", "", "root", http.Header{"Authorization": {"Basic cm9vdDo="}}},
		{"no user", "tok", "", http.Header{"X-Access-Token": {"tok"}}},
		{"neither", "", "", http.Header{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			SetAuth(h, tt.token, tt.user)
			if !reflect.DeepEqual(h, tt.want) {
				t.Errorf("SetAuth = %v; want %v", h, tt.want)
			}
		})
	}
}
