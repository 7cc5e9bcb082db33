package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

// Metrics history and sandbox logs end to end, on real sandboxes, with a
// short sampling period.

type e2eMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

type e2eLogEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

func (s *e2eServer) metrics(t *testing.T, key, id, query string) []e2eMetric {
	t.Helper()
	r := s.api(t, http.MethodGet, "/sandboxes/"+id+"/metrics"+query, key, nil)
	wantStatus(t, "metrics"+query, r, http.StatusOK)
	var ms []e2eMetric
	e2eDecode(t, "metrics", r, &ms)
	for i, m := range ms {
		if m.Timestamp.Unix() != m.TimestampUnix || m.CPUCount <= 0 || m.MemTotal <= 0 || m.DiskTotal <= 0 {
			t.Errorf("metrics%s: sample %d = %+v; want timestamp = timestampUnix and the totals set", query, i, m)
		}
		if i > 0 && m.Timestamp.Before(ms[i-1].Timestamp) {
			t.Errorf("metrics%s: sample %d at %v before sample %d at %v; want oldest first", query, i, m.Timestamp, i-1, ms[i-1].Timestamp)
		}
	}
	return ms
}

// logsV1 is GET /sandboxes/{id}/logs; it checks that logs and logEntries
// say the same.
func (s *e2eServer) logsV1(t *testing.T, key, id, query string) []e2eLogEntry {
	t.Helper()
	r := s.api(t, http.MethodGet, "/sandboxes/"+id+"/logs"+query, key, nil)
	wantStatus(t, "logs v1"+query, r, http.StatusOK)
	wantKeys(t, "logs v1", r.body, "logs", "logEntries")
	var body struct {
		Logs []struct {
			Timestamp time.Time `json:"timestamp"`
			Line      string    `json:"line"`
		} `json:"logs"`
		LogEntries []e2eLogEntry `json:"logEntries"`
	}
	e2eDecode(t, "logs v1", r, &body)
	if len(body.Logs) != len(body.LogEntries) {
		t.Fatalf("logs v1: %d lines, %d entries; want as many", len(body.Logs), len(body.LogEntries))
	}
	// A line is the raw JSON record, as E2B's log pipeline stores it and
	// the e2b CLI parses it: the entry's level, message and fields, and
	// a logger.
	for i, l := range body.Logs {
		e := body.LogEntries[i]
		var rec map[string]string
		if err := json.Unmarshal([]byte(l.Line), &rec); err != nil {
			t.Errorf("logs v1: line %d %q is not a JSON record: %v", i, l.Line, err)
			continue
		}
		if rec["message"] != e.Message || rec["level"] != e.Level || rec["logger"] == "" || !l.Timestamp.Equal(e.Timestamp) {
			t.Errorf("logs v1: line %d %q at %v, entry %+v; want the same record", i, l.Line, l.Timestamp, e)
		}
		for k, v := range e.Fields {
			if k != "logger" && rec[k] != v {
				t.Errorf("logs v1: line %d %q: field %s = %q; want %q", i, l.Line, k, rec[k], v)
			}
		}
	}
	return body.LogEntries
}

func (s *e2eServer) logsV2(t *testing.T, key, id, query string) []e2eLogEntry {
	t.Helper()
	r := s.api(t, http.MethodGet, "/v2/sandboxes/"+id+"/logs"+query, key, nil)
	wantStatus(t, "logs v2"+query, r, http.StatusOK)
	var body struct {
		Logs []e2eLogEntry `json:"logs"`
	}
	e2eDecode(t, "logs v2", r, &body)
	for i, e := range body.Logs {
		if e.Fields == nil || e.Level == "" || e.Timestamp.IsZero() {
			t.Errorf("logs v2%s: entry %d = %+v; want timestamp, level and fields", query, i, e)
		}
	}
	return body.Logs
}

func messages(es []e2eLogEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Message
	}
	return out
}

func hasMessage(es []e2eLogEntry, sub string) (e2eLogEntry, bool) {
	for _, e := range es {
		if strings.Contains(e.Message, sub) {
			return e, true
		}
	}
	return e2eLogEntry{}, false
}

func TestMetricsHistoryE2E(t *testing.T) {
	e := newE2EEnv(t, "alice", "bob")
	e.serveArgs = []string{"--metrics-interval=200ms"}
	s := e.start()
	key, keyB := e.keys["alice"], e.keys["bob"]
	created := time.Now()
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 300})
	id := sb.SandboxID

	// A new sandbox answers a sample at once; then the history grows.
	if ms := s.metrics(t, key, id, ""); len(ms) == 0 {
		t.Fatal("metrics of a new sandbox: none; want at least the current sample")
	}
	var all []e2eMetric
	e2eEventually(t, "6 samples", 20*time.Second, 100*time.Millisecond, func() (bool, string) {
		all = s.metrics(t, key, id, "")
		return len(all) >= 6, fmt.Sprintf("%d samples", len(all))
	})
	if span := all[len(all)-1].Timestamp.Sub(all[0].Timestamp); span < 500*time.Millisecond {
		t.Errorf("6 samples over %v; want them 200 ms apart", span)
	}

	// Ranges are inclusive unix seconds.
	mid := all[len(all)/2].TimestampUnix
	for _, tc := range []struct {
		query string
		keep  func(int64) bool
	}{
		{fmt.Sprintf("?start=%d&end=%d", mid, mid), func(u int64) bool { return u == mid }},
		{fmt.Sprintf("?start=%d", mid), func(u int64) bool { return u >= mid }},
		{fmt.Sprintf("?end=%d", mid), func(u int64) bool { return u <= mid }},
	} {
		got := s.metrics(t, key, id, tc.query)
		if len(got) == 0 {
			t.Errorf("metrics%s: none; want the samples of that range", tc.query)
		}
		for _, m := range got {
			if !tc.keep(m.TimestampUnix) {
				t.Errorf("metrics%s: a sample at %d, out of range", tc.query, m.TimestampUnix)
			}
		}
	}
	if got := s.metrics(t, key, id, fmt.Sprintf("?end=%d", created.Unix()-60)); len(got) != 0 {
		t.Errorf("metrics of a window before the sandbox: %d samples; want none", len(got))
	}
	if got := s.metrics(t, key, id, fmt.Sprintf("?start=%d", time.Now().Unix()+3600)); len(got) != 0 {
		t.Errorf("metrics of a window in the future: %d samples; want none", len(got))
	}
	wantError(t, "metrics with start after end", s.api(t, http.MethodGet,
		fmt.Sprintf("/sandboxes/%s/metrics?start=%d&end=%d", id, mid+10, mid), key, nil), http.StatusBadRequest)

	// The batch route answers the latest sample.
	r := s.api(t, http.MethodGet, "/sandboxes/metrics?sandbox_ids="+id, key, nil)
	wantStatus(t, "batch metrics", r, http.StatusOK)
	var batch struct {
		Sandboxes map[string]e2eMetric `json:"sandboxes"`
	}
	e2eDecode(t, "batch metrics", r, &batch)
	if m, ok := batch.Sandboxes[id]; !ok || m.TimestampUnix < all[len(all)-1].TimestampUnix {
		t.Errorf("batch metrics: %s; want the latest sample of %s", r.body, id)
	}

	// Paused: not sampled. Resumed: sampled again.
	wantStatus(t, "pause", s.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, nil), http.StatusNoContent)
	paused := len(s.metrics(t, key, id, ""))
	time.Sleep(time.Second)
	if n := len(s.metrics(t, key, id, "")); n != paused {
		t.Errorf("samples while paused: %d then %d a second later; want no new ones", paused, n)
	}
	wantStatus(t, "resume", s.api(t, http.MethodPost, "/sandboxes/"+id+"/resume", key, map[string]any{"timeout": 300}), http.StatusCreated)
	e2eEventually(t, "samples after the resume", 20*time.Second, 100*time.Millisecond, func() (bool, string) {
		n := len(s.metrics(t, key, id, ""))
		return n >= paused+2, fmt.Sprintf("%d samples, %d at the pause", n, paused)
	})

	// Another tenant's sandbox is a missing one, on both routes.
	wantError(t, "metrics as bob", s.api(t, http.MethodGet, "/sandboxes/"+id+"/metrics", keyB, nil), http.StatusNotFound)
	wantError(t, "logs as bob", s.api(t, http.MethodGet, "/sandboxes/"+id+"/logs", keyB, nil), http.StatusNotFound)
	wantError(t, "logs v2 as bob", s.api(t, http.MethodGet, "/v2/sandboxes/"+id+"/logs", keyB, nil), http.StatusNotFound)

	// A killed sandbox has no metrics any more.
	wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
	wantError(t, "metrics after the kill", s.api(t, http.MethodGet, "/sandboxes/"+id+"/metrics", key, nil), http.StatusNotFound)
}

func TestSandboxLogsE2E(t *testing.T) {
	e := newE2EEnv(t, "alice", "bob")
	s := e.start()
	key, keyB := e.keys["alice"], e.keys["bob"]

	// A template whose start command prints on both streams, then prints
	// whatever /tmp/say holds, for the test to make it speak after a
	// pause.
	b := requestBuild(t, s, key, "talker", nil)
	st := startBuild(t, s, key, b, map[string]any{
		"fromImage": "e2bdev/base",
		"steps":     []map[string]any{{"type": "RUN", "args": []string{"true"}}},
		"startCmd": "echo hello from start; echo oops on stderr >&2; touch /tmp/ready; " +
			"while true; do if [ -f /tmp/say ]; then cat /tmp/say; rm -f /tmp/say; fi; sleep 0.1; done",
		"readyCmd": "test -f /tmp/ready",
	})
	if st.Status != "ready" {
		t.Fatalf("build: %s, reason %+v, logs %q", st.Status, st.Reason, st.Logs)
	}
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"templateID": "talker", "timeout": 300,
		"envVars": map[string]string{"E2E_SECRET": e2eLogSecret}})
	id, tok := sb.SandboxID, *sb.EnvdAccessToken
	checkEnvdLines(t, s, key, id, tok)

	var entries []e2eLogEntry
	e2eEventually(t, "the start command's output in the log", 20*time.Second, 100*time.Millisecond, func() (bool, string) {
		entries = s.logsV1(t, key, id, "")
		_, out := hasMessage(entries, "hello from start")
		_, errOut := hasMessage(entries, "oops on stderr")
		return out && errOut, fmt.Sprintf("%q", messages(entries))
	})
	if e, _ := hasMessage(entries, "hello from start"); e.Level != "info" || e.Fields["source"] != "start-cmd" || e.Fields["stream"] != "stdout" {
		t.Errorf("stdout line: %+v; want level info, source start-cmd, stream stdout", e)
	}
	if e, _ := hasMessage(entries, "oops on stderr"); e.Level != "error" || e.Fields["stream"] != "stderr" {
		t.Errorf("stderr line: %+v; want level error, stream stderr", e)
	}
	if e, ok := hasMessage(entries, "sandbox created"); !ok || e.Fields["source"] != "sandboxd" || e.Fields["action"] != "create" || e.Level != "info" {
		t.Errorf("create event: %+v, %v; want an info entry of source sandboxd, action create, in %q", e, ok, messages(entries))
	}

	// Lifecycle events, and start command output after a pause and resume.
	wantStatus(t, "set timeout", s.api(t, http.MethodPost, "/sandboxes/"+id+"/timeout", key, map[string]any{"timeout": 200}), http.StatusNoContent)
	wantStatus(t, "pause", s.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, nil), http.StatusNoContent)
	wantStatus(t, "resume", s.api(t, http.MethodPost, "/sandboxes/"+id+"/resume", key, map[string]any{"timeout": 300}), http.StatusCreated)
	s.writeFile(t, id, tok, "/tmp/say", []byte("said after the resume\n"))
	e2eEventually(t, "output after the resume", 20*time.Second, 100*time.Millisecond, func() (bool, string) {
		entries = s.logsV1(t, key, id, "")
		_, ok := hasMessage(entries, "said after the resume")
		return ok, fmt.Sprintf("%q", messages(entries))
	})
	for _, want := range []string{"sandbox created", "sandbox timeout set", "sandbox paused", "sandbox resumed", "said after the resume"} {
		e, ok := hasMessage(entries, want)
		if !ok {
			t.Errorf("log lacks %q: %q", want, messages(entries))
			continue
		}
		if want == "sandbox timeout set" && e.Fields["timeout_s"] != "200" {
			t.Errorf("timeout event fields %v; want timeout_s 200", e.Fields)
		}
	}
	noEnvdRepeats(t, entries)
	for i := 1; i < len(entries); i++ {
		if entries[i].Timestamp.Before(entries[i-1].Timestamp) {
			t.Errorf("logs v1 not oldest first: %v then %v", entries[i-1].Timestamp, entries[i].Timestamp)
		}
	}

	// v2: newest first by default, paging by cursor both ways, level and
	// search.
	v2 := s.logsV2(t, key, id, "")
	if len(v2) != len(entries) || v2[0].Message != entries[len(entries)-1].Message {
		t.Errorf("logs v2 default: %q; want v1's %q newest first", messages(v2), messages(entries))
	}
	page := s.logsV2(t, key, id, "?limit=2")
	if len(page) != 2 {
		t.Fatalf("logs v2 ?limit=2: %d entries", len(page))
	}
	cursor := page[1].Timestamp.UnixMilli()
	older := s.logsV2(t, key, id, fmt.Sprintf("?cursor=%d&limit=1000", cursor))
	for _, e := range older {
		if e.Timestamp.UnixMilli() > cursor {
			t.Errorf("logs v2 backward from %d: an entry at %d", cursor, e.Timestamp.UnixMilli())
		}
	}
	first := entries[0].Timestamp.UnixMilli()
	fwd := s.logsV2(t, key, id, fmt.Sprintf("?cursor=%d&direction=forward&limit=3", first))
	if len(fwd) != 3 || !slices.Equal(messages(fwd), messages(entries[:3])) {
		t.Errorf("logs v2 forward from the first: %q; want %q", messages(fwd), messages(entries[:3]))
	}
	for _, e := range s.logsV2(t, key, id, "?level=error") {
		if e.Level != "error" {
			t.Errorf("logs v2 ?level=error: %+v", e)
		}
	}
	if got := s.logsV2(t, key, id, "?level=warn"); len(got) == 0 {
		t.Error("logs v2 ?level=warn: none; want the stderr line")
	}
	found := s.logsV2(t, key, id, "?search="+url.QueryEscape("sandbox paused"))
	if len(found) != 1 || found[0].Fields["action"] != "pause" {
		t.Errorf("logs v2 search: %q; want the pause alone", messages(found))
	}
	if got := s.logsV1(t, key, id, fmt.Sprintf("?start=%d", entries[len(entries)-1].Timestamp.UnixMilli()+1)); len(got) != 0 {
		t.Errorf("logs v1 after the last entry: %q; want none", messages(got))
	}
	if got := s.logsV1(t, key, id, "?limit=1"); len(got) != 1 || got[0].Message != entries[0].Message {
		t.Errorf("logs v1 ?limit=1: %q; want the oldest alone", messages(got))
	}
	wantError(t, "logs v2 bad direction", s.api(t, http.MethodGet, "/v2/sandboxes/"+id+"/logs?direction=up", key, nil), http.StatusBadRequest)
	wantError(t, "logs v2 as bob", s.api(t, http.MethodGet, "/v2/sandboxes/"+id+"/logs", keyB, nil), http.StatusNotFound)

	checkEnvdRestart(t, s, key, id, tok)
	// The last lines of envd are read before the kill.
	s.mustRun(t, id, tok, "echo before-kill-e2e")

	// After the kill, the owner still reads the log, ending with the kill;
	// another tenant still gets 404.
	wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
	after := s.logsV2(t, key, id, "?limit=1")
	if len(after) != 1 || after[0].Message != "sandbox killed" {
		t.Errorf("newest entry after the kill: %q; want sandbox killed", messages(after))
	}
	if all := s.logsV1(t, key, id, ""); !startedLine(all, "before-kill-e2e") {
		t.Errorf("no process started line of the command run right before the kill in %q", messages(all))
	}
	wantError(t, "logs of a killed sandbox as bob", s.api(t, http.MethodGet, "/sandboxes/"+id+"/logs", keyB, nil), http.StatusNotFound)
}

// e2eLogSecret is an env var's value that no log line may show.
const e2eLogSecret = "hush-e2e-value"

// checkEnvdLines runs a command in sandbox id through envd and finds envd's
// own lines about it (started, ended with its exit code) in the sandbox's
// log, through both logs routes, v2 paged forward by cursor; and envd's
// /init line names the create's env var, never its value or the token.
func checkEnvdLines(t *testing.T, s *e2eServer, key, id, tok string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	res, err := s.run(ctx, id, tok, "echo envd-e2e; exit 3")
	cancel()
	if err != nil || !res.ended || res.exitCode != 3 {
		t.Fatalf("run: %+v, %v; want exit code 3", res, err)
	}
	mine := func(es []e2eLogEntry) (started, ended e2eLogEntry, ok bool) {
		for _, e := range es {
			if e.Fields["source"] == "envd" && e.Message == "process started" && strings.Contains(e.Fields["args"], "envd-e2e") {
				started = e
			}
		}
		for _, e := range es {
			if e.Fields["source"] == "envd" && e.Message == "process ended" && started.Fields["pid"] != "" && e.Fields["pid"] == started.Fields["pid"] {
				ended = e
			}
		}
		return started, ended, ended.Message != ""
	}
	// At once: envd logs the end before it sends it, and a logs request
	// reads envd's new lines.
	started, ended, ok := mine(s.logsV1(t, key, id, ""))
	if !ok {
		t.Fatalf("envd's lines about the command right after it: started %+v, ended %+v", started, ended)
	}
	if started.Level != "info" || started.Fields["cmd"] != "/bin/sh" || started.Fields["user"] == "" || started.Fields["cwd"] == "" ||
		started.Fields["service"] != "process" {
		t.Errorf("process started: %+v; want info with cmd /bin/sh, args, user, cwd, service process", started)
	}
	if ended.Fields["exit_code"] != "3" || ended.Fields["status"] != "exit status 3" || ended.Timestamp.Before(started.Timestamp) {
		t.Errorf("process ended: %+v; want exit_code 3, status exit status 3, after %v", ended, started.Timestamp)
	}

	// v2, forward from before the command, a few entries a page, each
	// page's cursor the time of the last one's newest (inclusive: repeats
	// are skipped; a page of repeats alone moves on a millisecond).
	const pageSize = 4
	var paged []e2eLogEntry
	have := map[string]bool{}
	cursor := started.Timestamp.Add(-time.Second).UnixMilli()
	for range 100 {
		page := s.logsV2(t, key, id, fmt.Sprintf("?direction=forward&cursor=%d&limit=%d&search=process", cursor, pageSize))
		added := false
		for _, e := range page {
			if k := envdLineKey(e); !have[k] {
				have[k], added = true, true
				paged = append(paged, e)
			}
		}
		if !added && len(page) < pageSize {
			break
		}
		if added {
			cursor = page[len(page)-1].Timestamp.UnixMilli()
		} else {
			cursor++
		}
	}
	if s2, e2, ok := mine(paged); !ok || !s2.Timestamp.Equal(started.Timestamp) || !e2.Timestamp.Equal(ended.Timestamp) {
		t.Errorf("logs v2 paged: started %+v, ended %+v; want v1's %v and %v in %q", s2, e2, started.Timestamp, ended.Timestamp, messages(paged))
	}

	all := s.logsV1(t, key, id, "")
	if !slices.ContainsFunc(all, func(e e2eLogEntry) bool {
		return e.Message == "initialised" && e.Fields["source"] == "envd" && strings.Contains(e.Fields["env_vars"], "E2E_SECRET")
	}) {
		t.Errorf("no envd init line naming E2E_SECRET in %q", messages(all))
	}
	raw, _ := json.Marshal(all)
	if strings.Contains(string(raw), e2eLogSecret) || strings.Contains(string(raw), tok) {
		t.Errorf("the log shows an env var's value or the access token: %s", raw)
	}
}

// envdLineKey tells envd's lines apart: two of them at one time with the
// same message are about two processes.
func envdLineKey(e e2eLogEntry) string { return e.Timestamp.String() + e.Message + e.Fields["pid"] }

// noEnvdRepeats fails if an envd line is in es twice.
func noEnvdRepeats(t *testing.T, es []e2eLogEntry) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range es {
		if e.Fields["source"] != "envd" {
			continue
		}
		if seen[envdLineKey(e)] {
			t.Errorf("envd line twice in the log: %+v", e)
		}
		seen[envdLineKey(e)] = true
	}
}

// startedLine says whether es has envd's process started line of a command
// whose args hold marker.
func startedLine(es []e2eLogEntry, marker string) bool {
	return slices.ContainsFunc(es, func(e e2eLogEntry) bool {
		return e.Fields["source"] == "envd" && e.Message == "process started" && strings.Contains(e.Fields["args"], marker)
	})
}

// checkEnvdRestart pauses sandbox id to disk and resumes it, which starts
// a new envd: its lines join the log after the old one's, which stay, and
// none is repeated. The old envd's last lines, of a command run right
// before the pause with no logs request between, are there: read before
// the pause, as its envd is gone after it.
func checkEnvdRestart(t *testing.T, s *e2eServer, key, id, tok string) {
	t.Helper()
	before := s.logsV1(t, key, id, "")
	s.mustRun(t, id, tok, "echo before-pause-e2e")
	wantStatus(t, "pause to disk", s.api(t, http.MethodPost, "/sandboxes/"+id+"/pause", key, map[string]any{"memory": false}), http.StatusNoContent)
	wantStatus(t, "resume from disk", s.api(t, http.MethodPost, "/sandboxes/"+id+"/resume", key, map[string]any{"timeout": 300}), http.StatusCreated)
	s.mustRun(t, id, tok, "echo after-restart-e2e")
	after := s.logsV1(t, key, id, "")
	for _, marker := range []string{"before-pause-e2e", "after-restart-e2e"} {
		if !startedLine(after, marker) {
			t.Errorf("no process started line of the command %s in %q", marker, messages(after))
		}
	}
	have := map[string]bool{}
	for _, e := range after {
		have[envdLineKey(e)] = true
	}
	for _, e := range before {
		if e.Fields["source"] == "envd" && !have[envdLineKey(e)] {
			t.Errorf("envd line from before the restart gone: %+v", e)
		}
	}
	noEnvdRepeats(t, after)
}

// TestIncusEnvdLogsE2E: envd's own lines reach the sandbox's log on the
// Incus backend too, where envd's stderr goes to the container's console,
// and a pause to disk (a new envd) loses and repeats none.
func TestIncusEnvdLogsE2E(t *testing.T) {
	e, _ := newIncusE2EEnv(t, "alice")
	s := e.start()
	key := e.keys["alice"]
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 300, "envVars": map[string]string{"E2E_SECRET": e2eLogSecret}})
	id, tok := sb.SandboxID, *sb.EnvdAccessToken
	checkEnvdLines(t, s, key, id, tok)
	checkEnvdRestart(t, s, key, id, tok)
	wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
}
