package e2b

import (
	"testing"
	"time"
)

func TestCPUPercent(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tests := []struct {
		prev, cur cpuSample
		cpus      int
		want      float64
	}{
		{cpuSample{t0, 0}, cpuSample{t0.Add(time.Second), 500 * time.Millisecond}, 1, 50},
		{cpuSample{t0, 0}, cpuSample{t0.Add(time.Second), 500 * time.Millisecond}, 2, 25},
		{cpuSample{t0, 0}, cpuSample{t0.Add(time.Second), 3 * time.Second}, 2, 100},
		{cpuSample{t0, time.Second}, cpuSample{t0.Add(time.Second), 0}, 1, 0},
		{cpuSample{t0, 0}, cpuSample{t0, time.Second}, 1, 0},
	}
	for _, tt := range tests {
		if got := cpuPercent(tt.prev, tt.cur, tt.cpus); got != tt.want {
			t.Errorf("cpuPercent(%v, %v, %d) = %v; want %v", tt.prev, tt.cur, tt.cpus, got, tt.want)
		}
	}
}
