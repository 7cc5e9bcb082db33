package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ciIter is one line of codeinterp_bench.py.
type ciIter struct {
	Kind     string    `json:"kind"`
	Warmup   bool      `json:"warmup"`
	CreateMs float64   `json:"create_ms"`
	FirstMs  float64   `json:"first_ms"`
	SDKMs    []float64 `json:"sdk_ms"`
	RawMs    []float64 `json:"raw_ms"`
	InsideMs []float64 `json:"inside_ms"`
	EnvsMs   []float64 `json:"envs_ms"`
	JupyMs   []float64 `json:"jupyter_ms"`
	ZMQMs    []float64 `json:"zmq_ms"`
	MemUsed  float64   `json:"mem_used"`
	IdleS    float64   `json:"idle_s"`
	Error    string    `json:"error"`
}

// codeInterpScenario measures E2B's code-interpreter SDK (Python) against
// sandboxd's own code-interpreter-v1 on the local backend: create → first
// run_code("1+1") result cold and from a warm pool, run_code round trips
// (with the same request without the SDK, and from inside the sandbox, to
// see where the time goes), and an idle sandbox's memory by getMetrics.
//
// The template is built by sandboxd itself (pip from PyPI, minutes) in a
// data dir kept across runs (-codeinterp-data), with a run dir of its own
// also kept (the local backend's template layers live there), so that only
// the first run pays for the build. Its sandboxd runs on a subnet of its own: the PyPI
// allowance lives in the subnet's nftables table, which another sandboxd on
// the same subnet would rewrite without it.
func codeInterpScenario(ctx context.Context, b *Bench) error {
	const sc = "codeinterp"
	if !b.flags["code-interpreter"] {
		b.add(unavailable(sc, "code interpreter", "this build of sandboxd has no --code-interpreter"))
		return nil
	}
	py := pythonBin(b.cfg.Root)
	if py == "" || exec.Command(py, "-c", "import e2b_code_interpreter").Run() != nil {
		b.add(unavailable(sc, "code interpreter", "compat-tests/python/.venv has no e2b_code_interpreter (scripts/deps.sh installs it)"))
		return nil
	}
	if err := os.MkdirAll(b.cfg.CIData, 0o700); err != nil {
		return err
	}
	extra := append(noLimits(b.flags), "--code-interpreter=build", "--egress-subnet="+b.cfg.CISubnet)
	if cidrs := pypiCIDRs(py); cidrs != "" {
		b.logf("PyPI resolves to %s here: the template build gets --egress-allow-cidr", cidrs)
		extra = append(extra, "--egress-allow-cidr="+cidrs)
	}
	creates := b.iters(1, 10, 10)
	rtts := b.iters(1, 1, 100)
	idle := 20.0
	if b.cfg.Quick {
		creates, rtts, idle = 2, 5, 2
	}

	// Cold creates, round trips and memory: no pool.
	h, err := b.startSideData(ctx, b.cfg.CIData, append(extra, "--pool=false")...)
	if err != nil {
		return err
	}
	build, err := h.codeInterpReady(ctx, 25*time.Minute)
	if err != nil {
		h.Close()
		return err
	}
	b.add(value(sc, "code-interpreter-v1 ready after sandboxd's start", "s", build.Seconds(), 1))
	cold, coldErr := b.runCI(ctx, h, py, "create", "cold", strconv.Itoa(creates))
	rtt, rttErr := b.runCI(ctx, h, py, "rtt", strconv.Itoa(rtts), strconv.FormatFloat(idle, 'f', -1, 64))
	h.Close()

	// Warm: code-interpreter-v1's members are in the host-wide spare pool
	// (one, growing with its claims) once the template is built; min-warm
	// 0 keeps every tenant pool empty. The script waits for a ready member
	// of that template before each create.
	var warm []ciIter
	var warmErr error
	if b.flags["pool"] && b.flags["min-warm"] {
		hw, err := b.startSideData(ctx, b.cfg.CIData, append(extra, "--pool=true", "--min-warm=0")...)
		if err != nil {
			return err
		}
		warm, warmErr = b.runCI(ctx, hw, py, "create", "warm", strconv.Itoa(creates))
		hw.Close()
	} else {
		b.add(unavailable(sc, "warm create", "warm pools are not implemented in this build"))
	}

	b.addCreateRows(sc, "cold (Jupyter and a kernel start in the create)", cold, coldErr)
	if warm != nil || warmErr != nil {
		b.addCreateRows(sc, "from a warm pool", warm, warmErr)
	}
	var sdk, raw, inside, envs, jupy, zmq []float64
	errs := errCount(rtt, rttErr)
	mem := -1.0
	for _, it := range rtt {
		switch it.Kind {
		case "rtt":
			sdk, raw, inside, envs = it.SDKMs, it.RawMs, it.InsideMs, it.EnvsMs
		case "mem":
			mem = it.MemUsed
		case "jupyter":
			jupy, zmq = it.JupyMs, it.ZMQMs
		}
	}
	r := dist(sc, "run_code(\"1+1\") round trip through the SDK and the proxy", "ms", sdk, errs)
	r.Goal = "≤ 10 ms p50"
	rr := dist(sc, "the same request without the SDK (httpx, one kept-alive connection, NDJSON read whole)", "ms", raw, 0)
	ri := dist(sc, "POST /execute from inside the sandbox to the server on :49999 (no proxy, no SDK)", "ms", inside, 0)
	re := dist(sc, "envd's GET /envs from inside the sandbox (the server asks it per execution)", "ms", envs, 0)
	rj := dist(sc, "1+1 straight over Jupyter's kernel websocket from inside the sandbox (no server: execute_request → execute_reply and idle)", "ms", jupy, 0)
	rz := dist(sc, "1+1 on the same kernel straight over ZeroMQ from inside the sandbox (jupyter_client: the kernel's own share)", "ms", zmq, 0)
	if len(sdk) > 0 && len(raw) > 0 && len(inside) > 0 {
		r.Compare = fmt.Sprintf("SDK %+.1f ms p50 over the raw request, which is %+.1f ms over the server inside", median(sdk)-median(raw), median(raw)-median(inside))
	}
	if len(inside) > 0 && len(zmq) > 0 {
		ri.Compare = fmt.Sprintf("%+.1f ms p50 over the kernel alone", median(inside)-median(zmq))
	}
	if len(jupy) > 0 && len(zmq) > 0 {
		rj.Compare = fmt.Sprintf("%+.1f ms p50 over the kernel alone: Jupyter's relay", median(jupy)-median(zmq))
	}
	b.add(r, rr, ri, re, rj, rz)
	if mem >= 0 {
		m := value(sc, fmt.Sprintf("idle code-interpreter sandbox, getMetrics mem_used after %.0f s idle", idle), "MiB", mem/(1<<20), 1)
		m.Note = "after the round trips above: Jupyter, one Python kernel, the server, envd"
		b.add(m)
	}
	return nil
}

func errCount(res []ciIter, err error) int {
	n := 0
	if err != nil {
		n++
	}
	for _, it := range res {
		if it.Kind == "error" {
			n++
		}
	}
	return n
}

func (b *Bench) addCreateRows(sc, label string, res []ciIter, runErr error) {
	var create, first, total []float64
	for _, it := range res {
		if it.Kind == "error" {
			b.logf("%s: %s", label, it.Error)
		}
		if it.Kind != "create" || it.Warmup {
			continue
		}
		create = append(create, it.CreateMs)
		first = append(first, it.FirstMs)
		total = append(total, it.CreateMs+it.FirstMs)
	}
	t := dist(sc, "Sandbox.create() → first run_code(\"1+1\") result, "+label, "ms", total, errCount(res, runErr))
	if strings.HasPrefix(label, "from a warm pool") {
		t.Goal = "≤ 50 ms p50"
	}
	b.add(t,
		dist(sc, "  of which Sandbox.create(), "+label, "ms", create, 0),
		dist(sc, "  of which the first run_code(\"1+1\"), "+label, "ms", first, 0))
}

// runCI runs codeinterp_bench.py with args against h's sandboxd.
func (b *Bench) runCI(ctx context.Context, h *Harness, py string, args ...string) ([]ciIter, error) {
	argv := append([]string{py, filepath.Join(b.cfg.Root, "bench", "codeinterp_bench.py")}, args...)
	raw, _, err := b.runSDKLines(ctx, h, argv, nil)
	var res []ciIter
	for _, l := range raw {
		var it ciIter
		if json.Unmarshal(l, &it) == nil && it.Kind != "" {
			res = append(res, it)
		}
	}
	if err != nil {
		b.logf("codeinterp_bench.py %s: %v", strings.Join(args, " "), err)
	}
	return res, err
}

// startSideData is startSide on a data dir that outlives the run.
func (b *Bench) startSideData(ctx context.Context, data string, extra ...string) (*Harness, error) {
	h, err := newHarness(b.cfg.Root, b.cfg.BinDir)
	if err != nil {
		return nil, err
	}
	h.keepLogs = b.cfg.KeepLogs
	// The local backend keeps template layers in its run dir: a fixed one
	// per data dir, kept too.
	_ = os.Remove(h.runDir)
	sum := sha256.Sum256([]byte(data))
	h.runDir = fmt.Sprintf("/run/sandboxd/bench-codeinterp-%x", sum[:4])
	if err := os.MkdirAll(h.runDir, 0o700); err != nil {
		return nil, err
	}
	h.data, h.keep = data, true
	if err := h.startSandboxd(ctx, []string{"bench"}, extra...); err != nil {
		h.Close()
		return nil, err
	}
	b.logf("sandboxd on %s (data dir %s) with %s", h.addr, data, strings.Join(extra, " "))
	return h, nil
}

// codeInterpReady waits until code-interpreter-v1 is built, returning how
// long that took from now; a failed build is an error with its reason.
func (h *Harness) codeInterpReady(ctx context.Context, within time.Duration) (time.Duration, error) {
	t0 := time.Now()
	last := "not listed yet"
	for time.Since(t0) < within {
		var tpls []struct {
			TemplateID  string   `json:"templateID"`
			BuildID     string   `json:"buildID"`
			BuildStatus string   `json:"buildStatus"`
			Aliases     []string `json:"aliases"`
		}
		if err := h.apiCall(ctx, http.MethodGet, "/templates", nil, &tpls); err != nil {
			return 0, err
		}
		for _, t := range tpls {
			for _, a := range t.Aliases {
				if a != "code-interpreter-v1" {
					continue
				}
				last = t.BuildStatus
				switch t.BuildStatus {
				case "ready":
					return time.Since(t0), nil
				case "error":
					if time.Since(t0) < 30*time.Second {
						// The last run's build, stopped with its sandboxd:
						// this one starts another at once.
						break
					}
					var st struct {
						LogEntries []struct{ Message string } `json:"logEntries"`
					}
					_ = h.apiCall(ctx, http.MethodGet, "/templates/"+t.TemplateID+"/builds/"+t.BuildID+"/status", nil, &st)
					tail := st.LogEntries[max(0, len(st.LogEntries)-3):]
					return 0, fmt.Errorf("code-interpreter-v1 build failed: %v", tail)
				}
			}
		}
		if last == "not listed yet" && time.Since(t0) > time.Minute {
			// sandboxd lists it as soon as its build starts: it never
			// started (no bin/code-interpreter beside sandboxd, say).
			return 0, fmt.Errorf("code-interpreter-v1 not listed a minute after sandboxd's start: see its log (-keep-logs)")
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	return 0, fmt.Errorf("code-interpreter-v1 not built within %s (last: %s)", within, last)
}

// pypiCIDRs is PyPI's addresses as /32s where they are not global (a
// mirror or proxy on a private or special-purpose address, which sandboxes
// may not reach by default), comma-separated; "" if none. The host names
// come from pip, the index the build's pip uses.
func pypiCIDRs(py string) string {
	out, err := exec.Command(py, "-c", `
import ipaddress, socket
from pip._internal.models.index import PyPI
ips = {a[4][0] for h in (PyPI.netloc, PyPI.file_storage_domain) for a in socket.getaddrinfo(h, 443, socket.AF_INET)}
print(",".join(sorted(i + "/32" for i in ips if not ipaddress.ip_address(i).is_global)))`).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
