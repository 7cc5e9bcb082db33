package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sdkIter is one line of sdk_bench.py / sdk_bench.mjs.
type sdkIter struct {
	Kind         string    `json:"kind"`
	Warmup       bool      `json:"warmup"`
	CreateMs     float64   `json:"create_ms"`
	FirstRunMs   float64   `json:"first_run_ms"`
	RunsMs       []float64 `json:"runs_ms"`
	DirectRunsMs []float64 `json:"direct_runs_ms"`
	KillMs       float64   `json:"kill_ms"`
	Error        string    `json:"error"`
}

// sdkScenario runs the real SDKs (installed for compat-tests) against the
// bench's sandboxd: Sandbox.create(), the first commands.run('true'), more
// runs on the same sandbox through the proxy and, with the same SDK, straight
// to the standalone envd, and kill().
func sdkScenario(ctx context.Context, b *Bench) error {
	iters := b.iters(1, 5, 10)
	runs := b.iters(1, 5, 10)
	if b.cfg.Quick {
		iters, runs = 2, 3
	}
	return b.runSDKs(ctx, b.h, "sdk", "", iters, runs, "http://"+b.envd.addr)
}

// runSDKs runs each SDK's script against h's sandboxd; scenario and prefix
// label the rows (the warm scenario runs them against a sandboxd with a
// pool).
func (b *Bench) runSDKs(ctx context.Context, h *Harness, scenario, prefix string, iters, runs int, direct string) error {
	for _, sdk := range b.cfg.SDKs {
		label, argv, env, why := b.sdkScript(sdk, "sdk_bench")
		if argv == nil && why == "" {
			return fmt.Errorf("unknown SDK %q (python, js)", sdk)
		}
		if why != "" {
			b.add(unavailable(scenario, label, why))
			continue
		}
		label = prefix + label
		argv = append(argv, strconv.Itoa(iters), strconv.Itoa(runs))
		if direct != "" {
			argv = append(argv, direct)
		}
		res, err := b.runSDK(ctx, h, argv, env)
		if err != nil {
			b.logf("%s: %v", label, err)
		}
		b.addSDKRows(scenario, label, res, err)
	}
	return nil
}

// sdkScript is how to run bench/<script>.py or .mjs with sdk ("python"
// or "js"): the row label, argv and extra env; why says what is missing
// to run it. An unknown sdk gets neither argv nor why.
func (b *Bench) sdkScript(sdk, script string) (label string, argv, env []string, why string) {
	switch sdk {
	case "python", "py":
		py := pythonBin(b.cfg.Root)
		if py == "" {
			return "Python SDK", nil, nil, "compat-tests/python/.venv is missing (scripts/deps.sh installs it)"
		}
		return "Python SDK", []string{py, filepath.Join(b.cfg.Root, "bench", script+".py")}, nil, ""
	case "js", "node":
		entry := filepath.Join(b.cfg.Root, "compat-tests/js/node_modules/e2b/dist/index.mjs")
		node, err := exec.LookPath("node")
		if err != nil || !exists(entry) {
			return "JS SDK", nil, nil, "node or compat-tests/js/node_modules/e2b is missing (scripts/deps.sh installs it)"
		}
		return "JS SDK", []string{node, filepath.Join(b.cfg.Root, "bench", script+".mjs")}, []string{"E2B_JS_SDK=" + entry}, ""
	}
	return sdk, nil, nil, ""
}

func (b *Bench) runSDK(ctx context.Context, h *Harness, argv, env []string) ([]sdkIter, error) {
	lines, _, err := b.runSDKLines(ctx, h, argv, env)
	var res []sdkIter
	for _, l := range lines {
		var it sdkIter
		if json.Unmarshal(l, &it) == nil && it.Kind != "" {
			res = append(res, it)
		}
	}
	return res, err
}

// runSDKLines runs an SDK script against h's sandboxd (within the
// scenario budget) and returns its stdout's lines and the CPU time (user +
// system) it used: the client shares the box's CPUs with sandboxd.
func (b *Bench) runSDKLines(ctx context.Context, h *Harness, argv, env []string) (_ [][]byte, cpu time.Duration, _ error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Budget)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = filepath.Join(b.cfg.Root, "bench")
	cmd.Env = append(os.Environ(),
		"E2B_API_URL=http://"+h.addr+apiPrefix,
		"E2B_SANDBOX_URL=http://"+h.addr,
		"E2B_API_KEY="+h.key,
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost",
		"HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=", "ALL_PROXY=", "all_proxy=",
	)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ps := cmd.ProcessState; ps != nil {
		cpu = ps.UserTime() + ps.SystemTime()
	}
	var res [][]byte
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		res = append(res, bytes.Clone(sc.Bytes()))
	}
	if err != nil {
		tail := strings.TrimSpace(stderr.String())
		if len(tail) > 400 {
			tail = tail[len(tail)-400:]
		}
		return res, cpu, fmt.Errorf("%v: %s", err, tail)
	}
	return res, cpu, nil
}

func (b *Bench) addSDKRows(scenario, label string, res []sdkIter, runErr error) {
	var create, first, total, runs, direct, kill []float64
	errs := 0
	for _, it := range res {
		if it.Kind == "error" {
			errs++
			b.logf("%s: %s", label, it.Error)
			continue
		}
		if it.Warmup {
			continue
		}
		create = append(create, it.CreateMs)
		first = append(first, it.FirstRunMs)
		total = append(total, it.CreateMs+it.FirstRunMs)
		runs = append(runs, it.RunsMs...)
		direct = append(direct, it.DirectRunsMs...)
		kill = append(kill, it.KillMs)
	}
	if runErr != nil {
		errs++
	}
	c := dist(scenario, label+": Sandbox.create()", "ms", create, errs)
	c.Goal = "≤ 60 ms cold"
	t := dist(scenario, label+": Sandbox.create() → first commands.run('true') done", "ms", total, 0)
	f := dist(scenario, label+": first commands.run('true') on a new sandbox", "ms", first, 0)
	r := dist(scenario, label+": commands.run('true') via proxy", "ms", runs, 0)
	r.Goal = "≤ 5 ms, proxy adds ≤ 1 ms p50"
	d := dist(scenario, label+": commands.run('true') straight to a standalone envd (same SDK)", "ms", direct, 0)
	if len(runs) > 0 && len(direct) > 0 {
		r.Compare = fmt.Sprintf("%+.2f ms p50 vs straight to a standalone envd (includes the sandbox vs host bash difference)", median(runs)-median(direct))
	}
	k := dist(scenario, label+": kill()", "ms", kill, 0)
	if len(direct) == 0 {
		b.add(c, f, t, r, k)
		return
	}
	b.add(c, f, t, r, d, k)
}
