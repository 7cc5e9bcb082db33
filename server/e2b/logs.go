package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/e2bapi"
	"github.com/sandboxd/sandboxd/sandbox"
)

// defaultLogsLimit is E2B's default page of log entries.
const defaultLogsLimit = 1000

func logEntry(e sandbox.LogEntry) e2bapi.SandboxLogEntry {
	fields := e.Fields
	if fields == nil {
		fields = map[string]string{}
	}
	return e2bapi.SandboxLogEntry{Timestamp: e.At, Level: e2bapi.LogLevel(e.Level.String()), Message: e.Message, Fields: fields}
}

// rawLine is an entry as E2B's v1 route has it: the raw JSON record its
// log pipeline stored (level, logger, message and the fields), which the
// e2b CLI's `sandbox logs` parses. Its logger is envd for envd's lines,
// sandboxd for the rest.
func rawLine(e sandbox.LogEntry) string {
	rec := make(map[string]string, len(e.Fields)+3)
	for k, v := range e.Fields {
		rec[k] = v
	}
	if rec["logger"] == "" {
		rec["logger"] = "sandboxd"
		if e.Fields["source"] == "envd" {
			rec["logger"] = "envd"
		}
	}
	rec["level"] = e.Level.String()
	rec["message"] = e.Message
	b, err := json.Marshal(rec)
	if err != nil { // strings only: cannot happen
		return e.Message
	}
	return string(b)
}

func logsLimit(limit *int32) int {
	if limit == nil {
		return defaultLogsLimit
	}
	return int(*limit)
}

func unixMillis(v *int64) time.Time {
	if v == nil {
		return time.Time{}
	}
	return time.UnixMilli(*v)
}

// GetSandboxLogs is the deprecated v1 route: the entries at or after start
// (unix ms), oldest first, both as raw lines and as entries.
func (a *API) GetSandboxLogs(ctx context.Context, req e2bapi.GetSandboxLogsRequestObject) (e2bapi.GetSandboxLogsResponseObject, error) {
	q := sandbox.LogQuery{Start: unixMillis(req.Params.Start), Limit: logsLimit(req.Params.Limit)}
	entries, err := a.logs(ctx, req.SandboxID, q)
	if err != nil {
		return nil, err
	}
	out := e2bapi.GetSandboxLogs200JSONResponse{Logs: make([]e2bapi.SandboxLog, 0, len(entries)), LogEntries: make([]e2bapi.SandboxLogEntry, 0, len(entries))}
	for _, e := range entries {
		out.Logs = append(out.Logs, e2bapi.SandboxLog{Timestamp: e.At, Line: rawLine(e)})
		out.LogEntries = append(out.LogEntries, logEntry(e))
	}
	return out, nil
}

// GetSandboxLogsV2 pages a sandbox's log as E2B does: backward (newest
// first) from the cursor (unix ms, inclusive; default now) unless
// direction is forward (oldest first from the cursor), at or above level,
// with search in the message.
func (a *API) GetSandboxLogsV2(ctx context.Context, req e2bapi.GetSandboxLogsV2RequestObject) (e2bapi.GetSandboxLogsV2ResponseObject, error) {
	p := req.Params
	q := sandbox.LogQuery{Limit: logsLimit(p.Limit), Backward: true}
	if p.Direction != nil {
		switch *p.Direction {
		case e2bapi.LogsDirectionForward:
			q.Backward = false
		case e2bapi.LogsDirectionBackward:
		default:
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "direction: want forward or backward")
		}
	}
	if q.Backward {
		q.End = unixMillis(p.Cursor)
	} else {
		q.Start = unixMillis(p.Cursor)
	}
	if p.Level != nil {
		lvl, ok := logLevel(*p.Level)
		if !ok {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("level %q: want debug, info, warn or error", *p.Level))
		}
		q.MinLevel = lvl
	}
	if p.Search != nil {
		q.Search = *p.Search
	}
	entries, err := a.logs(ctx, req.SandboxID, q)
	if err != nil {
		return nil, err
	}
	out := e2bapi.GetSandboxLogsV2200JSONResponse{Logs: make([]e2bapi.SandboxLogEntry, 0, len(entries))}
	for _, e := range entries {
		out.Logs = append(out.Logs, logEntry(e))
	}
	return out, nil
}

// logs reads a sandbox's log; a limit of 0 reads none (the sandbox must
// still be the caller's).
func (a *API) logs(ctx context.Context, id string, q sandbox.LogQuery) ([]sandbox.LogEntry, error) {
	if q.Limit < 0 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "limit must not be negative")
	}
	if q.Limit == 0 {
		q.Limit = 1 // none asked for; the sandbox must still be the caller's
		_, err := a.mgr.Logs(ctx, id, q)
		return []sandbox.LogEntry{}, err
	}
	return a.mgr.Logs(ctx, id, q)
}

func logLevel(l e2bapi.LogLevel) (sandbox.LogLevel, bool) {
	switch l {
	case e2bapi.LogLevelDebug:
		return sandbox.LogDebug, true
	case e2bapi.LogLevelInfo:
		return sandbox.LogInfo, true
	case e2bapi.LogLevelWarn:
		return sandbox.LogWarn, true
	case e2bapi.LogLevelError:
		return sandbox.LogError, true
	}
	return 0, false
}
