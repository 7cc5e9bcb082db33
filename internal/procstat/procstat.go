// Package procstat owns the reading of the host's CPU times from
// /proc/stat's first line: the agent's CPU metric without a cgroup of its
// own, the bench's busy share during a burst and the local backend's CPU
// benchmark read them the same way.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Tick is the unit of /proc/stat's times: USER_HZ, 100 a second on Linux
// whatever the kernel's HZ.
const Tick = 10 * time.Millisecond

// CPU is the time all CPUs together have spent in each state since boot,
// in Ticks. Guest time is left out: the kernel counts it in User and Nice
// already.
type CPU struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal uint64
}

// Busy is every state but Idle and IOWait. Steal counts: in a VM it is time
// a CPU had work and the hypervisor ran something else.
func (c CPU) Busy() uint64 { return c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal }

// All is Busy, Idle and IOWait.
func (c CPU) All() uint64 { return c.Busy() + c.Idle + c.IOWait }

// Read reads /proc/stat.
func Read() (CPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPU{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return Parse(line)
}

// Parse parses /proc/stat's first line ("cpu  user nice system idle iowait
// irq softirq steal guest guest_nice"; kernels before 2.6.33 end at steal
// or earlier, and the missing fields read 0).
func Parse(line string) (CPU, error) {
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return CPU{}, fmt.Errorf("/proc/stat: not its cpu line: %q", line)
	}
	var v [8]uint64
	for i := range v {
		if i+1 >= len(f) {
			break
		}
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return CPU{}, fmt.Errorf("/proc/stat: %q: %w", line, err)
		}
		v[i] = n
	}
	return CPU{User: v[0], Nice: v[1], System: v[2], Idle: v[3], IOWait: v[4], IRQ: v[5], SoftIRQ: v[6], Steal: v[7]}, nil
}
