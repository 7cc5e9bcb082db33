package main

import "testing"

func TestProcsFor(t *testing.T) {
	for _, c := range []struct {
		name string
		set  bool
		def  int
		want int
	}{
		{"2 CPUs", false, 2, 2 * procsPerCPU},
		{"1 CPU (or a cgroup limit of 1)", false, 1, procsPerCPU},
		{"GOMAXPROCS set: the operator's", true, 3, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := procsFor(c.set, c.def); got != c.want {
				t.Errorf("procsFor(%v, %d) = %d, want %d", c.set, c.def, got, c.want)
			}
		})
	}
}
