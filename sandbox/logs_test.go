package sandbox

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
)

func TestSelectEntries(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	r := newRing[LogEntry](100)
	// m0..m5, a second apart; odd ones are errors.
	for i := range 6 {
		lvl := LogInfo
		if i%2 == 1 {
			lvl = LogError
		}
		r.push(LogEntry{At: t0.Add(time.Duration(i) * time.Second), Level: lvl, Message: fmt.Sprintf("m%d", i)})
	}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	tests := []struct {
		name string
		q    LogQuery
		want string
	}{
		{"all forward", LogQuery{}, "m0 m1 m2 m3 m4 m5"},
		{"all backward", LogQuery{Backward: true}, "m5 m4 m3 m2 m1 m0"},
		{"limit forward", LogQuery{Limit: 2}, "m0 m1"},
		{"limit backward", LogQuery{Limit: 2, Backward: true}, "m5 m4"},
		{"forward from a cursor, inclusive", LogQuery{Start: at(3)}, "m3 m4 m5"},
		{"backward from a cursor, inclusive", LogQuery{End: at(3), Backward: true}, "m3 m2 m1 m0"},
		{"backward page", LogQuery{End: at(3), Backward: true, Limit: 2}, "m3 m2"},
		{"window", LogQuery{Start: at(1), End: at(2)}, "m1 m2"},
		{"window backward", LogQuery{Start: at(1), End: at(2), Backward: true}, "m2 m1"},
		{"min level", LogQuery{MinLevel: LogError}, "m1 m3 m5"},
		{"warn takes errors", LogQuery{MinLevel: LogWarn, Backward: true, Limit: 2}, "m5 m3"},
		{"search", LogQuery{Search: "4"}, "m4"},
		{"search is case-sensitive", LogQuery{Search: "M"}, ""},
		{"after all", LogQuery{Start: at(9)}, ""},
		{"before all", LogQuery{End: at(-1), Backward: true}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, e := range selectEntries(r, tt.q) {
				got = append(got, e.Message)
			}
			if g := strings.Join(got, " "); g != tt.want {
				t.Errorf("selectEntries(%+v) = %q; want %q", tt.q, g, tt.want)
			}
		})
	}
}

func TestLogBookBounds(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	entry := func(i int, msg string) LogEntry {
		return LogEntry{At: t0.Add(time.Duration(i) * time.Second), Message: msg}
	}
	tests := []struct {
		name           string
		entries, bytes int
		msgs           []string
		want           string
		dropped        int
	}{
		{"within", 10, 1 << 10, []string{"a", "b"}, "a b", 0},
		{"by count", 2, 1 << 10, []string{"a", "b", "c"}, "b c", 1},
		{"by bytes", 10, 3 * (32 + 10), []string{strings.Repeat("a", 10), strings.Repeat("b", 10), strings.Repeat("c", 10), strings.Repeat("d", 10)}, "bbbbbbbbbb cccccccccc dddddddddd", 1},
		{"one entry above the bytes stays", 10, 8, []string{"too long for the bound"}, "too long for the bound", 0},
		{"a big one evicts many", 10, 3 * (32 + 1), []string{"a", "b", "c", "dd"}, "c dd", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newLogBook(tt.entries, tt.bytes)
			dropped := 0
			b.onDrop = func(n int) { dropped += n }
			b.add("x", entry(0, "before open")) // not opened: dropped silently
			b.open("x")
			for i, m := range tt.msgs {
				b.add("x", entry(i, m))
			}
			got, ok := b.query("x", LogQuery{})
			if !ok {
				t.Fatal("query of an open log: not found")
			}
			var msgs []string
			for _, e := range got {
				msgs = append(msgs, e.Message)
			}
			if g := strings.Join(msgs, " "); g != tt.want || dropped != tt.dropped {
				t.Errorf("log = %q, %d dropped; want %q, %d", g, dropped, tt.want, tt.dropped)
			}
		})
	}
}

func TestLogBookRetention(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	b := newLogBook(10, 1<<10)
	b.open("live")
	b.open("killed-early")
	b.open("killed-late")
	b.end("killed-early", t0)
	b.end("killed-late", t0.Add(time.Hour))
	b.end("killed-late", t0) // the first end counts
	b.add("killed-early", LogEntry{At: t0, Message: "after the kill"})
	if got, _ := b.query("killed-early", LogQuery{}); len(got) != 1 {
		t.Errorf("an ended log took %d entries; want 1 (its kill line comes after the end)", len(got))
	}
	b.purge(t0.Add(time.Minute))
	for id, want := range map[string]bool{"live": true, "killed-early": false, "killed-late": true} {
		if _, ok := b.query(id, LogQuery{}); ok != want {
			t.Errorf("after purge, log %s kept = %v; want %v", id, ok, want)
		}
	}
	b.drop("live")
	if _, ok := b.query("live", LogQuery{}); ok {
		t.Error("a dropped log is still there")
	}
}

func TestStartLines(t *testing.T) {
	m := &Manager{logs: newLogBook(100, 1<<20), now: time.Now}
	m.logs.open("x")
	s := &startLines{m: m, id: "x"}
	s.write([]byte("one\ntw"), []byte("oops\r\n"))
	s.write([]byte("o\n"), nil)
	s.write([]byte(strings.Repeat("z", maxLogLine+10)+"\nlast"), nil)
	s.flush()
	got, _ := m.logs.query("x", LogQuery{})
	var lines []string
	for _, e := range got {
		lines = append(lines, fmt.Sprintf("%s/%s/%d", e.Fields["stream"], e.Level, len(e.Message)))
	}
	want := []string{"stdout/info/3", "stderr/error/4", "stdout/info/3", fmt.Sprintf("stdout/info/%d", maxLogLine), "stdout/info/10", "stdout/info/4"}
	if strings.Join(lines, " ") != strings.Join(want, " ") {
		t.Errorf("entries = %v; want %v", lines, want)
	}
	if got[0].Message != "one" || got[1].Message != "oops" || got[2].Message != "two" || got[5].Message != "last" {
		t.Errorf("messages = %q, %q, %q, %q; want one, oops, two, last", got[0].Message, got[1].Message, got[2].Message, got[5].Message)
	}
}

func TestLogEvent(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	tests := []struct {
		action string
		err    error
		attrs  []any
		want   string
		level  LogLevel
		fields map[string]string
	}{
		{"create", nil, []any{"took_ms", int64(12), "served_from", "pool"}, "sandbox created", LogInfo,
			map[string]string{"source": "sandboxd", "action": "create", "result": "ok", "took_ms": "12", "served_from": "pool"}},
		{"auto_resume", nil, nil, "sandbox auto resumed", LogInfo, map[string]string{"source": "sandboxd", "action": "auto_resume", "result": "ok"}},
		{"timeout_kill", nil, []any{"cause", "pause failed: /sys/fs/cgroup/x: busy"}, "sandbox timed out and was killed", LogInfo,
			map[string]string{"source": "sandboxd", "action": "timeout_kill", "result": "ok"}},
		{"pause", errors.New("freeze /sys/fs/cgroup/sandboxd/x: device busy"), []any{"memory", true}, "sandbox pause failed", LogError,
			map[string]string{"source": "sandboxd", "action": "pause", "result": "error", "memory": "true"}},
		{"pause", errdefs.New(errdefs.ErrConflict, `sandbox "x" is already paused`), nil, `sandbox pause failed: sandbox "x" is already paused`, LogError,
			map[string]string{"source": "sandboxd", "action": "pause", "result": "error"}},
	}
	for _, tt := range tests {
		m := &Manager{logs: newLogBook(10, 1<<20), now: func() time.Time { return t0 }}
		m.logs.open("x")
		m.logEvent("x", tt.action, tt.err, tt.attrs)
		got, _ := m.logs.query("x", LogQuery{})
		if len(got) != 1 {
			t.Fatalf("logEvent(%s): %d entries; want 1", tt.action, len(got))
		}
		e := got[0]
		if e.Message != tt.want || e.Level != tt.level || !maps.Equal(e.Fields, tt.fields) || !e.At.Equal(t0) {
			t.Errorf("logEvent(%s, %v) = %q %s %v; want %q %s %v", tt.action, tt.err, e.Message, e.Level, e.Fields, tt.want, tt.level, tt.fields)
		}
	}
}
