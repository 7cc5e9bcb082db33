// Package codeinterp owns the code interpreter that E2B's code-interpreter
// SDKs talk to on port 49999 inside a sandbox: the HTTP surface (/execute,
// /contexts, /health), the contexts (one Jupyter session and kernel each),
// the Jupyter client (REST, for the kernels' lifecycle) and the kernel
// client (Jupyter's messaging protocol over ZeroMQ, package zmtp, straight
// to the kernels' shell and iopub channels), and the mapping of Jupyter's
// messages to E2B's NDJSON output lines. It runs as cmd/code-interpreter,
// the start command of the code-interpreter-v1 template, beside a Jupyter
// Server on loopback.
package codeinterp

import (
	"encoding/json"
	"strings"
)

// header is a Jupyter message header (messaging protocol 5.x).
type header struct {
	MsgID    string `json:"msg_id"`
	MsgType  string `json:"msg_type"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date,omitempty"`
	Version  string `json:"version"`
}

// message is one message from a kernel, with the channel it came on.
type message struct {
	Header       header
	ParentHeader header
	Content      json.RawMessage
	Channel      string // shell or iopub
}

// Output line types of /execute, as E2B's SDKs read them.
const (
	typeStdout     = "stdout"
	typeStderr     = "stderr"
	typeResult     = "result"
	typeError      = "error"
	typeExecutions = "number_of_executions"
	typeKeepalive  = "keepalive"
	typeEnd        = "end_of_execution"
)

// Line is one NDJSON line of /execute's answer.
type Line map[string]any

func streamLine(kind, text, ts string) Line {
	return Line{"type": kind, "text": text, "timestamp": ts}
}

func errorLine(name, value, traceback string) Line {
	return Line{"type": typeError, "name": name, "value": value, "traceback": traceback}
}

// mimeFields maps the MIME types of a Jupyter bundle to E2B's result
// fields; every other type goes to "extra".
var mimeFields = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	"e2b/data":               "data",
	"e2b/chart":              "chart",
}

// resultLine maps a display_data or execute_result bundle to a result
// line. A text/plain that is a quoted string (in ' or ", as Python and
// Deno show strings) loses its quotes, as E2B's server does, so 'a' + 'b'
// reads as ab.
func resultLine(data map[string]any, main bool) Line {
	l := Line{"type": typeResult, "is_main_result": main}
	extra := map[string]any{}
	for mime, v := range data {
		f, ok := mimeFields[mime]
		if !ok {
			extra[mime] = v
			continue
		}
		if s, isStr := v.(string); isStr && f == "text" && quoted(s) {
			v = s[1 : len(s)-1]
		}
		l[f] = v
	}
	if len(extra) > 0 {
		l["extra"] = extra
	}
	return l
}

func quoted(s string) bool {
	return len(s) >= 2 && (s[0] == '\'' || s[0] == '"') && s[len(s)-1] == s[0]
}

// execution follows one execute_request through the kernel's replies and
// turns them into output lines.
type execution struct {
	msgID  string
	failed bool // an error line was sent
	done   bool
}

// The content shapes of the messages an execution reads.
type (
	streamContent struct {
		Name string `json:"name"`
		Text string `json:"text"`
	}
	bundleContent struct {
		Data map[string]any `json:"data"`
	}
	errorContent struct {
		Status    string   `json:"status"`
		EName     string   `json:"ename"`
		EValue    string   `json:"evalue"`
		Traceback []string `json:"traceback"`
	}
	statusContent struct {
		ExecutionState string `json:"execution_state"`
	}
	inputContent struct {
		ExecutionCount int `json:"execution_count"`
	}
)

// handle maps one kernel message addressed to this execution to output
// lines; done reports the execution over (the kernel went idle).
// Messages of other requests are the caller's to route away.
func (e *execution) handle(m message) []Line {
	switch m.Header.MsgType {
	case "stream":
		var c streamContent
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		kind := typeStdout
		if c.Name == "stderr" {
			kind = typeStderr
		}
		return []Line{streamLine(kind, c.Text, m.Header.Date)}
	case "display_data", "update_display_data":
		var c bundleContent
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		return []Line{resultLine(c.Data, false)}
	case "execute_result":
		var c bundleContent
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		return []Line{resultLine(c.Data, true)}
	case "error":
		var c errorContent
		// The execute_reply, on another channel, may have told the
		// error first.
		if json.Unmarshal(m.Content, &c) != nil || e.failed {
			return nil
		}
		e.failed = true
		return []Line{errorLine(c.EName, c.EValue, strings.Join(c.Traceback, "\n"))}
	case "execute_input":
		var c inputContent
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		return []Line{{"type": typeExecutions, "execution_count": c.ExecutionCount}}
	case "execute_reply":
		// The iopub error message carries the same error; a reply
		// says more only when the kernel aborted the request.
		var c errorContent
		if json.Unmarshal(m.Content, &c) != nil || e.failed {
			return nil
		}
		switch c.Status {
		case "error":
			e.failed = true
			return []Line{errorLine(c.EName, c.EValue, strings.Join(c.Traceback, "\n"))}
		case "aborted":
			e.failed = true
			return []Line{errorLine("ExecutionAborted", "the kernel aborted the execution", "")}
		}
	case "status":
		var c statusContent
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		if c.ExecutionState == "idle" {
			e.done = true
		}
	}
	return nil
}

// kernelGone is the error line of an execution whose kernel died or whose
// link to it dropped; its context starts a kernel anew on the next call.
func (e *execution) kernelGone(why string) []Line {
	e.done = true
	if e.failed {
		return nil
	}
	e.failed = true
	return []Line{errorLine("DeadKernelError", why, "")}
}
