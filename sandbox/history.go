package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
	"golang.org/x/sync/errgroup"
)

// Metrics history: RunMetrics samples every running sandbox once per
// interval (one backend Stats call each, from one goroutine) into a ring of
// the last Config.MetricsHistory samples per sandbox. The history is in
// memory: a sandboxd restart loses it, a pause keeps it (a paused sandbox is
// not sampled), a kill drops it.

// DefaultMetricsInterval and DefaultMetricsHistory: a sample every 5 s, as
// E2B's, and the last hour of them.
const (
	DefaultMetricsInterval = 5 * time.Second
	DefaultMetricsHistory  = 720
)

// statsTimeout bounds one sandbox's Stats in a sampling pass, so that one
// slow backend call cannot stall the others' samples for long.
const statsTimeout = 2 * time.Second

// firstSampleWindow is how long a fresh sample of a sandbox with no earlier
// one measures its CPU use over.
const firstSampleWindow = 100 * time.Millisecond

// minSampleGap is how much newer than the newest sample a reading must be to
// be kept. Two samplers (the pass and a request) can read a sandbox at
// nearly the same moment; keeping both would put two samples at one
// millisecond of the wire's timestamps (or, had the later reading been
// added first, out of order).
const minSampleGap = firstSampleWindow

// Sample is a sandbox's resource use at one moment (E2B's SandboxMetric).
type Sample struct {
	At       time.Time
	CPUCount int
	// CPUUsedPct is the CPU used since the previous sample, in percent of
	// all the sandbox's CPUs (0..100).
	CPUUsedPct          float64
	MemUsed, MemTotal   uint64
	DiskUsed, DiskTotal uint64
	// cpuTime is the cumulative CPU time, for the next sample's CPUUsedPct.
	cpuTime time.Duration
}

// history holds the samples of every sandbox sampled since it started.
type history struct {
	mu    sync.Mutex
	limit int
	rings map[string]*ring[Sample]
}

func newHistory(limit int) *history {
	return &history{limit: limit, rings: map[string]*ring[Sample]{}}
}

// add appends a sample of id measured at at from st, its CPU use computed
// against the previous sample, or against first when id has none. A reading
// less than minSampleGap after the newest sample is not kept: add returns
// the newest instead.
func (h *history) add(id string, at time.Time, st runtime.Stats, first *Sample) Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[id]
	if r == nil {
		r = newRing[Sample](h.limit)
		h.rings[id] = r
	}
	prev, ok := r.last()
	if ok && at.Sub(prev.At) < minSampleGap {
		return prev
	}
	s := sampleOf(st, at)
	if !ok && first != nil {
		prev, ok = *first, true
	}
	if ok {
		s.CPUUsedPct = cpuPercent(prev.At, prev.cpuTime, at, st.CPUTime, st.CPUCount)
	}
	r.push(s)
	return s
}

// latest is id's newest sample.
func (h *history) latest(id string) (Sample, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.rings[id]; r != nil {
		return r.last()
	}
	return Sample{}, false
}

// between returns id's samples taken in [start, end], oldest first; a zero
// bound is open.
func (h *history) between(id string, start, end time.Time) []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[id]
	if r == nil {
		return nil
	}
	return samplesBetween(r, start, end)
}

func samplesBetween(r *ring[Sample], start, end time.Time) []Sample {
	n := r.len()
	from := sort.Search(n, func(i int) bool { return start.IsZero() || !r.at(i).At.Before(start) })
	to := n
	if !end.IsZero() {
		to = sort.Search(n, func(i int) bool { return r.at(i).At.After(end) })
	}
	out := make([]Sample, 0, max(to-from, 0))
	for i := from; i < to; i++ {
		out = append(out, r.at(i))
	}
	return out
}

func (h *history) forget(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.rings, id)
}

// keepOnly drops the history of every sandbox not in live: a safety net for
// ends that bypass kill (a reconcile that finds a sandbox gone).
func (h *history) keepOnly(live map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.rings {
		if !live[id] {
			delete(h.rings, id)
		}
	}
}

func sampleOf(st runtime.Stats, at time.Time) Sample {
	return Sample{
		At: at.UTC(), CPUCount: st.CPUCount,
		MemUsed: st.MemoryBytes, MemTotal: st.MemoryLimitBytes,
		DiskUsed: st.DiskBytes, DiskTotal: st.DiskLimitBytes,
		cpuTime: st.CPUTime,
	}
}

// cpuPercent is the CPU used between two readings in percent of cpus,
// rounded to two decimals and capped at 100.
func cpuPercent(prevAt time.Time, prevCPU time.Duration, at time.Time, cpu time.Duration, cpus int) float64 {
	elapsed := at.Sub(prevAt)
	used := cpu - prevCPU
	if elapsed <= 0 || used < 0 || cpus <= 0 {
		return 0
	}
	pct := float64(used) / float64(elapsed) / float64(cpus) * 100
	return math.Round(min(pct, 100)*100) / 100
}

// RunMetrics samples every running sandbox each interval until ctx ends;
// it returns when ctx is done.
func (m *Manager) RunMetrics(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultMetricsInterval
	}
	every(ctx, interval, m.SampleAll)
}

// envdLogReaders bounds how many envds SampleAll reads logs from at once.
// A read waits up to envdLogsTimeout for an envd that hangs; one after
// another, a host of hung sandboxes would stretch the pass by that much
// each.
const envdLogReaders = 8

// SampleAll takes one sample of every running sandbox, one after another (a
// Stats call each, no goroutine per sandbox), then copies the new log lines
// of their envds into their logs, envdLogReaders at a time (a quiet envd
// less often: envdLogsMaxGap). Paused and
// in-between sandboxes are skipped; the history of sandboxes no longer
// live goes.
func (m *Manager) SampleAll(ctx context.Context) {
	start := m.now()
	live, err := m.store.ListLive(ctx)
	if err != nil {
		m.log.Error("metrics: list live", "err", err)
		return
	}
	ids := make(map[string]bool, len(live))
	sampled := 0
	var reads errgroup.Group
	reads.SetLimit(envdLogReaders)
	defer reads.Wait() // on the early return below too
	for _, sb := range live {
		ids[sb.ID] = true
		if sb.State != store.StateRunning {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, statsTimeout)
		st, err := m.backend.Stats(sctx, sb.ID)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Killed or paused since the list: not worth a warning.
			if !errors.Is(err, runtime.ErrNotFound) && !errors.Is(err, runtime.ErrNotRunning) {
				m.log.Warn("metrics: stats", "sandbox_id", sb.ID, "tenant", string(sb.Tenant), "err", err)
			}
			continue
		}
		m.history.add(sb.ID, m.now(), st, nil)
		sampled++
		if c := m.logs.cursor(sb.ID); c == nil || !c.due() {
			continue
		}
		id, token := sb.ID, sb.EnvdAccessToken
		reads.Go(func() error { m.pullEnvdLogs(ctx, id, token); return nil })
	}
	_ = reads.Wait() // the reads return no error
	m.history.keepOnly(ids)
	if m.cfg.OnMetricsPass != nil {
		m.cfg.OnMetricsPass(sampled, m.now().Sub(start))
	}
}

// Metrics returns the samples of sandbox id (of the tenant in ctx) taken in
// [start, end], oldest first; a zero bound is open. When none was taken in
// it and it reaches to now, a running sandbox is measured now, so that a
// new sandbox answers one sample. A start after end is ErrInvalidArgument.
func (m *Manager) Metrics(ctx context.Context, id string, start, end time.Time) ([]Sample, error) {
	if !start.IsZero() && !end.IsZero() && start.After(end) {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "start must not be after end")
	}
	sb, err := m.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	out := m.history.between(id, start, end)
	now := m.now()
	if len(out) > 0 || sb.State != store.StateRunning || (!end.IsZero() && end.Before(now.Truncate(time.Second))) ||
		(!start.IsZero() && start.After(now)) {
		return out, nil
	}
	s, err := m.sampleNow(ctx, id)
	if err != nil {
		return nil, err
	}
	return []Sample{s}, nil
}

// LatestMetrics returns the newest sample of sandbox id (of the tenant in
// ctx), measuring a running one now if it has none yet. ok is false for a
// sandbox with none that cannot be measured now.
func (m *Manager) LatestMetrics(ctx context.Context, id string) (s Sample, ok bool, err error) {
	sb, err := m.Get(ctx, id)
	if err != nil {
		return Sample{}, false, err
	}
	if s, ok := m.history.latest(id); ok {
		return s, true, nil
	}
	if sb.State != store.StateRunning {
		return Sample{}, false, nil
	}
	s, err = m.sampleNow(ctx, id)
	if err != nil {
		return Sample{}, false, err
	}
	return s, true, nil
}

// sampleNow measures id now and keeps the sample. Without an earlier one to
// measure CPU use against, it reads twice, firstSampleWindow apart.
func (m *Manager) sampleNow(ctx context.Context, id string) (Sample, error) {
	var first *Sample
	if _, ok := m.history.latest(id); !ok {
		st, err := m.backend.Stats(ctx, id)
		if err != nil {
			return Sample{}, fmt.Errorf("stats of sandbox %s: %w", id, backendErr(err))
		}
		s := sampleOf(st, m.now())
		first = &s
		select {
		case <-ctx.Done():
			return Sample{}, ctx.Err()
		case <-time.After(firstSampleWindow):
		}
	}
	st, err := m.backend.Stats(ctx, id)
	if err != nil {
		return Sample{}, fmt.Errorf("stats of sandbox %s: %w", id, backendErr(err))
	}
	return m.history.add(id, m.now(), st, first), nil
}
