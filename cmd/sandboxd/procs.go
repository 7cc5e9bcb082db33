package main

import (
	"os"
	goruntime "runtime"
)

// procsPerCPU is how many Go processors (Ps) sandboxd runs per CPU the
// runtime would give it by default.
//
// Go's default, one P per CPU, assumes the process has the CPUs to itself.
// sandboxd shares them with everything it starts (the sandboxes' inits and
// agents, sandboxd-spawn) and with the kernel's threads that make and tear
// down their namespaces. When the kernel preempts a thread of sandboxd
// running Go code, that thread keeps its P; with every P so held, no
// goroutine of sandboxd runs, not the reply of another tenant's claim nor
// its HTTP request, until the kernel runs one of those threads again. More
// Ps than CPUs leave a woken goroutine an idle P, and which of sandboxd's
// goroutines runs is then the kernel's choice among runnable threads.
// Measured on 2 CPUs while one tenant floods creates (issue 24,
// docs/benchmarks-history.md, N9): another tenant's warm create took
// 2.9-3.6 ms at p50 and 17-29 ms at p99 with 8 Ps, 14-21 and 44-67 ms with
// 2; 16 Ps did no better and slowed the flood.
const procsPerCPU = 4

// procsChosen: the operator set GOMAXPROCS. Read as the package
// initialises, before main's local.Init puts the runtime's default into the
// environment for the local backend's children (which keep it).
var procsChosen = os.Getenv("GOMAXPROCS") != ""

// raiseProcs sets sandboxd's Ps to procsPerCPU per default P unless the
// operator chose them with GOMAXPROCS, and returns the count in force.
func raiseProcs() int {
	n := goruntime.GOMAXPROCS(0)
	if want := procsFor(procsChosen, n); want != n {
		goruntime.GOMAXPROCS(want)
	}
	return goruntime.GOMAXPROCS(0)
}

// procsFor is the Ps sandboxd runs with: def (the runtime's default, or
// the operator's GOMAXPROCS when set) times procsPerCPU unless set.
func procsFor(set bool, def int) int {
	if set {
		return def
	}
	return def * procsPerCPU
}
