// Package cgstat owns the reading of the kernel's flat-keyed cgroup files
// ("key value" a line: memory.stat, cpu.stat, cgroup.stat): the agent's
// memory and CPU metrics and the bench's host state read them the same way.
package cgstat

import (
	"strconv"
	"strings"
)

// Field is key's value in the flat-keyed text stat; ok is false when the
// key is absent or its value is not a count.
func Field(stat, key string) (v uint64, ok bool) {
	for line := range strings.SplitSeq(stat, "\n") {
		if k, val, found := strings.Cut(line, " "); found && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
