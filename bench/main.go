// Command bench is sandboxd's reproducible benchmark suite: every row a user-facing
// number with its floor and goal (BENCHMARKS.md).
//
// It starts its own sandboxd (a free loopback port, a throw-away data dir and
// run dir) and its own standalone envd, runs the scenarios, prints a markdown
// table with p50, p90, p99, max and n (and the ratios the issues ask for) and
// writes the same as JSON. Everything it started or created is removed at
// exit, also on Ctrl-C. Comparisons (proxy vs direct, create vs the bwrap
// floor) are measured interleaved in the same run, so that a busy machine
// slows both sides alike.
//
//	go run ./bench                          # the default set
//	go run ./bench -scenario exec,files     # some scenarios
//	go run ./bench -quick                   # smoke run, tiny N
//	go run ./bench -density 500             # push density
//
// It needs root (the local backend), bin/envd and bin/sandboxd (`make
// build`), bubblewrap for the floor, and the SDKs installed under
// compat-tests/ for the sdk scenario (bench/run.sh installs both with
// scripts/deps.sh).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	osuser "os/user"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/agentbin"
)

// Config is what the flags set.
type Config struct {
	Scenarios      []string
	N              int           // base iteration count; each scenario derives its own from it
	Quick          bool          // smoke run: tiny N everywhere
	Density        int           // idle sandboxes in the density scenario
	DensityWorkers int           // concurrent creates while filling
	MemoryN        int           // idle sandboxes in the memory scenario
	Burst          int           // concurrent cold creates in the burst scenario
	BurstRounds    int           // bursts fired, each destroyed before the next; the last is measured
	Procs          int           // concurrent processes in the procs scenario
	Budget         time.Duration // time limit of one scenario's measuring loops
	SDKs           []string
	CIData         string // the codeinterp scenario's data dir, kept across runs (its built template)
	CISubnet       string // the codeinterp scenario's --egress-subnet
	NetSubnet      string // the network scenario's --egress-subnet, if not sandboxd's default
	Out            string
	BinDir         string
	Root           string
	KeepLogs       bool
	Raw            bool // keep raw samples in the JSON
	// The fairness scenario's experiments (docs/benchmarks-history.md, N6):
	// A's flood against a second sandboxd of its own at nice 19, A's
	// clients in a process of their own at nice 19, and flags added to
	// `sandboxd serve` (say, --log-level debug for each create's phases).
	FairSplit, FairClientsProc bool
	FairServeArgs              string
	// FairPools runs only the fairness scenario's last part, with the warm
	// pools at their defaults (B's creates served as a user's are, from
	// the spare pool while it has members), not its cold-create halves.
	FairPools bool
}

// Bench is one run: the harness, the config and the rows measured so far.
type Bench struct {
	cfg   Config
	h     *Harness
	envd  *standaloneEnvd // shared by the scenarios that compare with a direct envd
	flags map[string]bool // what this build's `sandboxd serve` knows
	rows  []Row
	runs  []ScenarioRun
	log   io.Writer
}

// ScenarioRun records how one scenario went.
type ScenarioRun struct {
	Name      string   `json:"name"`
	Seconds   float64  `json:"seconds"`
	LoadStart []string `json:"loadStart"`
	LoadEnd   []string `json:"loadEnd"`
	Error     string   `json:"error,omitempty"`
}

type scenario struct {
	name string
	desc string
	run  func(ctx context.Context, b *Bench) error
}

var scenarios = []scenario{
	{"floor", "bwrap --ro-bind / / true and /bin/true, interleaved", floorScenario},
	{"create", "cold create -> envd healthy through the E2B API, and destroy; bwrap floor interleaved", createScenario},
	{"warm", "warm claim from a pool (POST /v2/sandboxes with a pool)", warmScenario},
	{"exec", "commands.run('true') through the proxy vs the sandbox's envd socket vs a standalone envd over TCP", execScenario},
	{"files", "files write/read 1 KB and 10 MB through the proxy vs the envd socket", filesScenario},
	{"procs", "100 concurrent processes on one envd (standalone, and a sandbox's through the proxy)", procsScenario},
	{"burst", "concurrent cold creates (no pool)", burstScenario},
	{"stdout", "2 MiB of stdout through envd (standalone, and through the proxy)", stdoutScenario},
	{"rss", "standalone envd idle RSS/PSS, fresh and after a workload", rssScenario},
	{"memory", "host memory per idle sandbox (MemAvailable delta, cgroup usage, envd PSS)", memoryScenario},
	{"density", "N idle sandboxes at once, all healthy", densityScenario},
	{"fairness", "tenant B's create latency while tenant A floods", fairnessScenario},
	{"spare", "issue 24 with the default settings: a lone tenant's 100 and 50 concurrent creates, 200 vs a spare pool of 50, create → first command after a burst of 20", spareScenario},
	{"incus", "incus launch --ephemeral vs sandboxd cold create", incusScenario},
	{"cluster", "Incus cluster of 3 (scripts/incus-cluster.sh): cold create vs one member, proxy via relay vs host", clusterScenario},
	{"sdk", "SDK-observed Sandbox.create() -> first commands.run('true') (Python and JS SDKs)", sdkScenario},
	{"network", "warm claims with a 20-rule egress policy vs none, interleaved", networkScenario},
	{"template", "template builds (5 steps, cold and cached) and creates of a template with a 2 s start, warm vs base", templateScenario},
	{"snapshot", "snapshot and fork of a sandbox with 100 MB written, and a create from the snapshot vs a cold create of its template", snapshotScenario},
	{"incus-burst", "issue 24's Incus row: 20 concurrent Python SDK creates, each then running a command, default settings (needs scripts/incus-setup.sh)", incusBurstScenario},
	{"snapshot-incus", "the snapshot scenario on the Incus backend (needs scripts/incus-setup.sh)", snapshotIncusScenario},
	{"codeinterp", "E2B's code-interpreter SDK (Python): create → first run_code cold and warm, run_code round trip and where its time goes, idle memory", codeInterpScenario},
}

func main() {
	if os.Getenv(floodChildEnv) != "" {
		os.Exit(floodChildMain())
	}
	os.Exit(run())
}

func run() int {
	var cfg Config
	var scen, sdks string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&scen, "scenario", "all", "comma-separated scenarios to run, or all (see -list)")
	list := fs.Bool("list", false, "list the scenarios and exit")
	fs.IntVar(&cfg.N, "n", 100, "base iteration count (latency scenarios run about n iterations, slow ones fewer)")
	fs.BoolVar(&cfg.Quick, "quick", false, "smoke run with tiny N: checks that the harness works, its numbers mean nothing")
	fs.IntVar(&cfg.Density, "density", 100, "idle sandboxes to hold at once in the density scenario (push to 500, 1000)")
	fs.IntVar(&cfg.DensityWorkers, "density-workers", 2, "concurrent creates while filling the density scenario")
	fs.IntVar(&cfg.MemoryN, "memory-n", 50, "idle sandboxes in the memory scenario")
	fs.IntVar(&cfg.Burst, "burst", 50, "concurrent cold creates in the burst scenario")
	fs.IntVar(&cfg.BurstRounds, "burst-rounds", 1, "bursts the burst scenario fires, each destroyed before the next, the last one measured: 2 or more measures a host that has created and destroyed before (what a destroy leaves for the next create, such as the local backend's parked memory cgroups)")
	fs.IntVar(&cfg.Procs, "procs", 100, "concurrent processes in the procs scenario")
	fs.DurationVar(&cfg.Budget, "budget", 3*time.Minute, "time limit of one scenario's measuring loop (density gets 4x)")
	fs.StringVar(&sdks, "sdk", "python,js", "SDKs for the sdk scenario")
	fs.StringVar(&cfg.CIData, "codeinterp-data", "/var/cache/sandboxd/bench-codeinterp", "codeinterp scenario: sandboxd's data dir, kept across runs so that code-interpreter-v1 (pip from PyPI, minutes) is built once")
	fs.StringVar(&cfg.CISubnet, "codeinterp-subnet", "10.182.0.0/16", "codeinterp scenario: --egress-subnet of its sandboxd (its PyPI allowance lives in the subnet's nftables table: one no other sandboxd on the host uses)")
	fs.StringVar(&cfg.NetSubnet, "network-subnet", "", "network scenario: --egress-subnet of its sandboxd (empty: sandboxd's default); give each sandboxd on a host its own")
	fs.BoolVar(&cfg.FairSplit, "fairness-split", false, "fairness scenario: tenant A floods a second sandboxd of its own, started at nice 19 with --egress-subnet 10.136.0.0/16 (a flooding tenant's requests and destroys in a process at low priority)")
	fs.BoolVar(&cfg.FairClientsProc, "fairness-clients-process", false, "fairness scenario: tenant A's 8 clients run in a process of their own at nice 19, as if on another machine (by default they are goroutines of the bench, at its priority)")
	fs.BoolVar(&cfg.FairPools, "fairness-pools", false, "fairness scenario: only its part with the warm pools at sandboxd's defaults (the spare pool on: both tenants' creates served as by default; the rows count where B's creates came from), not its cold-create halves")
	fs.StringVar(&cfg.FairServeArgs, "fairness-serve-args", "", "fairness scenario: more flags for its sandboxd (space-separated), e.g. '--log-level debug' with -keep-logs for each create's phases")
	fs.StringVar(&cfg.Out, "out", "bench/out/results.json", "JSON results file")
	fs.StringVar(&cfg.BinDir, "bin", "bin", "directory with envd and sandboxd")
	fs.BoolVar(&cfg.KeepLogs, "keep-logs", false, "keep sandboxd's and envd's logs (their directory is printed)")
	fs.BoolVar(&cfg.Raw, "raw", true, "include raw samples in the JSON")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *list {
		for _, s := range scenarios {
			fmt.Printf("%-9s %s\n", s.name, s.desc)
		}
		return 0
	}
	if cfg.Quick {
		cfg.N = min(cfg.N, 5)
		cfg.Density = min(cfg.Density, 3)
		cfg.MemoryN = min(cfg.MemoryN, 3)
		cfg.Burst = min(cfg.Burst, 3)
		cfg.Procs = min(cfg.Procs, 10)
		cfg.Budget = min(cfg.Budget, 30*time.Second)
	}
	if cfg.N < 1 {
		fmt.Fprintln(os.Stderr, "bench: -n must be at least 1")
		return 2
	}
	for _, s := range strings.Split(sdks, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.SDKs = append(cfg.SDKs, s)
		}
	}
	if scen == "all" || scen == "" {
		for _, s := range scenarios {
			cfg.Scenarios = append(cfg.Scenarios, s.name)
		}
	} else {
		for _, s := range strings.Split(scen, ",") {
			s = strings.TrimSpace(s)
			if !slices.ContainsFunc(scenarios, func(x scenario) bool { return x.name == s }) {
				fmt.Fprintf(os.Stderr, "bench: unknown scenario %q (see -list)\n", s)
				return 2
			}
			cfg.Scenarios = append(cfg.Scenarios, s)
		}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: must run as root (the local backend needs it)")
		return 1
	}
	var err error
	if cfg.Root, err = repoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if !filepath.IsAbs(cfg.BinDir) {
		cfg.BinDir = filepath.Join(cfg.Root, cfg.BinDir)
	}
	if !filepath.IsAbs(cfg.Out) {
		cfg.Out = filepath.Join(cfg.Root, cfg.Out)
	}

	// A closed stdout (`| head`) must not kill the bench before it cleans up.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills the bench at once
		fmt.Fprintln(os.Stderr, "bench: interrupted; cleaning up (Ctrl-C again to abandon)")
	}()

	b := &Bench{cfg: cfg, log: os.Stderr}
	rep := Report{Machine: machineFacts(cfg.Root), Started: time.Now().UTC(), Command: commandLine(), Config: cfg}
	fmt.Fprintf(b.log, "bench: %s, %d CPUs, %.1f GiB, kernel %s, load %s; %s\n",
		rep.Machine.CPUModel, rep.Machine.CPUs, rep.Machine.MemTotalMiB/1024, rep.Machine.Kernel, strings.Join(rep.Machine.Load, " "), rep.Machine.Host)

	// Run private copies of the binaries: bin/ is shared with whoever runs
	// `make build` on this box meanwhile.
	binDir, bins, err := snapshotBins(cfg.BinDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if os.Getenv("BENCH_KEEP_BINS") == "" {
		defer os.RemoveAll(binDir)
	} else {
		// For a profiler that resolves symbols after the bench exits
		// (bench/profile-burst.sh removes the directory then).
		fmt.Fprintf(os.Stderr, "bench: binaries kept in %s\n", binDir)
	}
	rep.Machine.Binaries = bins
	b.cfg.BinDir = binDir

	code := 0
	func() {
		b.h, err = newHarness(cfg.Root, b.cfg.BinDir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			code = 1
			return
		}
		defer b.h.Close()
		b.h.keepLogs = cfg.KeepLogs
		b.flags = serveFlags(b.cfg.BinDir)
		// Cold paths: no rate limits, no warm pools (warm and fairness start
		// sandboxds of their own with them on).
		extra := noLimits(b.flags)
		if b.flags["pool"] {
			extra = append(extra, "--pool=false")
		}
		if err := b.h.startSandboxd(ctx, []string{"bench"}, extra...); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			code = 1
			return
		}
		if b.envd, err = b.h.startEnvd(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			code = 1
			return
		}
		fmt.Fprintf(b.log, "bench: sandboxd on %s (run dir %s, flags %s), standalone envd on %s\n", b.h.addr, b.h.runDir, strings.Join(extra, " "), b.envd.addr)
		if _, err := osuser.Lookup(asUser); err != nil {
			fmt.Fprintf(b.log, "bench: WARNING: this host has no account %q (scripts/deps.sh creates it): the standalone envd's rows and the bash floor will count errors only\n", asUser)
		}
		for _, name := range cfg.Scenarios {
			if ctx.Err() != nil {
				break
			}
			i := slices.IndexFunc(scenarios, func(x scenario) bool { return x.name == name })
			s := scenarios[i]
			fmt.Fprintf(b.log, "bench: == %s: %s\n", s.name, s.desc)
			sr := ScenarioRun{Name: s.name, LoadStart: loadavg()}
			t0 := time.Now()
			err := safeRun(ctx, b, s)
			sr.Seconds, sr.LoadEnd = time.Since(t0).Seconds(), loadavg()
			if err != nil {
				sr.Error = err.Error()
				fmt.Fprintf(os.Stderr, "bench: %s: %v\n", s.name, err)
				code = 1
			}
			b.runs = append(b.runs, sr)
			b.sweep(ctx)
		}
	}()
	if ctx.Err() != nil {
		code = 130
	}
	rep.Finished = time.Now().UTC()
	rep.LoadEnd = loadavg()
	rep.Rows, rep.Scenarios = b.rows, b.runs
	if !cfg.Raw {
		for i := range rep.Rows {
			rep.Rows[i].Samples = nil
		}
	}
	if err := rep.WriteJSON(cfg.Out); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		code = 1
	} else {
		fmt.Fprintf(b.log, "bench: wrote %s\n", cfg.Out)
	}
	fmt.Print(rep.Markdown())
	return code
}

// safeRun runs a scenario, turning a panic into an error so that the
// harness still cleans up and the other scenarios still run.
func safeRun(ctx context.Context, b *Bench, s scenario) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return s.run(ctx, b)
}

// sweep deletes any sandbox a scenario left (after an error), so that the
// next one starts from an empty host.
func (b *Bench) sweep(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	b.h.mu.Lock()
	ids := mapKeys(b.h.live)
	b.h.mu.Unlock()
	if listed, err := b.h.listRunning(ctx); err == nil {
		ids = append(ids, listed...)
		slices.Sort(ids)
		ids = slices.Compact(ids)
	}
	if len(ids) > 0 {
		fmt.Fprintf(b.log, "bench: deleting %d leftover sandbox(es)\n", len(ids))
		b.h.destroyAll(ctx, ids, 4)
	}
}

func (b *Bench) add(r ...Row) { b.rows = append(b.rows, r...) }

func (b *Bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "bench:   "+format+"\n", args...)
}

// iters scales the base count: n*num/den, at least lo (at least 1 in a quick run).
func (b *Bench) iters(num, den, lo int) int {
	v := b.cfg.N * num / den
	if b.cfg.Quick {
		return max(1, min(v, lo))
	}
	return max(v, lo)
}

// loop runs fn up to n times, stopping early when ctx ends or the
// scenario's time budget is spent. It returns how many ran.
func (b *Bench) loop(ctx context.Context, n int, fn func(i int)) int {
	deadline := time.Now().Add(b.cfg.Budget)
	i := 0
	for ; i < n; i++ {
		if ctx.Err() != nil {
			break
		}
		if time.Now().After(deadline) {
			b.logf("time budget of %s spent after %d of %d iterations", b.cfg.Budget, i, n)
			break
		}
		fn(i)
	}
	return i
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if raw, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(raw), "module github.com/sandboxd/sandboxd\n") {
			return d, nil
		}
		if d == filepath.Dir(d) {
			return "", errors.New("run inside the sandboxd repository")
		}
	}
}

func commandLine() string {
	args := append([]string{"bench"}, os.Args[1:]...)
	return strings.Join(args, " ")
}

// Report is the whole result, as JSON and as markdown.
type Report struct {
	Machine   Machine       `json:"machine"`
	Command   string        `json:"command"`
	Config    Config        `json:"config"`
	Started   time.Time     `json:"started"`
	Finished  time.Time     `json:"finished"`
	LoadEnd   []string      `json:"loadavgAtEnd"`
	Scenarios []ScenarioRun `json:"scenarios"`
	Rows      []Row         `json:"rows"`
}

func (r *Report) WriteJSON(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

// Markdown renders the header and three tables: distributions, single
// values, and what was not measured.
func (r *Report) Markdown() string {
	var sb strings.Builder
	m := r.Machine
	dirty := ""
	if m.Dirty {
		dirty = " (+ uncommitted changes)"
	}
	fmt.Fprintf(&sb, "## sandboxd benchmarks\n\n")
	fmt.Fprintf(&sb, "- run: `%s`, %s → %s (%.0f s)\n", r.Command, r.Started.Format(time.RFC3339),
		r.Finished.Format("15:04:05Z"), r.Finished.Sub(r.Started).Seconds())
	fmt.Fprintf(&sb, "- commit: %s%s; binaries: sandboxd %s, agent %s\n", m.Commit, dirty, m.Binaries["sandboxd"], m.Binaries["envd"])
	fmt.Fprintf(&sb, "- machine: %d CPUs (%s), %.1f GiB RAM, kernel %s, %s, cgroup %s, pid_max %d\n",
		m.CPUs, m.CPUModel, m.MemTotalMiB/1024, m.Kernel, m.OS, m.CgroupMode, m.PidMax)
	fmt.Fprintf(&sb, "- tools: %s, %s, SDKs: %s, %s (%s, node %s)\n", m.GoVersion, orDash(m.Bubblewrap), orDash(m.JSSDK), orDash(m.PythonSDK), orDash(m.Python), orDash(m.Node))
	fmt.Fprintf(&sb, "- load average (1/5/15 min): %s at start, %s at end — the box is shared; see the per-scenario loads in the JSON\n",
		strings.Join(m.Load, " "), strings.Join(r.LoadEnd, " "))
	fmt.Fprintf(&sb, "- host at start: %s\n\n", m.Host)

	var dists, values, na []Row
	for _, row := range r.Rows {
		switch {
		case row.Unavailable != "":
			na = append(na, row)
		case row.Value != nil:
			values = append(values, row)
		default:
			dists = append(dists, row)
		}
	}
	if len(dists) > 0 {
		sb.WriteString("| scenario | measure | unit | p50 | p90 | p99 | max | n | err | compared (same run) | goal |\n")
		sb.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|---|---|\n")
		for _, row := range dists {
			fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %s | %d | %s | %s | %s |\n",
				row.Scenario, cell(row.Measure), row.Unit, fmtPtr(row.P50), fmtPtr(row.P90), fmtPtr(row.P99), fmtPtr(row.Max),
				row.N, errCell(row.Errors), cell(row.Compare), cell(row.Goal))
		}
		sb.WriteString("\n")
	}
	if len(values) > 0 {
		sb.WriteString("| scenario | measure | value | unit | n | notes | goal |\n")
		sb.WriteString("|---|---|--:|---|--:|---|---|\n")
		for _, row := range values {
			note := row.Note
			if row.Compare != "" {
				note = strings.TrimSpace(row.Compare + "; " + note)
				note = strings.TrimSuffix(note, ";")
			}
			fmt.Fprintf(&sb, "| %s | %s | %s | %s | %d | %s | %s |\n",
				row.Scenario, cell(row.Measure), fmtPtr(row.Value), row.Unit, row.N, cell(note), cell(row.Goal))
		}
		sb.WriteString("\n")
	}
	if len(na) > 0 {
		sb.WriteString("| scenario | measure | not available |\n|---|---|---|\n")
		for _, row := range na {
			fmt.Fprintf(&sb, "| %s | %s | not available: %s |\n", row.Scenario, cell(row.Measure), cell(row.Unavailable))
		}
		sb.WriteString("\n")
	}
	for _, s := range r.Scenarios {
		if s.Error != "" {
			fmt.Fprintf(&sb, "- scenario %s failed: %s\n", s.Name, cell(s.Error))
		}
	}
	return sb.String()
}

func errCell(n int) string {
	if n == 0 {
		return "0"
	}
	return fmt.Sprintf("**%d**", n)
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// snapshotBins copies sandboxd and its agent to a private directory and
// describes them. The agent is the one sandboxd serve picks in from
// (agentbin). It is copied as envd, so that the standalone envd of the
// exec scenarios and every sandbox run the same agent, and info["envd"]
// says which it was.
func snapshotBins(from string) (string, map[string]string, error) {
	dir, err := os.MkdirTemp("", "sandboxd-bench-bin-")
	if err != nil {
		return "", nil, err
	}
	agent := agentbin.Name(from)
	info := map[string]string{}
	for _, name := range []string{"sandboxd", "envd", "sandboxd-init", "sandboxd-spawn", "runc", "fakeinet", "code-interpreter"} {
		src := filepath.Join(from, name)
		if name == "envd" {
			src = filepath.Join(from, agent)
		}
		raw, err := os.ReadFile(src)
		if name != "sandboxd" && name != "envd" && errors.Is(err, fs.ErrNotExist) {
			// Optional: the libcontainer floor says it is missing; sandboxd
			// starts sandboxes through libcontainer, or itself (and logs
			// so); without the code-interpreter server its template is not
			// built. A build of before sandboxd-spawn is measured so.
			continue
		}
		if err != nil {
			os.RemoveAll(dir)
			return "", nil, fmt.Errorf("%s: %w (run `make build` first)", src, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o755); err != nil {
			os.RemoveAll(dir)
			return "", nil, err
		}
		sum := sha256.Sum256(raw)
		fi, _ := os.Stat(src)
		info[name] = fmt.Sprintf("sha256:%x, built %s", sum[:8], fi.ModTime().UTC().Format(time.RFC3339))
		if name == "envd" {
			info[name] = agent + " " + info[name]
		}
	}
	return dir, info, nil
}
