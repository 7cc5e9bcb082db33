package envd

import (
	"bufio"
	"bytes"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	cgtree "github.com/sandboxd/sandboxd/envd/internal/cgroup"
	"github.com/sandboxd/sandboxd/internal/cgstat"
	"github.com/sandboxd/sandboxd/internal/procstat"
)

// Metrics is the body of GET /metrics, with E2B's field names. Memory and CPU
// come from the sandbox's own cgroup when envd can see it, so a sandbox
// reports its limits, not the host's.
type Metrics struct {
	Timestamp   int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskUsed    uint64  `json:"disk_used"`
	DiskTotal   uint64  `json:"disk_total"`
}

// cpuSampler turns cumulative CPU time into a utilisation between calls.
type cpuSampler struct {
	mu       sync.Mutex
	lastAt   time.Time
	lastUsec uint64
}

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.collectMetrics())
}

func (s *Server) collectMetrics() Metrics {
	cg := ownCgroup()
	m := Metrics{Timestamp: time.Now().Unix(), CPUCount: cg.cpuCount()}
	m.MemTotal, m.MemUsed, m.MemCache = cg.memory()
	m.MemTotalMiB, m.MemUsedMiB = m.MemTotal>>20, m.MemUsed>>20
	m.CPUUsedPct = s.cpu.percent(cg, m.CPUCount)
	var st unix.Statfs_t
	if unix.Statfs(s.diskPath, &st) == nil {
		bs := uint64(st.Bsize)
		m.DiskTotal = st.Blocks * bs
		m.DiskUsed = (st.Blocks - st.Bfree) * bs
	}
	return m
}

// percent reports CPU use since the previous call, or over a short window on
// the first call, as a percentage of the sandbox's CPUs.
func (c *cpuSampler) percent(cg cgroup, cpus int) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	now, usec := time.Now(), cg.cpuUsec()
	if c.lastAt.IsZero() {
		c.lastAt, c.lastUsec = now, usec
		time.Sleep(100 * time.Millisecond)
		now, usec = time.Now(), cg.cpuUsec()
	}
	elapsed := now.Sub(c.lastAt).Microseconds()
	delta := usec - c.lastUsec
	c.lastAt, c.lastUsec = now, usec
	if elapsed <= 0 || usec < delta || cpus <= 0 {
		return 0
	}
	pct := float64(delta) / float64(elapsed) / float64(cpus) * 100
	return math.Round(math.Min(pct, 100)*100) / 100
}

// cgroup is the directory of envd's own cgroup: v2 (unified) or the v1
// memory and cpuacct controllers.
type cgroup struct {
	v2, memV1, cpuV1 string
}

func ownCgroup() cgroup {
	var cg cgroup
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cg
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		ctrls, path := parts[1], parts[2]
		switch {
		case parts[0] == "0" && ctrls == "":
			for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
				if fileExists(filepath.Join(root, path, "cgroup.controllers")) {
					cg.v2 = filepath.Join(root, path)
					if path == "/"+cgtree.EnvdLeaf {
						// envd's own leaf of the sandbox's tree: the
						// sandbox is its parent.
						cg.v2 = root
					}
					break
				}
			}
		case hasController(ctrls, "memory"):
			cg.memV1 = filepath.Join("/sys/fs/cgroup/memory", path)
		case hasController(ctrls, "cpuacct"):
			cg.cpuV1 = filepath.Join("/sys/fs/cgroup", ctrls, path)
		}
	}
	return cg
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// memory returns total (the cgroup limit, capped at physical memory), used
// (excluding page cache) and cache, in bytes.
func (cg cgroup) memory() (total, used, cache uint64) {
	var info unix.Sysinfo_t
	if unix.Sysinfo(&info) == nil {
		total = info.Totalram * uint64(info.Unit)
	}
	var usage uint64
	haveCg := false
	switch {
	case cg.memV1 != "" && fileExists(filepath.Join(cg.memV1, "memory.usage_in_bytes")):
		usage, haveCg = readUint(filepath.Join(cg.memV1, "memory.usage_in_bytes")), true
		if lim := readUint(filepath.Join(cg.memV1, "memory.limit_in_bytes")); lim > 0 && lim < total {
			total = lim
		}
		cache = statField(filepath.Join(cg.memV1, "memory.stat"), "total_cache")
	case cg.v2 != "" && fileExists(filepath.Join(cg.v2, "memory.current")):
		usage, haveCg = readUint(filepath.Join(cg.v2, "memory.current")), true
		if lim := readUint(filepath.Join(cg.v2, "memory.max")); lim > 0 && lim < total {
			total = lim
		}
		cache = statField(filepath.Join(cg.v2, "memory.stat"), "file")
	}
	if !haveCg {
		free := uint64(info.Freeram+info.Bufferram) * uint64(info.Unit)
		return total, total - min(total, free), uint64(info.Bufferram) * uint64(info.Unit)
	}
	return total, usage - min(usage, cache), cache
}

// cpuCount is the cgroup's CPU quota rounded up, else the CPUs envd may run on.
func (cg cgroup) cpuCount() int {
	n := runtime.NumCPU()
	if cg.v2 != "" {
		if f := strings.Fields(readString(filepath.Join(cg.v2, "cpu.max"))); len(f) == 2 && f[0] != "max" {
			q, _ := strconv.ParseFloat(f[0], 64)
			p, _ := strconv.ParseFloat(f[1], 64)
			if q > 0 && p > 0 {
				n = min(n, int(math.Ceil(q/p)))
			}
		}
	}
	if cg.cpuV1 != "" {
		dir := strings.Replace(cg.cpuV1, "cpuacct", "cpu", 1)
		q, _ := strconv.ParseFloat(readString(filepath.Join(dir, "cpu.cfs_quota_us")), 64)
		p, _ := strconv.ParseFloat(readString(filepath.Join(dir, "cpu.cfs_period_us")), 64)
		if q > 0 && p > 0 {
			n = min(n, int(math.Ceil(q/p)))
		}
	}
	return max(n, 1)
}

// cpuUsec is cumulative CPU time of the cgroup (or of the whole machine).
func (cg cgroup) cpuUsec() uint64 {
	if cg.cpuV1 != "" && fileExists(filepath.Join(cg.cpuV1, "cpuacct.usage")) {
		return readUint(filepath.Join(cg.cpuV1, "cpuacct.usage")) / 1000
	}
	if cg.v2 != "" && fileExists(filepath.Join(cg.v2, "cpu.stat")) {
		return statField(filepath.Join(cg.v2, "cpu.stat"), "usage_usec")
	}
	// The whole machine's busy time (a sandbox without a cgroup of its
	// own: envd on a plain host, the SDKs' debug mode).
	c, _ := procstat.Read()
	return c.Busy() * uint64(procstat.Tick/time.Microsecond)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func readString(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readUint(p string) uint64 {
	n, _ := strconv.ParseUint(readString(p), 10, 64)
	return n
}

// statField is key's value in the flat-keyed cgroup file p, 0 if absent.
func statField(p, key string) uint64 {
	n, _ := cgstat.Field(readString(p), key)
	return n
}
