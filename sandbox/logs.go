package sandbox

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// A sandbox's log, as E2B's logs routes serve it: the control plane's
// lifecycle events for the sandbox (its audit lines: create, pause, resume,
// timeout changes, kill, expiry), the output of its template's start
// command, a line per entry (stdout at info, stderr at error), and envd's
// own log lines (envdlog.go), in time order. It is kept in memory, bounded
// per sandbox (Config.LogEntries, Config.LogBytes: the oldest entries go
// first), from the create until KilledRetention after the kill, as the
// store keeps killed rows; a sandboxd restart loses it.

// Defaults of Config.LogEntries and Config.LogBytes.
const (
	DefaultLogEntries = 1000
	DefaultLogBytes   = 256 << 10
)

// maxLogLine bounds one entry's message; a longer output line is split.
const maxLogLine = 4 << 10

// LogLevel is an entry's severity; levels order as declared.
type LogLevel int

const (
	LogDebug LogLevel = iota
	LogInfo
	LogWarn
	LogError
)

func (l LogLevel) String() string {
	switch l {
	case LogDebug:
		return "debug"
	case LogWarn:
		return "warn"
	case LogError:
		return "error"
	}
	return "info"
}

// LogEntry is one line of a sandbox's log.
type LogEntry struct {
	At      time.Time
	Level   LogLevel
	Message string
	Fields  map[string]string
}

// size is what an entry counts against Config.LogBytes.
func (e LogEntry) size() int {
	n := len(e.Message) + 32
	for k, v := range e.Fields {
		n += len(k) + len(v)
	}
	return n
}

// LogQuery selects entries of a sandbox's log.
type LogQuery struct {
	// Start and End bound the entries' times, both inclusive; zero: open.
	Start, End time.Time
	// Limit is the most entries returned; 0 or less: no limit.
	Limit int
	// Backward returns the newest entries first (from End back); else the
	// oldest first (from Start on).
	Backward bool
	// MinLevel leaves out entries below it.
	MinLevel LogLevel
	// Search, when not empty, keeps the entries whose message contains it
	// (case-sensitive).
	Search string
}

// sandboxLog is one sandbox's bounded log.
type sandboxLog struct {
	entries *ring[LogEntry]
	envd    *envdCursor // how far envd's records are copied
	bytes   int
	ended   time.Time // when the sandbox was killed; zero while it lives
	dropped int       // entries evicted to stay in bounds
}

// logBook holds the logs of the sandboxes this process created or adopted.
type logBook struct {
	mu                 sync.Mutex
	maxEntries, maxLen int
	logs               map[string]*sandboxLog
	// onDrop, when set, counts entries evicted to stay within bounds.
	onDrop func(n int)
}

func newLogBook(entries, bytes int) *logBook {
	return &logBook{maxEntries: entries, maxLen: bytes, logs: map[string]*sandboxLog{}}
}

// open starts the log of sandbox id, if it has none: only opened logs take
// entries, so that a failed create's audit line or a warm member's output
// leaves nothing behind.
func (b *logBook) open(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.logs[id]; !ok {
		b.logs[id] = &sandboxLog{entries: newRing[LogEntry](b.maxEntries), envd: &envdCursor{}}
	}
}

// drop forgets the log of id (a create that failed).
func (b *logBook) drop(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.logs, id)
}

// end marks id's sandbox killed at; purge drops it after the retention.
func (b *logBook) end(id string, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.logs[id]; l != nil && l.ended.IsZero() {
		l.ended = at
	}
}

// purge drops the logs of sandboxes killed before cutoff.
func (b *logBook) purge(cutoff time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, l := range b.logs {
		if !l.ended.IsZero() && l.ended.Before(cutoff) {
			delete(b.logs, id)
		}
	}
}

// cursor is where the copy of id's envd records stands, nil without a log.
func (b *logBook) cursor(id string) *envdCursor {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.logs[id]; l != nil && l.ended.IsZero() {
		return l.envd
	}
	return nil
}

// add puts e in id's log if it is open, in time order, evicting the oldest
// entries beyond the bounds.
func (b *logBook) add(id string, e LogEntry) {
	b.mu.Lock()
	l := b.logs[id]
	if l == nil {
		b.mu.Unlock()
		return
	}
	evicted := 0
	if old, ok := l.entries.push(e); ok {
		l.bytes -= old.size()
		evicted++
	}
	l.bytes += e.size()
	// envd's entries come after the fact, up to a metrics interval late;
	// the others are the newest and stay where they are.
	for i := l.entries.len() - 1; i > 0 && l.entries.at(i-1).At.After(e.At); i-- {
		l.entries.swap(i-1, i)
	}
	for l.bytes > b.maxLen && l.entries.len() > 1 {
		old, _ := l.entries.popOldest()
		l.bytes -= old.size()
		evicted++
	}
	l.dropped += evicted
	onDrop := b.onDrop
	b.mu.Unlock()
	if evicted > 0 && onDrop != nil {
		onDrop(evicted)
	}
}

// query returns id's entries that q selects; ok is false when id has no
// log here.
func (b *logBook) query(id string, q LogQuery) (out []LogEntry, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.logs[id]
	if l == nil {
		return nil, false
	}
	return selectEntries(l.entries, q), true
}

func selectEntries(r *ring[LogEntry], q LogQuery) []LogEntry {
	out := []LogEntry{}
	n := r.len()
	for k := range n {
		i := k
		if q.Backward {
			i = n - 1 - k
		}
		e := r.at(i)
		if !q.Start.IsZero() && e.At.Before(q.Start) {
			if q.Backward {
				break // older ones only from here
			}
			continue
		}
		if !q.End.IsZero() && e.At.After(q.End) {
			if !q.Backward {
				break // newer ones only from here
			}
			continue
		}
		if e.Level < q.MinLevel || (q.Search != "" && !strings.Contains(e.Message, q.Search)) {
			continue
		}
		out = append(out, e)
		if q.Limit > 0 && len(out) == q.Limit {
			break
		}
	}
	return out
}

// Logs returns the entries of sandbox id's log that q selects. Unlike the
// other routes, a killed sandbox of the tenant in ctx still answers, while
// the store keeps its row; a sandbox this process holds no log of (one
// adopted after a restart has its later entries only) answers an empty
// list. Another tenant's sandbox is ErrNotFound, like a missing one.
func (m *Manager) Logs(ctx context.Context, id string, q LogQuery) ([]LogEntry, error) {
	t, _ := tenant.FromContext(ctx)
	sb, err := m.store.GetSandbox(ctx, t, id)
	if err != nil {
		return nil, notFound(id, err)
	}
	if sb.State == store.StateRunning {
		m.pullEnvdLogs(ctx, id, sb.EnvdAccessToken) // envd's lines up to now
	}
	out, ok := m.logs.query(id, q)
	if !ok {
		return []LogEntry{}, nil
	}
	return out, nil
}

// logEvent records an audit line in the sandbox's log: the action, its
// result and the line's attributes as fields. The tenant reads it, so a
// failure's cause shows only when it is meant for users (errdefs.Public):
// others carry host details (paths, cgroups), which stay in sandboxd's log.
func (m *Manager) logEvent(id, action string, err error, attrs []any) {
	e := LogEntry{At: m.now().UTC(), Level: LogInfo, Fields: map[string]string{"source": "sandboxd", "action": action}}
	for i := 0; i+1 < len(attrs); i += 2 {
		k, ok := attrs[i].(string)
		if !ok || k == "cause" || k == "err" {
			continue
		}
		e.Fields[k] = fmt.Sprint(attrs[i+1])
	}
	e.Message = "sandbox " + actionText(action)
	if err != nil {
		e.Level = LogError
		e.Message = "sandbox " + action + " failed"
		if msg, ok := errdefs.Public(err); ok {
			e.Message += ": " + msg
		}
		e.Fields["result"] = "error"
	} else {
		e.Fields["result"] = "ok"
	}
	m.logs.add(id, e)
}

// actionText is an audit action as a log message says it.
func actionText(action string) string {
	switch action {
	case "create":
		return "created"
	case "kill":
		return "killed"
	case "pause":
		return "paused"
	case "resume", "auto_resume":
		return strings.ReplaceAll(action, "_", " ") + "d"
	case "timeout_kill":
		return "timed out and was killed"
	case "timeout_pause":
		return "timed out and was paused"
	case "idle_kill":
		return "idle and was killed"
	case "set_timeout":
		return "timeout set"
	case "refresh":
		return "refreshed"
	case "update_network":
		return "network updated"
	case "fork":
		return "created as a fork"
	case "snapshot":
		return "snapshotted"
	case "reconcile_thawed":
		return "thawed after a restart"
	}
	return strings.ReplaceAll(action, "_", " ")
}
