// Package faultinject holds the pause points of the crash tests: places in
// an operation where a test wants sandboxd killed, which no natural window
// (a slow mkfs, a long copy) reaches reliably. Pause is a no-op in every
// build but one with the build tag faultinject, which only the tests
// compile (cmd/sandboxd's volume crash e2e builds its own sandboxd so), so
// that a release binary carries no hook at all.
//
// In a faultinject build, SANDBOXD_FAULT_PAUSE=<point>:<file> makes
// Pause(point, …) write its detail to file (created
// whole, by rename) and then block forever: the test sees the file, kills
// sandboxd, and checks what the restart makes of the half-done operation.
package faultinject
