package sandbox

import (
	"context"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

func TestNewRecords(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	rec := func(seq uint64, sec int) envdapi.LogRecord {
		return envdapi.LogRecord{Seq: seq, Time: t0.Add(time.Duration(sec) * time.Second)}
	}
	tests := []struct {
		name     string
		pos      envdPos
		resp     envdapi.LogsResponse
		wantSeqs []uint64
		wantLost uint64
	}{
		{"first read", envdPos{}, envdapi.LogsResponse{Boot: "a", Last: 2, Records: []envdapi.LogRecord{rec(1, 1), rec(2, 2)}}, []uint64{1, 2}, 0},
		{"next ones", envdPos{boot: "a", seq: 2, last: t0.Add(2 * time.Second)},
			envdapi.LogsResponse{Boot: "a", Last: 4, Records: []envdapi.LogRecord{rec(3, 3), rec(4, 4)}}, []uint64{3, 4}, 0},
		{"nothing new", envdPos{boot: "a", seq: 4}, envdapi.LogsResponse{Boot: "a", Last: 4, Records: []envdapi.LogRecord{}}, []uint64{}, 0},
		{"a gap: evicted before the read", envdPos{boot: "a", seq: 2},
			envdapi.LogsResponse{Boot: "a", Last: 9, Records: []envdapi.LogRecord{rec(6, 6), rec(9, 9)}}, []uint64{6, 9}, 3},
		// A new run of envd: all its records are new, seq 1 on.
		{"restarted envd", envdPos{boot: "a", seq: 40, last: t0.Add(40 * time.Second)},
			envdapi.LogsResponse{Boot: "b", Last: 2, Records: []envdapi.LogRecord{rec(1, 50), rec(2, 51)}}, []uint64{1, 2}, 0},
		{"restarted envd, its first evicted", envdPos{boot: "a", seq: 40},
			envdapi.LogsResponse{Boot: "b", Last: 7, Records: []envdapi.LogRecord{rec(5, 50), rec(7, 51)}}, []uint64{5, 7}, 4},
		// The same run gone back (a restored copy of an earlier state):
		// what is newer than the newest taken is new, the rest was taken.
		{"seq went back", envdPos{boot: "a", seq: 10, last: t0.Add(10 * time.Second)},
			envdapi.LogsResponse{Boot: "a", Last: 8, Records: []envdapi.LogRecord{rec(6, 6), rec(7, 11), rec(8, 12)}}, []uint64{7, 8}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, lost := newRecords(tt.pos, tt.resp)
			var seqs []uint64
			for _, r := range recs {
				seqs = append(seqs, r.Seq)
			}
			if !slices.Equal(seqs, tt.wantSeqs) || lost != tt.wantLost {
				t.Errorf("newRecords = %v, lost %d; want %v, lost %d", seqs, lost, tt.wantSeqs, tt.wantLost)
			}
		})
	}
}

// TestLogBookTimeOrder: envd's entries, which come late, go in at their
// time, so that the routes' time cursors page through them.
func TestLogBookTimeOrder(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	b := newLogBook(4, 1<<20)
	b.open("x")
	for _, e := range []struct {
		msg string
		sec int
	}{{"a", 1}, {"c", 3}, {"e", 5}, {"b", 2}, {"d", 4}} {
		b.add("x", LogEntry{At: t0.Add(time.Duration(e.sec) * time.Second), Message: e.msg})
	}
	got, _ := b.query("x", LogQuery{})
	var msgs []string
	for _, e := range got {
		msgs = append(msgs, e.Message)
	}
	// Bounded at 4: the oldest in time went when "d" came.
	if want := []string{"b", "c", "d", "e"}; !slices.Equal(msgs, want) {
		t.Errorf("log %q; want %q", msgs, want)
	}
}

func TestEnvdEntry(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	e := envdEntry(envdapi.LogRecord{Seq: 3, Time: at, Level: "warn", Msg: "process ended", Fields: map[string]string{"pid": "7", "source": "spoofed"}})
	if e.Level != LogWarn || e.Message != "process ended" || !e.At.Equal(at) || e.At.Location() != time.UTC ||
		e.Fields["pid"] != "7" || e.Fields["source"] != "envd" {
		t.Errorf("envdEntry = %+v; want warn, envd's message, time and fields, source envd", e)
	}
}

// hungEnvdBackend's envds hang once hang is set: a dial waits for its
// context to end. It records the most dials that waited at once.
type hungEnvdBackend struct {
	*sandboxtestBackend
	hang           atomic.Bool
	inFlight, most atomic.Int32
}

func (b *hungEnvdBackend) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	if !b.hang.Load() {
		return b.sandboxtestBackend.Dial(ctx, id, port)
	}
	n := b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	for m := b.most.Load(); n > m && !b.most.CompareAndSwap(m, n); m = b.most.Load() {
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestSampleAllReadsEnvdLogsInParallel: the metrics pass does not wait for
// hung envds one after another (each read waits out envdLogsTimeout).
func TestSampleAllReadsEnvdLogsInParallel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hb *hungEnvdBackend
		e := newTestEnv(t, func(c *Config) {
			hb = &hungEnvdBackend{sandboxtestBackend: c.Backend.(*sandboxtestBackend)}
			c.Backend = hb
		})
		const n = 2 * envdLogReaders
		for range n {
			if _, err := e.m.Create(as("a"), CreateRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		hb.hang.Store(true)
		start := time.Now()
		e.m.SampleAll(context.Background())
		if got := hb.most.Load(); got != envdLogReaders {
			t.Errorf("%d envd log reads waited at once, want %d", got, envdLogReaders)
		}
		// Fake time: the pass took two rounds of timeouts, not n.
		if took := time.Since(start); took != 2*envdLogsTimeout {
			t.Errorf("the pass took %v of fake time, want %v", took, 2*envdLogsTimeout)
		}
	})
}

// TestEnvdCursorGap: the metrics pass reads a quiet envd after 1, 2, 4, 8
// passes, then every envdLogsMaxGap-th; a read that finds new records
// brings it back to every pass.
func TestEnvdCursorGap(t *testing.T) {
	var c envdCursor
	var reads []int
	for pass := 1; pass <= 40; pass++ {
		if c.due() {
			reads = append(reads, pass)
			c.read(false)
		}
	}
	if want := []int{1, 2, 4, 8, 16, 28, 40}; !slices.Equal(reads, want) {
		t.Errorf("a quiet envd read in passes %v, want %v", reads, want)
	}
	c.read(true) // a logs request found records
	var due []bool
	for pass := range 4 {
		d := c.due()
		due = append(due, d)
		if d {
			c.read(pass == 0)
		}
	}
	// Read: new records, then a quiet read (gap 1 still), then a gap of 2.
	if want := []bool{true, true, false, true}; !slices.Equal(due, want) {
		t.Errorf("after new records, due in the next passes: %v, want %v", due, want)
	}
}

// TestSampleAllReadsQuietEnvdLess: forty passes over idle sandboxes reach
// each envd seven times, not forty.
func TestSampleAllReadsQuietEnvdLess(t *testing.T) {
	cb := &runtimetest.EnvdDialCounter{}
	e := newTestEnv(t, func(c *Config) {
		cb.Backend = c.Backend
		c.Backend = cb
	})
	const n = 3
	for range n {
		if _, err := e.m.Create(as("a"), CreateRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	cb.Dials.Store(0)
	for range 40 {
		e.m.SampleAll(t.Context())
	}
	if got := cb.Dials.Load(); got != 7*n {
		t.Errorf("40 passes over %d idle sandboxes dialled envd %d times, want %d", n, got, 7*n)
	}
}
