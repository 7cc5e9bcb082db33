package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/cgstat"
	"github.com/sandboxd/sandboxd/internal/procstat"
)

// Machine is the report's header: what the numbers were measured on.
type Machine struct {
	Hostname    string            `json:"hostname"`
	CPUs        int               `json:"cpus"`
	CPUModel    string            `json:"cpuModel"`
	MemTotalMiB float64           `json:"memTotalMiB"`
	Kernel      string            `json:"kernel"`
	OS          string            `json:"os"`
	CgroupMode  string            `json:"cgroupMode"`
	PidMax      int               `json:"pidMax"`
	GoVersion   string            `json:"goVersion"`
	Bubblewrap  string            `json:"bubblewrap"`
	JSSDK       string            `json:"jsSdk"`
	PythonSDK   string            `json:"pythonSdk"`
	Node        string            `json:"node"`
	Python      string            `json:"python"`
	Commit      string            `json:"commit"`
	Dirty       bool              `json:"dirty"`
	Load        []string          `json:"loadavgAtStart"`
	Host        HostState         `json:"hostAtStart"`
	Binaries    map[string]string `json:"binaries"`
}

func machineFacts(root string) Machine {
	m := Machine{CPUs: goruntime.NumCPU(), GoVersion: goruntime.Version()}
	m.Hostname, _ = os.Hostname()
	m.Kernel = readTrim("/proc/sys/kernel/osrelease")
	m.PidMax, _ = strconv.Atoi(readTrim("/proc/sys/kernel/pid_max"))
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		var name, family, model, mhz string
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			switch k, v = strings.TrimSpace(k), strings.TrimSpace(v); k {
			case "model name":
				name = v
			case "cpu family":
				family = v
			case "model":
				model = v
			case "cpu MHz":
				mhz = v
			}
			if k == "" || (name != "" && family != "" && model != "" && mhz != "") {
				break // the first CPU is enough
			}
		}
		f.Close()
		m.CPUModel = fmt.Sprintf("%s, family %s model %s, %s MHz", name, family, model, strings.TrimSuffix(mhz, ".000"))
	}
	m.MemTotalMiB = float64(meminfo()["MemTotal"]) / (1 << 20)
	if raw, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	switch {
	case exists("/sys/fs/cgroup/cgroup.controllers"):
		m.CgroupMode = "v2"
	case exists("/sys/fs/cgroup/unified"):
		m.CgroupMode = "hybrid (v1 controllers + v2 unified)"
	default:
		m.CgroupMode = "v1"
	}
	m.Bubblewrap = firstLine(exec.Command("bwrap", "--version"))
	m.Node = firstLine(exec.Command("node", "--version"))
	if raw, err := os.ReadFile(filepath.Join(root, "compat-tests/js/node_modules/e2b/package.json")); err == nil {
		var pkg struct{ Version string }
		if json.Unmarshal(raw, &pkg) == nil {
			m.JSSDK = "e2b " + pkg.Version + " (npm)"
		}
	}
	if py := pythonBin(root); py != "" {
		m.Python = firstLine(exec.Command(py, "--version"))
		dists, _ := filepath.Glob(filepath.Join(root, "compat-tests/python/.venv/lib/python*/site-packages/e2b-*.dist-info"))
		if len(dists) > 0 {
			v := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(dists[0]), "e2b-"), ".dist-info")
			m.PythonSDK = "e2b " + v + " (PyPI)"
		}
	}
	m.Commit = firstLine(exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD"))
	if out, err := exec.Command("git", "-C", root, "status", "--porcelain").Output(); err == nil {
		m.Dirty = len(strings.TrimSpace(string(out))) > 0
	}
	m.Load = loadavg()
	m.Host = hostState()
	return m
}

func pythonBin(root string) string {
	p := filepath.Join(root, "compat-tests/python/.venv/bin/python")
	if exists(p) {
		return p
	}
	return ""
}

func readTrim(path string) string {
	raw, _ := os.ReadFile(path)
	return strings.TrimSpace(string(raw))
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func firstLine(cmd *exec.Cmd) string {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return ""
	}
	l, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return l
}

// loadavg returns the 1, 5 and 15 minute load averages.
func loadavg() []string {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) < 3 {
		return nil
	}
	return f[:3]
}

// meminfo returns /proc/meminfo in bytes.
func meminfo() map[string]int64 {
	out := map[string]int64{}
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		out[k] = n
	}
	return out
}

// memAvailable samples MemAvailable a few times, spaced out, and returns
// the median: one sample is at the mercy of whatever else the box is doing.
func memAvailable(samples int, gap time.Duration) float64 {
	var v []float64
	for i := range samples {
		if i > 0 {
			time.Sleep(gap)
		}
		v = append(v, float64(meminfo()["MemAvailable"]))
	}
	return median(v)
}

// procMem is a process's resident memory: RSS counts every page it maps,
// PSS divides shared pages (envd's text, shared by every sandbox) among the
// processes that map them.
type procMem struct {
	RSS, PSS, PSSAnon float64 // bytes
	Threads           int
}

func readProcMem(pid int) (procMem, error) {
	var m procMem
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return m, err
	}
	for _, l := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseFloat(f[0], 64)
		switch k {
		case "Rss":
			m.RSS = n * 1024
		case "Pss":
			m.PSS = n * 1024
		case "Pss_Anon":
			m.PSSAnon = n * 1024
		}
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "Threads:"); ok {
				m.Threads, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
	}
	return m, nil
}

const mib = 1 << 20

// cpuBetween describes the host's CPU from a to b for n requests: how busy
// its CPUs were and the busy CPU time a request. A burst whose CPUs were
// nearly all busy is bound by the CPU time its requests take, whatever
// their order; one with CPUs to spare waits for something else.
// a and b are from procstat.Read; a zero one was not read.
func cpuBetween(a, b procstat.CPU, n int) string {
	all, busy := float64(b.All())-float64(a.All()), float64(b.Busy())-float64(a.Busy())
	if a.All() == 0 || all <= 0 || n <= 0 {
		return "host CPU not read"
	}
	tickMS := float64(procstat.Tick) / float64(time.Millisecond)
	return fmt.Sprintf("host CPUs %.0f %% busy, %.1f CPU-ms a create", 100*busy/all, busy*tickMS/float64(n))
}

// HostState is what a boot has accumulated that a create may pay for.
// On machine G the same build's figures drifted by 10–20 % between hours
// of one boot (N9–N12) with no cause measured: every report now says how
// long the box has been up and what the kernel holds, so that a drift can
// be set against it.
type HostState struct {
	UptimeH float64 `json:"uptimeH"`
	// DyingCgroups are cgroups removed but not yet freed (a memory cgroup
	// stays while pages charged to it are cached): on cgroup v1 the memory
	// hierarchy's count above the live ones (the pids hierarchy's), on v2
	// the root's nr_dying_descendants. -1 when unknown.
	DyingCgroups  int     `json:"dyingCgroups"`
	SlabUnreclMiB float64 `json:"slabUnreclaimableMiB"`
	Mounts        int     `json:"mounts"`
}

func hostState() HostState {
	s := HostState{DyingCgroups: -1}
	if f := strings.Fields(readTrim("/proc/uptime")); len(f) > 0 {
		up, _ := strconv.ParseFloat(f[0], 64)
		s.UptimeH = up / 3600
	}
	if raw, err := os.ReadFile("/sys/fs/cgroup/cgroup.stat"); err == nil {
		if n, ok := cgstat.Field(string(raw), "nr_dying_descendants"); ok {
			s.DyingCgroups = int(n)
		}
	} else if raw, err := os.ReadFile("/proc/cgroups"); err == nil {
		s.DyingCgroups = dyingV1(string(raw))
	}
	s.SlabUnreclMiB = float64(meminfo()["SUnreclaim"]) / (1 << 20)
	if raw, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		s.Mounts = strings.Count(string(raw), "\n")
	}
	return s
}

func (s HostState) String() string {
	dying := "unknown"
	if s.DyingCgroups >= 0 {
		dying = strconv.Itoa(s.DyingCgroups)
	}
	return fmt.Sprintf("up %.1f h, %s dying cgroups, %.0f MiB unreclaimable slab, %d mounts", s.UptimeH, dying, s.SlabUnreclMiB, s.Mounts)
}

// dyingV1 estimates the dying cgroups of a v1 host from /proc/cgroups:
// the memory hierarchy counts its dying cgroups (a removed memory cgroup
// lives on while it holds pages), the pids hierarchy, which sandboxd and
// the usual runtimes join with it, only about the live ones. -1 without
// either.
func dyingV1(procCgroups string) int {
	n := map[string]int{}
	for _, l := range strings.Split(procCgroups, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if c, err := strconv.Atoi(f[2]); err == nil {
			n[f[0]] = c
		}
	}
	mem, ok1 := n["memory"]
	pids, ok2 := n["pids"]
	if !ok1 || !ok2 {
		return -1
	}
	return max(mem-pids, 0)
}
