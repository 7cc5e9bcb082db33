package logring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

func seqs(recs []envdapi.LogRecord) []uint64 {
	out := []uint64{}
	for _, r := range recs {
		out = append(out, r.Seq)
	}
	return out
}

func msgs(recs []envdapi.LogRecord) []string {
	out := []string{}
	for _, r := range recs {
		out = append(out, r.Msg)
	}
	return out
}

func fill(r *Ring, n int, msg string) {
	for i := range n {
		r.Add(envdapi.LogRecord{Level: "info", Msg: fmt.Sprintf("%s%d", msg, i+1)})
	}
}

func TestRingBounds(t *testing.T) {
	long := strings.Repeat("x", 1000)
	tests := []struct {
		name              string
		records, bytes, n int
		msg               string
		want              []uint64
	}{
		{"under both", 10, 1 << 20, 3, "m", []uint64{1, 2, 3}},
		{"by count", 3, 1 << 20, 5, "m", []uint64{3, 4, 5}},
		// Each record counts a little over 1000 bytes: two fit in 2500.
		{"by bytes", 100, 2500, 5, long, []uint64{4, 5}},
		// A record bigger than the bound on its own is kept, alone.
		{"one too big", 100, 10, 3, long, []uint64{3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := New(tt.records, tt.bytes)
			fill(r, tt.n, tt.msg)
			got := r.After(r.Boot(), 0)
			if !slices.Equal(seqs(got.Records), tt.want) || got.Last != uint64(tt.n) || got.Boot != r.Boot() {
				t.Errorf("seqs %v, last %d, boot %q; want %v, last %d, boot %q", seqs(got.Records), got.Last, got.Boot, tt.want, tt.n, r.Boot())
			}
		})
	}
}

func TestRingCutsLongValues(t *testing.T) {
	r := New(10, 1<<20)
	big := strings.Repeat("y", 3*maxValue)
	r.Add(envdapi.LogRecord{Msg: big, Fields: map[string]string{"k": big}})
	rec := r.After("", 0).Records[0]
	if len(rec.Msg) > maxValue+8 || len(rec.Fields["k"]) > maxValue+8 || !strings.HasPrefix(rec.Msg, "yyy") {
		t.Errorf("message of %d bytes, field of %d; want at most about %d", len(rec.Msg), len(rec.Fields["k"]), maxValue)
	}
}

func TestRingAfter(t *testing.T) {
	r := New(4, 1<<20)
	fill(r, 6, "m") // holds 3..6
	other := New(4, 1<<20).Boot()
	tests := []struct {
		name  string
		boot  string
		after uint64
		want  []uint64
	}{
		{"from the start", r.Boot(), 0, []uint64{3, 4, 5, 6}},
		{"after one held", r.Boot(), 4, []uint64{5, 6}},
		{"after the newest", r.Boot(), 6, []uint64{}},
		// Records 1..2 were evicted: the reader finds the gap itself.
		{"after an evicted one", r.Boot(), 1, []uint64{3, 4, 5, 6}},
		// Beyond the newest: the reader's cursor is of an envd that went
		// back (a restored one); it gets everything held.
		{"beyond the newest", r.Boot(), 9, []uint64{3, 4, 5, 6}},
		{"another boot's cursor", other, 5, []uint64{3, 4, 5, 6}},
		{"no boot", "", 5, []uint64{3, 4, 5, 6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := r.After(tt.boot, tt.after)
			if !slices.Equal(seqs(got.Records), tt.want) || got.Last != 6 {
				t.Errorf("After(%q, %d): seqs %v, last %d; want %v, last 6", tt.boot, tt.after, seqs(got.Records), got.Last, tt.want)
			}
		})
	}
	if a, b := New(1, 1).Boot(), New(1, 1).Boot(); a == b || len(a) < 16 {
		t.Errorf("boot ids %q and %q; want distinct random ids", a, b)
	}
}

// TestTee: the ring takes info and above whatever the other handler's
// level, with attributes and groups flattened to strings.
func TestTee(t *testing.T) {
	var stderr strings.Builder
	r := New(100, 1<<20)
	log := slog.New(Tee(slog.NewTextHandler(&stderr, &slog.HandlerOptions{Level: slog.LevelError}), r))
	log.Debug("debug line")
	log.Info("info line", "n", 3, "err", errors.New("boom"))
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	log.With("service", "process").WithGroup("req").Warn("warn line", "path", "/a", slog.Group("u", "name", "root"), "at", at)
	log.Log(context.Background(), slog.LevelWarn+2, "between warn and error")
	log.Error("error line")

	recs := r.After("", 0).Records
	if want := []string{"info line", "warn line", "between warn and error", "error line"}; !slices.Equal(msgs(recs), want) {
		t.Fatalf("ring holds %q; want %q", msgs(recs), want)
	}
	for i, want := range []struct {
		level  string
		fields map[string]string
	}{
		{"info", map[string]string{"n": "3", "err": "boom"}},
		{"warn", map[string]string{"service": "process", "req.path": "/a", "req.u.name": "root", "req.at": "2026-01-02T03:04:05Z"}},
		{"warn", nil},
		{"error", nil},
	} {
		if recs[i].Level != want.level || fmt.Sprint(recs[i].Fields) != fmt.Sprint(want.fields) || recs[i].Time.IsZero() {
			t.Errorf("record %q: level %s, fields %v, time %v; want %s, %v and a time", recs[i].Msg, recs[i].Level, recs[i].Fields, recs[i].Time, want.level, want.fields)
		}
	}
	if out := stderr.String(); strings.Contains(out, "info line") || !strings.Contains(out, "error line") {
		t.Errorf("stderr got %q; want only the error line: its level is the other handler's", out)
	}
}
