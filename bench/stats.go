package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Row is one line of the report. A distribution row has P50..Max; a
// single-valued row (memory, throughput, counts) has Value; a scenario that
// cannot run on this build or machine has Unavailable and nothing else.
type Row struct {
	Scenario    string    `json:"scenario"`
	Measure     string    `json:"measure"`
	Unit        string    `json:"unit,omitempty"`
	N           int       `json:"n"`
	Errors      int       `json:"errors,omitempty"`
	P50         *float64  `json:"p50,omitempty"`
	P90         *float64  `json:"p90,omitempty"`
	P99         *float64  `json:"p99,omitempty"`
	Max         *float64  `json:"max,omitempty"`
	Value       *float64  `json:"value,omitempty"`
	Compare     string    `json:"compare,omitempty"` // ratios and differences against another row of the same run
	Goal        string    `json:"goal,omitempty"`    // the goal from the issues this row is read against
	Note        string    `json:"note,omitempty"`
	Unavailable string    `json:"unavailable,omitempty"` // why it was not measured
	Samples     []float64 `json:"samples,omitempty"`     // raw values in Unit, in the order measured
}

// pct is the nearest-rank percentile of sorted values: the smallest value
// with at least p% of the samples at or below it. With fewer than 100
// samples p99 is the maximum.
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func ptr(v float64) *float64 { return &v }

// dist builds a distribution row from samples in unit.
func dist(scenario, measure, unit string, samples []float64, errors int) Row {
	r := Row{Scenario: scenario, Measure: measure, Unit: unit, N: len(samples), Errors: errors, Samples: samples}
	if len(samples) == 0 {
		return r
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	r.P50, r.P90, r.P99, r.Max = ptr(pct(s, 50)), ptr(pct(s, 90)), ptr(pct(s, 99)), ptr(s[len(s)-1])
	return r
}

// durDist is dist for durations, in milliseconds.
func durDist(scenario, measure string, d []time.Duration, errors int) Row {
	return dist(scenario, measure, "ms", msOf(d), errors)
}

func msOf(d []time.Duration) []float64 {
	out := make([]float64, len(d))
	for i, v := range d {
		out[i] = float64(v) / float64(time.Millisecond)
	}
	return out
}

func value(scenario, measure, unit string, v float64, n int) Row {
	return Row{Scenario: scenario, Measure: measure, Unit: unit, N: n, Value: ptr(v)}
}

func unavailable(scenario, measure, why string) Row {
	return Row{Scenario: scenario, Measure: measure, Unavailable: why}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return pct(s, 50)
}

// pairedDiff returns a[i]-b[i] for the pairs measured back to back.
func pairedDiff(a, b []float64) []float64 {
	n := min(len(a), len(b))
	out := make([]float64, n)
	for i := range n {
		out[i] = a[i] - b[i]
	}
	return out
}

// fmtNum prints a value with about three significant digits.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "–"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

func fmtPtr(p *float64) string {
	if p == nil {
		return "–"
	}
	return fmtNum(*p)
}

// cell escapes text for a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
