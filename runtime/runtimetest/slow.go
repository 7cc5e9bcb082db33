package runtimetest

import (
	"os"
	"strconv"
	"time"
)

// Within scales d, a bound on how long something may take to happen at all
// (a sandbox recovering after a fork bomb, a command starting beside
// one), by SANDBOXD_TEST_SLOW: the cgroup VMs emulate their CPUs and share
// the host's two cores with the SDK suites, and set it so that a bound
// meant to catch a hang does not fail a test that is merely slow there.
// Speed is measured by benchmarks, never by these bounds.
func Within(d time.Duration) time.Duration {
	if f, err := strconv.ParseFloat(os.Getenv("SANDBOXD_TEST_SLOW"), 64); err == nil && f > 1 {
		return time.Duration(float64(d) * f)
	}
	return d
}
