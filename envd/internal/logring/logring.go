// Package logring keeps envd's recent log records in memory, for the
// control plane to copy into the sandbox's log (GET /logs, envdapi.LogsPath):
// envd's stderr goes to a host-side file or a container console that the
// sandbox's log does not reach. The ring takes the records at info and
// above whatever level stderr is written at (Tee), bounded by count and
// bytes, each with a sequence number.
package logring

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"maps"
	"sync"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

// Defaults of New's bounds: a pull every few seconds reads far fewer.
const (
	DefaultRecords = 1000
	DefaultBytes   = 256 << 10
)

// maxValue bounds a message or a field value; the rest is cut.
const maxValue = 4 << 10

// Ring is a bounded, sequenced buffer of log records; safe for concurrent
// use.
type Ring struct {
	boot                string
	maxRecords, maxSize int

	mu   sync.Mutex
	recs []envdapi.LogRecord // oldest first
	size int
	seq  uint64 // of the newest record ever added
}

// New returns a Ring of at most maxRecords records and maxBytes bytes (as
// size counts them), with a boot id of its own.
func New(maxRecords, maxBytes int) *Ring {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand's contract)
	return &Ring{boot: hex.EncodeToString(b[:]), maxRecords: max(maxRecords, 1), maxSize: maxBytes}
}

// Boot identifies the ring, and so this run of envd.
func (r *Ring) Boot() string { return r.boot }

// size is what a record counts against the byte bound.
func size(rec envdapi.LogRecord) int {
	n := len(rec.Msg) + len(rec.Level) + 48
	for k, v := range rec.Fields {
		n += len(k) + len(v) + 8
	}
	return n
}

// Add appends rec with the next sequence number, evicting the oldest
// records beyond the bounds (never rec itself).
func (r *Ring) Add(rec envdapi.LogRecord) {
	rec.Msg = cut(rec.Msg)
	for k, v := range rec.Fields {
		rec.Fields[k] = cut(v)
	}
	n := size(rec)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	rec.Seq = r.seq
	r.recs = append(r.recs, rec)
	r.size += n
	drop := 0
	for len(r.recs)-drop > 1 && (len(r.recs)-drop > r.maxRecords || r.size > r.maxSize) {
		r.size -= size(r.recs[drop])
		drop++
	}
	// The evicted front stays in the array until append reallocates,
	// which copies the live records only.
	clear(r.recs[:drop])
	r.recs = r.recs[drop:]
}

// After is the answer of GET /logs: the records after seq if boot is the
// ring's and seq is not beyond its newest, else every record it holds.
func (r *Ring) After(boot string, seq uint64) envdapi.LogsResponse {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := envdapi.LogsResponse{Boot: r.boot, Last: r.seq, Records: []envdapi.LogRecord{}}
	from := 0
	if boot == r.boot && seq <= r.seq {
		// recs hold consecutive seqs: the first after seq is found by
		// arithmetic.
		if len(r.recs) > 0 && seq >= r.recs[0].Seq {
			from = int(seq - r.recs[0].Seq + 1)
		}
	}
	for _, rec := range r.recs[from:] {
		rec.Fields = maps.Clone(rec.Fields)
		out.Records = append(out.Records, rec)
	}
	return out
}

func cut(s string) string {
	if len(s) <= maxValue {
		return s
	}
	return s[:maxValue] + "…"
}

// Tee is h with every record at info and above also added to r.
func Tee(h slog.Handler, r *Ring) slog.Handler {
	return slog.NewMultiHandler(h, &handler{ring: r})
}

// handler adds records to a ring, their attributes flattened to strings.
type handler struct {
	ring   *Ring
	attrs  map[string]string // from WithAttrs, keys prefixed
	prefix string            // groups opened by WithGroup, each with a dot
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *handler) Handle(_ context.Context, rec slog.Record) error {
	fields := make(map[string]string, len(h.attrs)+rec.NumAttrs())
	for k, v := range h.attrs {
		fields[k] = v
	}
	rec.Attrs(func(a slog.Attr) bool {
		flatten(fields, h.prefix, a)
		return true
	})
	if len(fields) == 0 {
		fields = nil
	}
	at := rec.Time
	if at.IsZero() {
		at = time.Now()
	}
	h.ring.Add(envdapi.LogRecord{Time: at.UTC(), Level: levelName(rec.Level), Msg: rec.Message, Fields: fields})
	return nil
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	attrs := maps.Clone(h.attrs)
	if attrs == nil {
		attrs = map[string]string{}
	}
	for _, a := range as {
		flatten(attrs, h.prefix, a)
	}
	return &handler{ring: h.ring, attrs: attrs, prefix: h.prefix}
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &handler{ring: h.ring, attrs: h.attrs, prefix: h.prefix + name + "."}
}

// flatten adds a to m as slog's text handler would print it: a group's
// attributes under its name and a dot, empty attributes left out.
func flatten(m map[string]string, prefix string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	switch a.Value.Kind() {
	case slog.KindGroup:
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range a.Value.Group() {
			flatten(m, p, g)
		}
	case slog.KindTime:
		m[prefix+a.Key] = a.Value.Time().UTC().Format(time.RFC3339Nano)
	default:
		m[prefix+a.Key] = a.Value.String()
	}
}

// levelName is l as envdapi.LogRecord names it; levels between slog's
// go down to the named one below.
func levelName(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "error"
	case l >= slog.LevelWarn:
		return "warn"
	case l >= slog.LevelInfo:
		return "info"
	}
	return "debug"
}
