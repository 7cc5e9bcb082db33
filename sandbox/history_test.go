package sandbox

import (
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

func TestCPUPercent(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tests := []struct {
		prevAt  time.Time
		prevCPU time.Duration
		at      time.Time
		cpu     time.Duration
		cpus    int
		want    float64
	}{
		{t0, 0, t0.Add(time.Second), 500 * time.Millisecond, 1, 50},
		{t0, 0, t0.Add(time.Second), 500 * time.Millisecond, 2, 25},
		{t0, 0, t0.Add(time.Second), 3 * time.Second, 2, 100},
		{t0, time.Second, t0.Add(time.Second), 0, 1, 0},
		{t0, 0, t0, time.Second, 1, 0},
		{t0, 0, t0.Add(3 * time.Second), time.Second, 1, 33.33},
	}
	for _, tt := range tests {
		if got := cpuPercent(tt.prevAt, tt.prevCPU, tt.at, tt.cpu, tt.cpus); got != tt.want {
			t.Errorf("cpuPercent(%v, %v, %v, %v, %d) = %v; want %v", tt.prevAt, tt.prevCPU, tt.at, tt.cpu, tt.cpus, got, tt.want)
		}
	}
}

func TestRing(t *testing.T) {
	tests := []struct {
		name   string
		limit  int
		push   []int
		pops   int
		after  []int // pushed after the pops
		want   []int
		evicts int
	}{
		{name: "empty", limit: 3, want: nil},
		{name: "under", limit: 3, push: []int{1, 2}, want: []int{1, 2}},
		{name: "full", limit: 3, push: []int{1, 2, 3}, want: []int{1, 2, 3}},
		{name: "wraps", limit: 3, push: []int{1, 2, 3, 4, 5}, want: []int{3, 4, 5}, evicts: 2},
		{name: "wraps twice", limit: 2, push: []int{1, 2, 3, 4, 5, 6, 7}, want: []int{6, 7}, evicts: 5},
		{name: "pop after wrap", limit: 3, push: []int{1, 2, 3, 4}, pops: 1, want: []int{3, 4}, evicts: 1},
		{name: "pop then push", limit: 3, push: []int{1, 2, 3, 4}, pops: 2, after: []int{5, 6, 7}, want: []int{5, 6, 7}, evicts: 2},
		{name: "pop empty", limit: 3, pops: 1, want: nil},
		{name: "limit floor", limit: 0, push: []int{1, 2}, want: []int{2}, evicts: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing[int](tt.limit)
			evicts := 0
			for _, v := range tt.push {
				if _, ok := r.push(v); ok {
					evicts++
				}
			}
			for range tt.pops {
				r.popOldest()
			}
			for _, v := range tt.after {
				if _, ok := r.push(v); ok {
					evicts++
				}
			}
			var got []int
			for i := range r.len() {
				got = append(got, r.at(i))
			}
			if !slices.Equal(got, tt.want) || evicts != tt.evicts {
				t.Errorf("ring = %v with %d evictions; want %v with %d", got, evicts, tt.want, tt.evicts)
			}
			if last, ok := r.last(); ok != (len(tt.want) > 0) || (ok && last != tt.want[len(tt.want)-1]) {
				t.Errorf("last() = %v, %v; want the newest of %v", last, ok, tt.want)
			}
		})
	}
}

func TestHistoryBetween(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	h := newHistory(4)
	// Six samples 5 s apart, with one CPU fully used between each: the
	// first two are evicted.
	for i := range 6 {
		h.add("a", t0.Add(time.Duration(i)*5*time.Second), runtime.Stats{CPUCount: 1, CPUTime: time.Duration(i) * 5 * time.Second}, nil)
	}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * 5 * time.Second) }
	tests := []struct {
		name       string
		start, end time.Time
		want       []int // sample indexes
	}{
		{"all", time.Time{}, time.Time{}, []int{2, 3, 4, 5}},
		{"from the start of one", at(3), time.Time{}, []int{3, 4, 5}},
		{"from between", at(3).Add(time.Second), time.Time{}, []int{4, 5}},
		{"up to one, inclusive", time.Time{}, at(3), []int{2, 3}},
		{"window", at(3), at(4), []int{3, 4}},
		{"before all kept", at(0), at(1), []int{}},
		{"after all", at(6), time.Time{}, []int{}},
		{"empty window between", at(3).Add(time.Second), at(3).Add(2 * time.Second), []int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := h.between("a", tt.start, tt.end)
			var idx []int
			for _, s := range got {
				idx = append(idx, int(s.At.Sub(t0)/(5*time.Second)))
				if s.CPUUsedPct != 100 {
					t.Errorf("sample at %v: cpuUsedPct %v; want 100", s.At, s.CPUUsedPct)
				}
			}
			if !slices.Equal(idx, tt.want) && (len(idx) > 0 || len(tt.want) > 0) {
				t.Errorf("between(%v, %v) = samples %v; want %v", tt.start, tt.end, idx, tt.want)
			}
		})
	}
	if got := h.between("missing", time.Time{}, time.Time{}); len(got) != 0 {
		t.Errorf("between of an unknown sandbox = %v; want none", got)
	}
	if s, ok := h.latest("a"); !ok || !s.At.Equal(at(5)) {
		t.Errorf("latest = %v, %v; want the sample at %v", s.At, ok, at(5))
	}
	h.keepOnly(map[string]bool{"b": true})
	if _, ok := h.latest("a"); ok {
		t.Error("keepOnly kept a sandbox not live")
	}
}

func TestHistoryFirstSample(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	h := newHistory(10)
	first := sampleOf(runtime.Stats{CPUCount: 2, CPUTime: time.Second}, t0)
	s := h.add("a", t0.Add(100*time.Millisecond), runtime.Stats{CPUCount: 2, CPUTime: time.Second + 100*time.Millisecond}, &first)
	if s.CPUUsedPct != 50 {
		t.Errorf("first sample against a reading: cpuUsedPct %v; want 50", s.CPUUsedPct)
	}
	s = h.add("b", t0, runtime.Stats{CPUCount: 2, CPUTime: time.Second}, nil)
	if s.CPUUsedPct != 0 {
		t.Errorf("first sample without a reading: cpuUsedPct %v; want 0", s.CPUUsedPct)
	}
}

func TestHistoryStaysOrdered(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name string
		at   time.Duration // of the second reading, after the first's t0+1s
		want int           // samples kept
	}{
		{"measured earlier, added later", -time.Second, 1},
		{"at the same moment", 0, 1},
		{"just after", minSampleGap - time.Millisecond, 1},
		{"a gap later", minSampleGap, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(10)
			first := h.add("a", t0.Add(time.Second), runtime.Stats{CPUCount: 1, MemoryBytes: 1}, nil)
			s := h.add("a", t0.Add(time.Second+tt.at), runtime.Stats{CPUCount: 1, MemoryBytes: 2}, nil)
			got := h.between("a", time.Time{}, time.Time{})
			if len(got) != tt.want {
				t.Fatalf("kept %d samples; want %d", len(got), tt.want)
			}
			if tt.want == 1 && s != first {
				t.Errorf("a reading not kept returned %+v; want the newest sample %+v", s, first)
			}
			for i := 1; i < len(got); i++ {
				if got[i].At.Sub(got[i-1].At) < minSampleGap {
					t.Errorf("samples %d and %d are %v apart", i-1, i, got[i].At.Sub(got[i-1].At))
				}
			}
		})
	}
}
