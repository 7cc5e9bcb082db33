package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// envd's own log lines: envd keeps its recent records in memory and serves
// them (envdapi.LogsPath); the Manager copies the new ones into the
// sandbox's log in the metrics passes (a quiet envd's in fewer of them:
// envdLogsMaxGap), when a logs request comes for a running sandbox, and
// right before a pause or a kill. They keep envd's
// time, level and fields, with source "envd".

// envdLogsTimeout bounds one read of envd's records: a frozen or dead envd
// must not hold up the pause, kill or request it comes before.
const envdLogsTimeout = time.Second

// envdLogsMaxGap is the most metrics passes between two of the pass's reads
// of an envd whose reads keep finding nothing new (one a minute at the
// default interval). Each read is a connection, a request and a wake-up of
// envd: for every one of thousands of idle sandboxes each pass, that was
// much of what sandboxd did while they idled (the benchmarks notebook,
// N16). A logs request, a pause and a kill read at once, whatever the
// gap; a quiet envd that starts logging is read every pass again after at
// most one gap, and envd keeps 1,000 records (and says how many it lost).
const envdLogsMaxGap = 12

// envdCursor is where the copy of a sandbox's envd records stands.
type envdCursor struct {
	// mu is held for a whole read: two reads at once would both take the
	// records after the same seq.
	mu  sync.Mutex
	pos envdPos
	// gap is how many passes the metrics pass takes from one of its reads
	// to the next: 1, doubled by each read that finds nothing new, up to
	// envdLogsMaxGap (under mu). wait counts down the passes to the next
	// read; it is atomic so that the pass never waits for a read of a
	// logs request in flight.
	gap  int
	wait atomic.Int32
}

// due says whether the metrics pass reads envd's records this time, and
// counts the pass.
func (c *envdCursor) due() bool { return c.wait.Add(-1) < 0 }

// read sets the gap after a read, which found new records or not; the
// caller holds mu.
func (c *envdCursor) read(news bool) {
	if news || c.gap == 0 {
		c.gap = 1
	} else {
		c.gap = min(2*c.gap, envdLogsMaxGap)
	}
	c.wait.Store(int32(c.gap - 1))
}

// envdPos is the run of envd (its boot id) and the seq and time of the
// newest record taken from it.
type envdPos struct {
	boot string
	seq  uint64
	last time.Time
}

// pullEnvdLogs copies the records of sandbox id's envd (reached with
// token) that its log does not have yet. It reads nothing for a sandbox
// without a log; a failure is left for the next read.
func (m *Manager) pullEnvdLogs(ctx context.Context, id, token string) {
	c := m.logs.cursor(id)
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, envdLogsTimeout)
	defer cancel()
	dial := func(ctx context.Context) (net.Conn, error) { return m.backend.Dial(ctx, id, runtime.EnvdPort) }
	resp, err := envdconn.Logs(ctx, dial, token, c.pos.boot, c.pos.seq)
	c.read(err == nil && (resp.Boot != c.pos.boot || resp.Last != c.pos.seq))
	if err != nil {
		if !errors.Is(err, runtime.ErrNotFound) && !errors.Is(err, runtime.ErrNotRunning) && ctx.Err() == nil {
			m.log.Debug("read envd's log", "sandbox_id", id, "err", err)
		}
		return
	}
	recs, lost := newRecords(c.pos, resp)
	for _, r := range recs {
		m.logs.add(id, envdEntry(r))
	}
	if lost > 0 {
		// Before the records that came after the gap.
		at := m.now().UTC()
		if len(recs) > 0 {
			at = recs[0].Time
		}
		m.logs.add(id, LogEntry{At: at, Level: LogWarn,
			Message: fmt.Sprintf("%d envd log lines were lost: more came between two reads than envd keeps", lost),
			Fields:  map[string]string{"source": "sandboxd", "action": "envd_log_lost", "lost": fmt.Sprint(lost)}})
	}
	c.pos.boot, c.pos.seq = resp.Boot, resp.Last
	if len(recs) > 0 {
		c.pos.last = recs[len(recs)-1].Time
	}
}

// newRecords picks the records of resp not taken up to pos, and counts
// those envd evicted before they could be. A new run of envd (another
// boot) has none taken. One that went back (its newest seq below pos's, as a
// restored copy of an earlier state does) answered everything it holds:
// the records after the newest taken are new.
func newRecords(pos envdPos, resp envdapi.LogsResponse) (recs []envdapi.LogRecord, lost uint64) {
	recs = resp.Records
	if resp.Boot == pos.boot && pos.seq > resp.Last {
		return slices.DeleteFunc(recs, func(r envdapi.LogRecord) bool { return !r.Time.After(pos.last) }), 0
	}
	base := pos.seq
	if resp.Boot != pos.boot {
		base = 0
	}
	if len(recs) > 0 && recs[0].Seq > base+1 {
		lost = recs[0].Seq - base - 1
	}
	return recs, lost
}

// envdEntry is an envd record as an entry of the sandbox's log.
func envdEntry(r envdapi.LogRecord) LogEntry {
	fields := make(map[string]string, len(r.Fields)+1)
	for k, v := range r.Fields {
		fields[k] = v
	}
	fields["source"] = "envd"
	level := LogInfo
	switch r.Level {
	case "debug":
		level = LogDebug
	case "warn":
		level = LogWarn
	case "error":
		level = LogError
	}
	return LogEntry{At: r.Time.UTC(), Level: level, Message: r.Msg, Fields: fields}
}
