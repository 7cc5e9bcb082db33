package envd

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

func readLogs(t *testing.T, url, query string) envdapi.LogsResponse {
	t.Helper()
	resp, body := do(t, "GET", url+"/logs"+query, "", map[string]string{"X-Access-Token": "tok"})
	var out envdapi.LogsResponse
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("GET /logs%s: %d %s", query, resp.StatusCode, body)
	}
	return out
}

func findRecord(recs []envdapi.LogRecord, msg string) (envdapi.LogRecord, bool) {
	for _, r := range recs {
		if r.Msg == msg {
			return r, true
		}
	}
	return envdapi.LogRecord{}, false
}

// TestLogsRoute: what a user does through envd shows in GET /logs with
// its fields, at info while stderr logs nothing below error, and never
// the secrets it handled (token, env values, file contents).
func TestLogsRoute(t *testing.T) {
	_, ts := newTestServer(t) // its Log discards everything
	const secret = "s3cret-value"
	if resp, _ := do(t, "POST", ts.URL+"/init", `{"accessToken":"tok","envVars":{"API_KEY":"`+secret+`","B":"2"}}`, nil); resp.StatusCode != 204 {
		t.Fatalf("init: %d", resp.StatusCode)
	}
	first := readLogs(t, ts.URL, "")
	init, ok := findRecord(first.Records, "initialised")
	if !ok || init.Level != "info" || init.Fields["env_vars"] != "API_KEY,B" || init.Fields["access_token_set"] != "true" {
		t.Fatalf("init record %+v (found %v); want info, env_vars API_KEY,B, access_token_set", init, ok)
	}

	dir := t.TempDir()
	auth := map[string]string{"X-Access-Token": "tok", "Content-Type": "application/json"}
	if resp, body := do(t, "POST", ts.URL+"/filesystem.Filesystem/MakeDir", fmt.Sprintf(`{"path":%q}`, dir+"/d"), auth); resp.StatusCode != 200 {
		t.Fatalf("MakeDir: %d %s", resp.StatusCode, body)
	}
	file := filepath.Join(dir, "d", "f.txt")
	up := map[string]string{"X-Access-Token": "tok", "Content-Type": "application/octet-stream"}
	if resp, body := do(t, "POST", ts.URL+"/files?path="+file, secret+" in a file", up); resp.StatusCode != 200 {
		t.Fatalf("upload: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(t, "GET", ts.URL+"/files?path="+file, "", up); resp.StatusCode != 200 {
		t.Fatalf("download: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(t, "POST", ts.URL+"/filesystem.Filesystem/Remove", fmt.Sprintf(`{"path":%q}`, file), auth); resp.StatusCode != 200 {
		t.Fatalf("Remove: %d %s", resp.StatusCode, body)
	}

	// Only what came after the first read, in order.
	next := readLogs(t, ts.URL, fmt.Sprintf("?boot=%s&after=%d", first.Boot, first.Last))
	if next.Boot != first.Boot || len(next.Records) == 0 || next.Records[0].Seq != first.Last+1 {
		t.Fatalf("after %d: boot %q, records %+v; want boot %q from seq %d", first.Last, next.Boot, next.Records, first.Boot, first.Last+1)
	}
	size := fmt.Sprint(len(secret + " in a file"))
	for _, want := range []struct {
		msg    string
		fields map[string]string
	}{
		{"directory created", map[string]string{"path": dir + "/d", "user": "root", "service": "filesystem"}},
		{"file uploaded", map[string]string{"path": file, "user": "root", "size": size}},
		{"file downloaded", map[string]string{"path": file, "user": "root", "size": size}},
		{"removed", map[string]string{"path": file}},
	} {
		rec, ok := findRecord(next.Records, want.msg)
		if !ok {
			t.Errorf("no %q record in %+v", want.msg, next.Records)
			continue
		}
		for k, v := range want.fields {
			if rec.Fields[k] != v {
				t.Errorf("%q: field %s = %q; want %q (fields %v)", want.msg, k, rec.Fields[k], v, rec.Fields)
			}
		}
	}
	_, body := do(t, "GET", ts.URL+"/logs", "", map[string]string{"X-Access-Token": "tok"})
	if strings.Contains(body, secret) || strings.Contains(body, `"tok"`) {
		t.Errorf("GET /logs shows a secret: %s", body)
	}

	if resp, body := do(t, "GET", ts.URL+"/logs?after=x", "", map[string]string{"X-Access-Token": "tok"}); resp.StatusCode != 400 {
		t.Errorf("after=x: %d %s; want 400", resp.StatusCode, body)
	}
}
