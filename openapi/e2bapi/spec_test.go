package e2bapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/openapi/e2bapi"
)

// mount is where sandboxd serves the E2B surface; the spec's only server URL.
const mount = "/v1/sandboxes/e2b"

func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	data, err := os.ReadFile("../e2b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(data)
	if err != nil {
		t.Fatalf("load openapi/e2b.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi/e2b.yaml is not a valid OpenAPI 3.0 document: %v", err)
	}
	return doc
}

func operation(t *testing.T, doc *openapi3.T, method, path string) *openapi3.Operation {
	t.Helper()
	item := doc.Paths.Find(path)
	if item == nil {
		t.Fatalf("%s: path not in spec", path)
	}
	op := item.GetOperation(method)
	if op == nil {
		t.Fatalf("%s %s: operation not in spec", method, path)
	}
	return op
}

func statuses(op *openapi3.Operation) []int {
	var out []int
	for code := range op.Responses.Map() {
		n, err := strconv.Atoi(code)
		if err != nil {
			out = append(out, -1) // "default" or a range: not allowed here
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func TestServersAndSecurity(t *testing.T) {
	doc := loadSpec(t)
	if len(doc.Servers) != 1 || doc.Servers[0].URL != mount {
		t.Errorf("servers = %v, want exactly %s", doc.Servers, mount)
	}
	key := doc.Components.SecuritySchemes["ApiKeyAuth"]
	if key == nil || key.Value.Type != "apiKey" || key.Value.In != "header" || !strings.EqualFold(key.Value.Name, "X-API-KEY") {
		t.Errorf("ApiKeyAuth must be an apiKey in header X-API-KEY, got %+v", key)
	}
	bearer := doc.Components.SecuritySchemes["BearerAuth"]
	if bearer == nil || bearer.Value.Type != "http" || bearer.Value.Scheme != "bearer" {
		t.Errorf("BearerAuth must be http bearer, got %+v", bearer)
	}
	var alternatives []string
	for _, req := range doc.Security {
		for name := range req {
			alternatives = append(alternatives, name)
		}
	}
	slices.Sort(alternatives)
	if !slices.Equal(alternatives, []string{"ApiKeyAuth", "BearerAuth"}) {
		t.Errorf("top-level security alternatives = %v, want ApiKeyAuth or BearerAuth", alternatives)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			// The volume content routes take the volume's token instead of
			// an API key, as E2B's content service does.
			if strings.HasPrefix(path, "/volumecontent/") {
				if op.Security == nil || len(*op.Security) != 1 || len((*op.Security)[0]) != 1 || (*op.Security)[0]["VolumeTokenAuth"] == nil {
					t.Errorf("%s %s must take VolumeTokenAuth alone", method, path)
				}
			} else if op.Security != nil {
				t.Errorf("%s %s overrides the top-level security", method, path)
			}
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId (handler names would follow the path)", method, path)
			}
		}
	}
}

// TestErrorResponses: every non-2xx response is a JSON Error, and every operation can answer
// 401 (bad key), 429 (rate limit) and 500.
func TestErrorResponses(t *testing.T) {
	doc := loadSpec(t)
	errSchema := doc.Components.Schemas["Error"]
	if errSchema == nil {
		t.Fatal("no Error schema")
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			codes := statuses(op)
			for _, want := range []int{401, 429, 500} {
				if !slices.Contains(codes, want) {
					t.Errorf("%s %s does not declare %d", method, path, want)
				}
			}
			for code, resp := range op.Responses.Map() {
				n, err := strconv.Atoi(code)
				if err != nil {
					t.Errorf("%s %s: response %q must be a concrete status", method, path, code)
					continue
				}
				if n < 400 {
					continue
				}
				media := resp.Value.Content.Get("application/json")
				if media == nil || media.Schema == nil || media.Schema.Value != errSchema.Value {
					t.Errorf("%s %s: %d must be application/json Error", method, path, n)
				}
				if len(resp.Value.Content) != 1 {
					t.Errorf("%s %s: %d must have exactly one content type", method, path, n)
				}
			}
		}
	}
}

// TestStatuses pins the success statuses the SDKs accept and the error statuses they parse
// (those E2B's spec declares for each route, plus what the newest Python client lists).
func TestStatuses(t *testing.T) {
	doc := loadSpec(t)
	cases := []struct {
		method, path string
		success      []int
		errors       []int
	}{
		{"POST", "/sandboxes", []int{201}, []int{400, 401, 500, 503, 504}},
		{"POST", "/v2/sandboxes", []int{201}, []int{400, 401, 403, 404, 409, 422, 429, 500, 503, 504}},
		{"GET", "/sandboxes", []int{200}, []int{400, 401, 500}},
		{"GET", "/v2/sandboxes", []int{200}, []int{400, 401, 500}},
		{"GET", "/sandboxes/metrics", []int{200}, []int{400, 401, 500}},
		{"GET", "/sandboxes/{sandboxID}", []int{200}, []int{401, 404, 500}},
		{"DELETE", "/sandboxes/{sandboxID}", []int{204}, []int{401, 404, 409, 500}},
		{"POST", "/sandboxes/{sandboxID}/connect", []int{200, 201}, []int{400, 401, 404, 409, 500, 503, 504}},
		{"POST", "/v2/sandboxes/{sandboxID}/connect", []int{200, 201}, []int{400, 401, 404, 409, 500, 503, 504}},
		{"POST", "/sandboxes/{sandboxID}/resume", []int{201}, []int{400, 401, 404, 409, 500, 503, 504}},
		{"POST", "/sandboxes/{sandboxID}/pause", []int{204}, []int{401, 404, 409, 500, 503}},
		{"POST", "/sandboxes/{sandboxID}/timeout", []int{204}, []int{401, 404, 500}},
		{"POST", "/sandboxes/{sandboxID}/refreshes", []int{204}, []int{401, 404}},
		{"GET", "/sandboxes/{sandboxID}/metrics", []int{200}, []int{400, 401, 404, 500}},
		{"GET", "/sandboxes/{sandboxID}/logs", []int{200}, []int{401, 404, 500}},
		{"GET", "/v2/sandboxes/{sandboxID}/logs", []int{200}, []int{401, 404, 500}},
		{"PUT", "/sandboxes/{sandboxID}/network", []int{204}, []int{401, 404, 409, 500}},
		{"POST", "/sandboxes/{sandboxID}/fork", []int{201}, []int{401, 404, 409, 500, 503}},
		{"POST", "/sandboxes/{sandboxID}/snapshots", []int{201}, []int{400, 401, 404, 500}},
		{"GET", "/snapshots", []int{200}, []int{401, 500}},
		{"GET", "/templates", []int{200}, []int{401, 500}},
		{"GET", "/templates/{templateID}", []int{200}, []int{401, 500}},
		{"DELETE", "/templates/{templateID}", []int{204}, []int{401, 404, 500}},
		{"GET", "/templates/aliases/{alias}", []int{200}, []int{400, 403, 404, 500}},
		{"POST", "/v3/templates", []int{202}, []int{400, 401, 403, 409, 500}},
		{"POST", "/v2/templates", []int{202}, []int{400, 401, 500}},
		{"GET", "/templates/{templateID}/files/{hash}", []int{201}, []int{400, 401, 404, 500}},
		{"POST", "/v2/templates/{templateID}/builds/{buildID}", []int{202}, []int{400, 401, 500}},
		{"GET", "/templates/{templateID}/builds/{buildID}/status", []int{200}, []int{401, 404, 500}},
		{"POST", "/templates/tags", []int{201}, []int{400, 401, 404, 500}},
		{"DELETE", "/templates/tags", []int{204}, []int{400, 401, 404, 500}},
		{"GET", "/templates/{templateID}/tags", []int{200}, []int{401, 403, 404, 500}},
		{"GET", "/templates/{templateID}/builds/{buildID}/logs", []int{200}, []int{401, 404, 500}},
		{"PATCH", "/v2/templates/{templateID}", []int{200}, []int{400, 401, 403, 404, 500}},
		{"GET", "/v2/templates", []int{200}, []int{400, 401, 500}},
		{"GET", "/volumes", []int{200}, []int{401, 500}},
		{"POST", "/volumes", []int{201}, []int{400, 401, 500}},
		{"GET", "/volumes/{volumeID}", []int{200}, []int{401, 404, 500}},
		{"DELETE", "/volumes/{volumeID}", []int{204}, []int{401, 404, 500}},
		// The content routes: what the Python SDK's generated volume client parses.
		{"GET", "/volumecontent/{volumeID}/file", []int{200}, []int{404, 500}},
		{"PUT", "/volumecontent/{volumeID}/file", []int{201}, []int{404, 500}},
		{"GET", "/volumecontent/{volumeID}/dir", []int{200}, []int{400, 404, 500}},
		{"POST", "/volumecontent/{volumeID}/dir", []int{201}, []int{404, 500}},
		{"GET", "/volumecontent/{volumeID}/path", []int{200}, []int{404}},
		{"PATCH", "/volumecontent/{volumeID}/path", []int{200}, []int{400, 404, 500}},
		{"DELETE", "/volumecontent/{volumeID}/path", []int{204}, []int{404}},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		op := operation(t, doc, c.method, c.path)
		covered[c.method+" "+c.path] = true
		codes := statuses(op)
		var success []int
		for _, code := range codes {
			if code >= 200 && code < 300 {
				success = append(success, code)
			}
		}
		if !slices.Equal(success, c.success) {
			t.Errorf("%s %s: success statuses %v, want %v", c.method, c.path, success, c.success)
		}
		for _, code := range c.errors {
			if !slices.Contains(codes, code) {
				t.Errorf("%s %s: missing error status %d (declared: %v)", c.method, c.path, code, codes)
			}
		}
		for code, resp := range op.Responses.Map() {
			n, _ := strconv.Atoi(code)
			if n == 204 && len(resp.Value.Content) != 0 {
				t.Errorf("%s %s: 204 must have no body", c.method, c.path)
			}
			// A volume file's bytes are the one body that is not JSON.
			raw := c.path == "/volumecontent/{volumeID}/file" && c.method == "GET" && resp.Value.Content.Get("application/octet-stream") != nil
			if n >= 200 && n < 300 && n != 204 && n != 202 && !raw && resp.Value.Content.Get("application/json") == nil {
				t.Errorf("%s %s: %d must have a JSON body", c.method, c.path, n)
			}
		}
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !covered[method+" "+path] {
				t.Errorf("%s %s is not pinned in TestStatuses", method, path)
			}
		}
	}
}

// TestNotImplementedRoutes: the routes an SDK calls that sandboxd answers 501 are in the spec, so
// the generated server routes them (behind authentication) to a handler.
func TestNotImplementedRoutes(t *testing.T) {
	doc := loadSpec(t)
	for _, r := range [][2]string{
		{"POST", "/sandboxes/{sandboxID}/fork"},
		{"POST", "/sandboxes/{sandboxID}/snapshots"},
		{"GET", "/snapshots"},
	} {
		if !slices.Contains(statuses(operation(t, doc, r[0], r[1])), 501) {
			t.Errorf("%s %s must declare 501", r[0], r[1])
		}
	}
}

func requiredOf(t *testing.T, doc *openapi3.T, schema string) []string {
	t.Helper()
	s := doc.Components.Schemas[schema]
	if s == nil {
		t.Fatalf("no schema %s", schema)
	}
	req := slices.Clone(s.Value.Required)
	slices.Sort(req)
	return req
}

func propsOf(t *testing.T, doc *openapi3.T, schema string) openapi3.Schemas {
	t.Helper()
	s := doc.Components.Schemas[schema]
	if s == nil {
		t.Fatalf("no schema %s", schema)
	}
	return s.Value.Properties
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

func TestSchemas(t *testing.T) {
	doc := loadSpec(t)

	detailRequired := sorted("templateID", "sandboxID", "clientID", "startedAt", "endAt",
		"cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion")
	for schema, want := range map[string][]string{
		"Error":                     sorted("code", "message"),
		"Sandbox":                   sorted("templateID", "sandboxID", "clientID", "envdVersion"),
		"SandboxDetail":             detailRequired,
		"ListedSandbox":             detailRequired,
		"SandboxMetric":             sorted("timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache", "diskUsed", "diskTotal"),
		"SnapshotInfo":              sorted("snapshotID", "names"),
		"NewSandbox":                {"templateID"},
		"NewSandboxV2":              {"templateID"},
		"ConnectSandbox":            {"timeout"},
		"SandboxLifecycle":          sorted("autoResume", "onTimeout"),
		"SandboxesWithMetrics":      {"sandboxes"},
		"TemplateRequestResponseV3": sorted("templateID", "buildID", "public", "names", "tags", "aliases"),
	} {
		if got := requiredOf(t, doc, schema); !slices.Equal(got, want) {
			t.Errorf("%s required = %v, want %v", schema, got, want)
		}
	}
	if got := requiredOf(t, doc, "ConnectSandboxV2"); len(got) != 0 {
		t.Errorf("ConnectSandboxV2 must have no required field (the body is optional), got %v", got)
	}

	code := propsOf(t, doc, "Error")["code"].Value
	if !code.Type.Is("integer") || code.Format != "int32" {
		t.Errorf("Error.code must be int32, got %v %s", code.Type, code.Format)
	}

	// The one snake_case request field, camelCase in the detail object.
	for _, schema := range []string{"NewSandbox", "NewSandboxV2", "SandboxNetworkUpdateConfig"} {
		p := propsOf(t, doc, schema)
		if p["allow_internet_access"] == nil || p["allowInternetAccess"] != nil {
			t.Errorf("%s must spell allow_internet_access in snake_case", schema)
		}
	}
	if p := propsOf(t, doc, "SandboxDetail"); p["allowInternetAccess"] == nil || p["allow_internet_access"] != nil {
		t.Error("SandboxDetail must spell allowInternetAccess in camelCase")
	}
	if propsOf(t, doc, "NewSandbox")["secure"] == nil || propsOf(t, doc, "NewSandboxV2")["secure"] != nil {
		t.Error("secure belongs to NewSandbox only; v2 sandboxes are always secured")
	}
	for _, schema := range []string{"NewSandbox", "NewSandboxV2"} {
		p := propsOf(t, doc, schema)
		for _, name := range []string{"metadata", "envVars"} {
			ap := p[name].Value.AdditionalProperties
			if !p[name].Value.Type.Is("object") || ap.Schema == nil || !ap.Schema.Value.Type.Is("string") {
				t.Errorf("%s.%s must be a string map", schema, name)
			}
		}
	}

	state := doc.Components.Schemas["SandboxState"].Value
	var states []string
	for _, v := range state.Enum {
		states = append(states, v.(string))
	}
	if !slices.Equal(states, []string{"running", "paused"}) {
		t.Errorf("SandboxState enum = %v, want [running paused]", states)
	}
	for _, schema := range []string{"SandboxDetail", "ListedSandbox"} {
		if ref := propsOf(t, doc, schema)["state"].Ref; ref != "#/components/schemas/SandboxState" {
			t.Errorf("%s.state = %q, want SandboxState", schema, ref)
		}
	}

	// Every timestamp is RFC 3339.
	for name, schema := range doc.Components.Schemas {
		for prop, ps := range schema.Value.Properties {
			if prop == "timestamp" || (strings.HasSuffix(prop, "At") && prop != "timestampUnix") {
				if !ps.Value.Type.Is("string") || ps.Value.Format != "date-time" {
					t.Errorf("%s.%s must be a date-time string", name, prop)
				}
			}
		}
	}
}

func TestParameters(t *testing.T) {
	doc := loadSpec(t)
	for path, item := range doc.Paths.Map() {
		params := slices.Clone(item.Parameters)
		for _, op := range item.Operations() {
			params = append(params, op.Parameters...)
		}
		for _, p := range params {
			if p.Value.In != "path" {
				continue
			}
			s := p.Value.Schema.Value
			if !s.Type.Is("string") || s.Pattern != "" || s.Format != "" || len(s.Enum) != 0 {
				t.Errorf("%s: path parameter %s must be a plain string", path, p.Value.Name)
			}
		}
	}

	list := operation(t, doc, "GET", "/v2/sandboxes")
	want := sorted("metadata", "state", "startedAfter", "template", "order", "limit", "nextToken")
	var got []string
	for _, p := range list.Parameters {
		got = append(got, p.Value.Name)
		switch p.Value.Name {
		case "state":
			explode := p.Value.Explode
			if p.Value.Style != "form" || explode == nil || *explode || p.Value.Schema.Value.Items.Ref != "#/components/schemas/SandboxState" {
				t.Error("state must be a comma-joined (form, explode false) array of SandboxState")
			}
		case "limit":
			s := p.Value.Schema.Value
			if s.Min == nil || *s.Min != 1 || s.Max == nil || *s.Max != 100 {
				t.Error("limit must be 1..100")
			}
		case "startedAfter":
			if p.Value.Schema.Value.Format != "date-time" {
				t.Error("startedAfter must be date-time")
			}
		case "order":
			if p.Value.Schema.Ref != "#/components/schemas/OrderDirection" {
				t.Error("order must be OrderDirection (asc|desc)")
			}
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("GET /v2/sandboxes parameters = %v, want %v", got, want)
	}
	for _, path := range []string{"/v2/sandboxes", "/snapshots", "/templates/{templateID}"} {
		if operation(t, doc, "GET", path).Responses.Status(200).Value.Headers["X-Next-Token"] == nil {
			t.Errorf("GET %s: 200 must declare X-Next-Token", path)
		}
	}
}

// stub answers the few operations the routing test calls; any other call panics on the nil
// embedded interface.
type stub struct {
	e2bapi.StrictServerInterface
	got any
}

func (s *stub) GetTemplate(_ context.Context, req e2bapi.GetTemplateRequestObject) (e2bapi.GetTemplateResponseObject, error) {
	s.got = req
	return e2bapi.GetTemplate404JSONResponse{NotFoundJSONResponse: e2bapi.NotFoundJSONResponse{Code: 404, Message: "no template " + req.TemplateID}}, nil
}

func (s *stub) PauseSandbox(_ context.Context, req e2bapi.PauseSandboxRequestObject) (e2bapi.PauseSandboxResponseObject, error) {
	s.got = req
	return e2bapi.PauseSandbox204Response{}, nil
}

func (s *stub) ConnectSandboxV2(_ context.Context, req e2bapi.ConnectSandboxV2RequestObject) (e2bapi.ConnectSandboxV2ResponseObject, error) {
	s.got = req
	return e2bapi.ConnectSandboxV2201JSONResponse{SandboxID: req.SandboxID, TemplateID: "base", ClientID: "x", EnvdVersion: "0.6.13"}, nil
}

func (s *stub) ListSandboxesV2(_ context.Context, req e2bapi.ListSandboxesV2RequestObject) (e2bapi.ListSandboxesV2ResponseObject, error) {
	s.got = req
	next := "page2"
	return e2bapi.ListSandboxesV2200JSONResponse{Body: []e2bapi.ListedSandbox{}, Headers: e2bapi.ListSandboxesV2200ResponseHeaders{XNextToken: &next}}, nil
}

// TestGeneratedRouting drives the generated chi server mounted the way sandboxd mounts it:
// percent-encoded ids reach the handler decoded, optional bodies may be absent, comma-joined
// states are split, and the X-Next-Token header is written.
func TestGeneratedRouting(t *testing.T) {
	s := &stub{}
	root := chi.NewRouter()
	root.Mount(mount, e2bapi.Handler(e2bapi.NewStrictHandler(s, nil)))
	srv := httptest.NewServer(root)
	defer srv.Close()

	do := func(method, path, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+mount+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}

	resp := do("GET", "/templates/team%2Fmy-template%3Av2", "")
	var e e2bapi.Error
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != 404 || e.Code != 404 {
		t.Fatalf("GET template: status %d, body %+v, err %v", resp.StatusCode, e, err)
	}
	if got := s.got.(e2bapi.GetTemplateRequestObject).TemplateID; got != "team/my-template:v2" {
		t.Errorf("templateID = %q, want the decoded team/my-template:v2", got)
	}

	for _, body := range []string{"", `{"memory":false}`} {
		if resp := do("POST", "/sandboxes/abc123/pause", body); resp.StatusCode != 204 {
			t.Errorf("pause with body %q: status %d, want 204", body, resp.StatusCode)
		}
		req := s.got.(e2bapi.PauseSandboxRequestObject)
		if (body == "") != (req.Body == nil) || (req.Body != nil && (req.Body.Memory == nil || *req.Body.Memory)) {
			t.Errorf("pause with body %q: handler got %+v", body, req.Body)
		}
	}

	resp = do("POST", "/v2/sandboxes/abc123/connect", "")
	var sbx e2bapi.Sandbox
	if err := json.NewDecoder(resp.Body).Decode(&sbx); err != nil || resp.StatusCode != 201 || sbx.SandboxID != "abc123" {
		t.Errorf("connect v2 without body: status %d, body %+v, err %v", resp.StatusCode, sbx, err)
	}

	resp = do("GET", "/v2/sandboxes?state=running,paused&limit=5", "")
	if resp.StatusCode != 200 || resp.Header.Get("X-Next-Token") != "page2" {
		t.Errorf("list: status %d, X-Next-Token %q", resp.StatusCode, resp.Header.Get("X-Next-Token"))
	}
	params := s.got.(e2bapi.ListSandboxesV2RequestObject).Params
	if params.State == nil || !reflect.DeepEqual(*params.State, []e2bapi.SandboxState{e2bapi.SandboxStateRunning, e2bapi.SandboxStatePaused}) {
		t.Errorf("state = %v, want [running paused]", params.State)
	}
	if params.Limit == nil || *params.Limit != 5 {
		t.Errorf("limit = %v, want 5", params.Limit)
	}

	// startedAfter as JS (milliseconds, Z) and Python (isoformat, +00:00) send it.
	want := time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)
	for _, q := range []string{"2024-05-01T10:00:00.000Z", url.QueryEscape("2024-05-01T10:00:00+00:00")} {
		if resp := do("GET", "/v2/sandboxes?startedAfter="+q, ""); resp.StatusCode != 200 {
			t.Errorf("startedAfter=%s: status %d", q, resp.StatusCode)
			continue
		}
		got := s.got.(e2bapi.ListSandboxesV2RequestObject).Params.StartedAfter
		if got == nil || !got.Equal(want) {
			t.Errorf("startedAfter=%s: got %v, want %v", q, got, want)
		}
	}
}
