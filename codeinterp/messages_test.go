package codeinterp

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"testing"
)

func msg(kind, content string) message {
	return message{Header: header{MsgType: kind, Date: "2026-12-01T10:00:00.000001Z"},
		ParentHeader: header{MsgID: "req"}, Content: json.RawMessage(content)}
}

func TestExecutionHandle(t *testing.T) {
	for _, tc := range []struct {
		name   string
		msgs   []message
		want   []Line
		done   bool
		failed bool
	}{{
		name: "1+1: execution count, main result, then idle",
		msgs: []message{
			msg("status", `{"execution_state":"busy"}`),
			msg("execute_input", `{"code":"1+1","execution_count":3}`),
			msg("execute_result", `{"execution_count":3,"data":{"text/plain":"2"},"metadata":{}}`),
			msg("execute_reply", `{"status":"ok","execution_count":3}`),
			msg("status", `{"execution_state":"idle"}`),
		},
		want: []Line{
			{"type": "number_of_executions", "execution_count": 3},
			{"type": "result", "is_main_result": true, "text": "2"},
		},
		done: true,
	}, {
		name: "streams keep their name and the message's date",
		msgs: []message{
			msg("stream", `{"name":"stdout","text":"hi\n"}`),
			msg("stream", `{"name":"stderr","text":"oops\n"}`),
		},
		want: []Line{
			{"type": "stdout", "text": "hi\n", "timestamp": "2026-12-01T10:00:00.000001Z"},
			{"type": "stderr", "text": "oops\n", "timestamp": "2026-12-01T10:00:00.000001Z"},
		},
	}, {
		name: "an error is sent once, from iopub, the reply repeating it adds nothing",
		msgs: []message{
			msg("error", `{"ename":"ZeroDivisionError","evalue":"division by zero","traceback":["line 1","line 2"]}`),
			msg("execute_reply", `{"status":"error","ename":"ZeroDivisionError","evalue":"division by zero","traceback":["x"]}`),
			msg("status", `{"execution_state":"idle"}`),
		},
		want: []Line{
			{"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": "line 1\nline 2"},
		},
		done: true, failed: true,
	}, {
		name: "so is one whose reply comes first (the channels are apart)",
		msgs: []message{
			msg("execute_reply", `{"status":"error","ename":"TypeError","evalue":"boom","traceback":["TypeError: boom"]}`),
			msg("error", `{"ename":"TypeError","evalue":"boom","traceback":["TypeError: boom"]}`),
		},
		want:   []Line{{"type": "error", "name": "TypeError", "value": "boom", "traceback": "TypeError: boom"}},
		failed: true,
	}, {
		name: "an aborted request is an error",
		msgs: []message{msg("execute_reply", `{"status":"aborted"}`)},
		want: []Line{
			{"type": "error", "name": "ExecutionAborted", "value": "the kernel aborted the execution", "traceback": ""},
		},
		failed: true,
	}, {
		name: "display data: every MIME type to its field, the rest to extra",
		msgs: []message{msg("display_data", `{"data":{
			"text/plain":"<Figure>","image/png":"iVBOR","text/html":"<b>","text/markdown":"# m",
			"image/svg+xml":"<svg/>","image/jpeg":"/9j","application/pdf":"JVB","text/latex":"$x$",
			"application/json":{"a":1},"application/javascript":"alert(1)",
			"e2b/chart":{"type":"line","title":"T","elements":[]},"e2b/data":{"a":[1,2]},
			"application/vnd.custom":"c"}}`)},
		want: []Line{{
			"type": "result", "is_main_result": false, "text": "<Figure>", "png": "iVBOR", "html": "<b>",
			"markdown": "# m", "svg": "<svg/>", "jpeg": "/9j", "pdf": "JVB", "latex": "$x$",
			"json": map[string]any{"a": 1.0}, "javascript": "alert(1)",
			"chart": map[string]any{"type": "line", "title": "T", "elements": []any{}},
			"data":  map[string]any{"a": []any{1.0, 2.0}},
			"extra": map[string]any{"application/vnd.custom": "c"},
		}},
	}, {
		name: "a quoted string result loses its quotes",
		msgs: []message{msg("execute_result", `{"data":{"text/plain":"'ab'"}}`)},
		want: []Line{{"type": "result", "is_main_result": true, "text": "ab"}},
	}, {
		name: "so does one in double quotes (Deno's strings, Python's with a ')",
		msgs: []message{msg("execute_result", `{"data":{"text/plain":"\"it's\""}}`), msg("execute_result", `{"data":{"text/plain":"\"a'"}}`)},
		want: []Line{{"type": "result", "is_main_result": true, "text": "it's"}, {"type": "result", "is_main_result": true, "text": "\"a'"}},
	}, {
		name: "messages an execution does not map are dropped",
		msgs: []message{
			msg("status", `{"execution_state":"busy"}`),
			msg("comm_open", `{}`),
			msg("clear_output", `{"wait":false}`),
			msg("stream", `not json`),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := &execution{msgID: "req"}
			var got []Line
			for _, m := range tc.msgs {
				got = append(got, e.handle(m)...)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("lines:\n got %v\nwant %v", got, tc.want)
			}
			if e.done != tc.done || e.failed != tc.failed {
				t.Errorf("done %v failed %v, want %v %v", e.done, e.failed, tc.done, tc.failed)
			}
		})
	}
}

func TestKernelGone(t *testing.T) {
	e := &execution{}
	got := e.kernelGone("gone")
	want := []Line{{"type": "error", "name": "DeadKernelError", "value": "gone", "traceback": ""}}
	if !reflect.DeepEqual(got, want) || !e.done {
		t.Errorf("kernelGone: %v done %v", got, e.done)
	}
	// After an error line, the end is silent: one error per execution.
	e = &execution{}
	e.handle(msg("error", `{"ename":"X","evalue":"y","traceback":[]}`))
	if got := e.kernelGone("gone"); got != nil || !e.done {
		t.Errorf("kernelGone after an error: %v", got)
	}
}

// Lines marshal as E2B's SDKs parse them: the type, and exactly the
// fields set.
func TestLineJSON(t *testing.T) {
	raw, err := json.Marshal(resultLine(map[string]any{"text/plain": "2"}, true))
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != `{"is_main_result":true,"text":"2","type":"result"}` {
		t.Errorf("result line: %s", raw)
	}
}

func TestEnvCode(t *testing.T) {
	for _, tc := range []struct {
		lang  string
		set   map[string]string
		unset []string
		want  string
	}{
		{"python", map[string]string{"A": `x"y'z`}, []string{"B"},
			"import os as _sbx_os\n_sbx_os.environ.update({\"A\":\"x\\\"y'z\"})\n[_sbx_os.environ.pop(_k, None) for _k in [\"B\"]]\ndel _sbx_os"},
		{"bash", map[string]string{"B": "2", "A": "it's"}, []string{"C"}, "export A='it'\\''s'\nexport B='2'\nunset C\n"},
		{"javascript", map[string]string{"A": "1"}, []string{}, `Object.assign(process.env, {"A":"1"}); for (const k of []) delete process.env[k];`},
		{"python", nil, nil, ""},
		{"cobol", map[string]string{"A": "1"}, nil, ""},
	} {
		if got := envCode(tc.lang, tc.set, tc.unset); got != tc.want {
			t.Errorf("envCode(%s, %v, %v):\n got %q\nwant %q", tc.lang, tc.set, tc.unset, got, tc.want)
		}
	}
}

func TestEnvDiff(t *testing.T) {
	set, unset := envDiff(map[string]string{"A": "1", "B": "2", "C": "3"}, map[string]string{"A": "1", "B": "x", "D": "4"})
	if !reflect.DeepEqual(set, map[string]string{"B": "x", "D": "4"}) || !reflect.DeepEqual(unset, []string{"C"}) {
		t.Errorf("envDiff: set %v unset %v", set, unset)
	}
	if _, unset := envDiff(nil, nil); unset == nil {
		t.Error("envDiff: unset is nil, the kernel's code would read null")
	}
}

func TestNormLanguageAndSessionPath(t *testing.T) {
	for in, want := range map[string]string{"Python": "python", " JS ": "javascript", "ts": "typescript", "bash": "bash"} {
		if got := normLanguage(in); got != want {
			t.Errorf("normLanguage(%q) = %q, want %q", in, got, want)
		}
	}
	if got := sessionPath("/home/user/", "id"); got != "home/user/.sandboxd-id.ipynb" {
		t.Errorf("sessionPath: %q", got)
	}
}

// A keepalive that fires as the handler returns must not touch the
// finished response (it did, and crashed the server).
func TestNDJSONAfterClose(t *testing.T) {
	rec := httptest.NewRecorder()
	o := &ndjson{w: rec}
	if err := o.write(Line{"type": typeEnd}); err != nil {
		t.Fatal(err)
	}
	o.close()
	if err := o.write(Line{"type": typeKeepalive}); !errors.Is(err, errClosed) {
		t.Errorf("write after close: %v, want errClosed", err)
	}
	if got := rec.Body.String(); got != "{\"type\":\"end_of_execution\"}\n" || rec.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Errorf("body %q, content type %q", got, rec.Header().Get("Content-Type"))
	}
}
