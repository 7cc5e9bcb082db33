package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// The code-interpreter template end to end: sandboxd builds it at start
// through its own template builder, any tenant creates sandboxes of it by
// name, and its server answers E2B's /execute and /contexts through the
// proxy. The build pip-installs Jupyter from PyPI and Deno from npm (a
// minute or more and the network), so the test runs only with
// SANDBOXD_E2E_PYPI=1; SANDBOXD_E2E_EGRESS_ALLOW_CIDR opens a mirror on a
// private address.
func TestCodeInterpreterE2E(t *testing.T) {
	if os.Getenv("SANDBOXD_E2E_PYPI") != "1" {
		t.Skip("builds the code-interpreter template from PyPI: set SANDBOXD_E2E_PYPI=1 (and SANDBOXD_E2E_EGRESS_ALLOW_CIDR for a mirror)")
	}
	e := newE2EEnv(t, "a")
	e.serveArgs = append(e.serveArgs, "--code-interpreter=build")
	if cidr := os.Getenv("SANDBOXD_E2E_EGRESS_ALLOW_CIDR"); cidr != "" {
		// A subnet of its own: the allowance lives in the subnet's
		// nftables table, which another sandboxd on the default subnet
		// (any other test run on this host) rewrites without it.
		// SANDBOXD_E2E_EGRESS_SUBNET: runs at once on one host each
		// take their own.
		subnet := os.Getenv("SANDBOXD_E2E_EGRESS_SUBNET")
		if subnet == "" {
			subnet = "10.199.0.0/16"
		}
		e.serveArgs = append(e.serveArgs, "--egress-allow-cidr="+cidr, "--egress-subnet="+subnet)
	}
	s := e.start()
	ka := e.keys["a"]

	e2eEventually(t, "the code-interpreter-v1 build", 20*time.Minute, 2*time.Second, func() (bool, string) {
		r := s.api(t, http.MethodGet, "/templates", ka, nil)
		var list []struct {
			Aliases     []string `json:"aliases"`
			BuildStatus string   `json:"buildStatus"`
			Public      bool     `json:"public"`
		}
		e2eDecode(t, "list templates", r, &list)
		for _, tpl := range list {
			for _, a := range tpl.Aliases {
				if a != "code-interpreter-v1" {
					continue
				}
				if tpl.BuildStatus == "error" {
					t.Fatalf("the build failed; see %s", e.logDir)
				}
				return tpl.BuildStatus == "ready" && tpl.Public, tpl.BuildStatus
			}
		}
		return false, "not listed"
	})

	sb, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "code-interpreter-v1", "secure": true,
		"envVars": map[string]string{"SBX_E2E": "from-create"}})
	hdr := http.Header{"E2b-Sandbox-Id": {sb.SandboxID}, "E2b-Sandbox-Port": {"49999"}}
	execute := func(body map[string]any) (int, []map[string]any, string) {
		t.Helper()
		h := hdr.Clone()
		h.Set("X-Access-Token", *sb.EnvdAccessToken)
		r, err := s.tryDo(http.MethodPost, "/execute", "", body, h)
		if err != nil {
			t.Fatalf("POST /execute: %v", err)
		}
		if r.status != http.StatusOK {
			return r.status, nil, string(r.body)
		}
		var lines []map[string]any
		for _, l := range bytes.Split(bytes.TrimSpace(r.body), []byte("\n")) {
			var m map[string]any
			if err := json.Unmarshal(l, &m); err != nil {
				t.Fatalf("NDJSON line %q: %v", l, err)
			}
			if m["type"] != "keepalive" {
				lines = append(lines, m)
			}
		}
		return r.status, lines, ""
	}

	// The sandbox's env var reaches the kernel; the result is the main
	// one; the stream ends with end_of_execution.
	_, lines, _ := execute(map[string]any{"code": "import os\nprint(os.environ['SBX_E2E'])\n1+1", "context_id": nil, "language": nil, "env_vars": nil})
	var types []string
	for _, l := range lines {
		types = append(types, l["type"].(string))
	}
	if strings.Join(types, ",") != "number_of_executions,stdout,result,end_of_execution" {
		t.Fatalf("1+1: lines %v", lines)
	}
	if lines[1]["text"] != "from-create\n" || lines[2]["text"] != "2" || lines[2]["is_main_result"] != true {
		t.Errorf("1+1: lines %v", lines)
	}

	// Bad input is a plain-text 4xx before any stream.
	for _, tc := range []struct {
		what string
		body map[string]any
		want int
	}{
		{"context and language", map[string]any{"code": "1", "context_id": "x", "language": "python"}, http.StatusBadRequest},
		{"unknown language", map[string]any{"code": "1", "language": "cobol"}, http.StatusBadRequest},
		{"unknown context", map[string]any{"code": "1", "context_id": "nope"}, http.StatusNotFound},
	} {
		if st, _, msg := execute(tc.body); st != tc.want || msg == "" {
			t.Errorf("%s: %d %q, want %d with a message", tc.what, st, msg, tc.want)
		}
	}

	// JavaScript runs on the template's Deno kernel, its result the main one.
	_, lines, msg := execute(map[string]any{"code": "console.log(process.env.SBX_E2E); 1+1", "language": "js"})
	if len(lines) != 4 || lines[1]["text"] != "from-create\n" || lines[2]["text"] != "2" || lines[2]["is_main_result"] != true {
		t.Errorf("js 1+1: lines %v %s", lines, msg)
	}

	// A context of its own, listed, with its own state and directory.
	r, err := s.tryDo(http.MethodPost, "/contexts", "", map[string]any{"cwd": "/tmp"}, hdr)
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("POST /contexts: %v %v", r, err)
	}
	var ctx struct{ ID, Language, Cwd string }
	e2eDecode(t, "POST /contexts", r, &ctx)
	if ctx.Language != "python" || ctx.Cwd != "/tmp" || ctx.ID == "" {
		t.Errorf("context %+v", ctx)
	}
	_, lines, _ = execute(map[string]any{"code": "import os; os.getcwd()", "context_id": ctx.ID})
	if len(lines) < 2 || lines[1]["text"] != "/tmp" {
		t.Errorf("cwd in the context: %v", lines)
	}
	r, err = s.tryDo(http.MethodGet, "/contexts", "", nil, hdr)
	if err != nil || !strings.Contains(string(r.body), ctx.ID) {
		t.Errorf("GET /contexts: %v %v", r, err)
	}
	r, err = s.tryDo(http.MethodDelete, "/contexts/"+ctx.ID, "", nil, hdr)
	if err != nil || r.status != http.StatusOK {
		t.Errorf("DELETE /contexts: %v %v", r, err)
	}
	if st, _, _ := execute(map[string]any{"code": "1", "context_id": ctx.ID}); st != http.StatusNotFound {
		t.Errorf("a removed context: %d", st)
	}
}
