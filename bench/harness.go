package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

// apiPrefix is where sandboxd serves E2B's REST API.
const apiPrefix = "/v1/sandboxes/e2b"

// envdPort is the port the SDKs name in E2b-Sandbox-Port for envd.
const envdPort = envdapi.Port

// Harness owns everything the run starts: a sandboxd on a free loopback
// port with a throw-away data dir and run dir, a standalone envd, and every
// sandbox created through the API. Close undoes all of it.
type Harness struct {
	root    string // repository root
	binDir  string
	workDir string // throw-away: sandboxd's data dir, logs
	data    string // a data dir kept across runs instead (a built template's cache); "" for workDir's
	keep    bool   // data and runDir (the local backend's template layers) outlive the run
	runDir  string // sandboxd's --run-dir under /run/sandboxd

	sandboxd *exec.Cmd
	sbdDone  chan struct{}
	addr     string            // sandboxd's host:port
	key      string            // API key of the bench tenant
	keys     map[string]string // tenant -> API key, the bench tenant included
	flags    map[string]bool   // the flags this sandboxd's serve knows

	api *http.Client // to sandboxd: API and proxy

	mu   sync.Mutex
	live map[string]bool // sandboxes created and not yet deleted

	envds     []*standaloneEnvd
	keepLogs  bool
	nice      int // sandboxd's nice value at its start (0: the bench's own)
	closeOnce sync.Once
}

func newHarness(root, binDir string) (*Harness, error) {
	h := &Harness{root: root, binDir: binDir, live: map[string]bool{}}
	for _, b := range []string{"sandboxd", "envd"} {
		if !exists(filepath.Join(binDir, b)) {
			return nil, fmt.Errorf("%s missing: run `make build` first", filepath.Join(binDir, b))
		}
	}
	var err error
	if h.workDir, err = os.MkdirTemp("", "sandboxd-bench-"); err != nil {
		return nil, err
	}
	if err := os.MkdirAll("/run/sandboxd", 0o700); err != nil {
		return nil, err
	}
	if h.runDir, err = os.MkdirTemp("/run/sandboxd", "bench-"); err != nil {
		return nil, err
	}
	h.api = newAPIClient()
	return h, nil
}

// nicedCommand is exec.Command(path, args...), started through nice(1) at
// the given nice value unless it is 0.
func nicedCommand(nice int, path string, args ...string) *exec.Cmd {
	if nice == 0 {
		return exec.Command(path, args...)
	}
	return exec.Command("nice", append([]string{"-n", strconv.Itoa(nice), path}, args...)...)
}

// newAPIClient is the bench's client to sandboxd: API and proxy.
func newAPIClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil, // loopback only: never an HTTP(S)_PROXY from the environment
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

func (h *Harness) dataDir() string {
	if h.data != "" {
		return h.data
	}
	return filepath.Join(h.workDir, "data")
}

// serveFlags lists the flags `sandboxd serve` knows, so that the bench
// works with builds that have (or lack) rate limits and warm pools.
func serveFlags(binDir string) map[string]bool {
	out, _ := exec.Command(filepath.Join(binDir, "sandboxd"), "serve", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if f, ok := strings.CutPrefix(l, "  -"); ok {
			name, _, _ := strings.Cut(f, " ")
			flags[name] = true
		}
	}
	return flags
}

// noLimits are the serve flags that turn rate limits off, for a build that
// has them: the bench measures sandboxd, not its limiter (fairness turns
// them back on).
func noLimits(flags map[string]bool) []string {
	var out []string
	for _, f := range []string{"create-rate", "lifecycle-rate", "read-rate", "ip-rate"} {
		if flags[f] {
			out = append(out, "--"+f+"=0")
		}
	}
	return out
}

// startSandboxd creates an API key for each tenant (the first is the one
// h.key belongs to) and starts `sandboxd serve` on 127.0.0.1:0 with extra
// flags, reading the address it chose from its log.
func (h *Harness) startSandboxd(ctx context.Context, tenants []string, extra ...string) error {
	h.keys = map[string]string{}
	for i, t := range tenants {
		out, err := exec.CommandContext(ctx, filepath.Join(h.binDir, "sandboxd"), "keys", "create",
			"--data-dir", h.dataDir(), "--tenant", t).Output()
		if err != nil {
			return fmt.Errorf("sandboxd keys create: %w", err)
		}
		h.keys[t] = strings.TrimSpace(string(out))
		if i == 0 {
			h.key = h.keys[t]
		}
	}

	// sandboxd's start-up Reconcile fails while another sandboxd on this
	// machine (a test, say) has live sandboxes: they share the /sandboxd
	// cgroup parent, whose children without a state dir in this run dir
	// look stray to it. Wait for the other one a while rather than fail.
	var err error
	for attempt := 1; attempt <= 10; attempt++ {
		var retry bool
		retry, err = h.launchSandboxd(ctx, attempt, extra)
		if err == nil || !retry || ctx.Err() != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench: sandboxd start %d failed (%v); retrying in 3s\n", attempt, err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(3 * time.Second):
		}
	}
	return err
}

// launchSandboxd starts sandboxd once; retry says whether it failed at its
// start-up reconcile, which another sandboxd's sandboxes can cause.
func (h *Harness) launchSandboxd(ctx context.Context, attempt int, extra []string) (retry bool, err error) {
	logPath := filepath.Join(h.workDir, fmt.Sprintf("sandboxd.%d.log", attempt))
	logf, err := os.Create(logPath)
	if err != nil {
		return false, err
	}
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", h.dataDir(), "--run-dir", h.runDir}, extra...)
	cmd := nicedCommand(h.nice, filepath.Join(h.binDir, "sandboxd"), args...)
	// No code-interpreter template build (pip) competing with what is
	// measured; an older sandboxd ignores the variable.
	cmd.Env = append(os.Environ(), "SANDBOXD_CODE_INTERPRETER=off")
	// BENCH_SANDBOXD_ENV: variables for sandboxd alone, not the bench's
	// own process (say GOMAXPROCS=2, the runtime's default, to compare).
	cmd.Env = append(cmd.Env, strings.Fields(os.Getenv("BENCH_SANDBOXD_ENV"))...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a Ctrl-C in the terminal reaches only the bench,
	// which then deletes its sandboxes before it stops sandboxd.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return false, fmt.Errorf("start sandboxd: %w", err)
	}
	logf.Close()
	h.sandboxd = cmd
	h.sbdDone = make(chan struct{})
	h.addr = ""
	go func() { _ = cmd.Wait(); close(h.sbdDone) }()

	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if h.addr == "" {
			h.addr = logAddr(logPath, "sandboxd serving")
		}
		if h.addr != "" {
			resp, err := h.api.Get("http://" + h.addr + "/health")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return false, nil
				}
			}
		}
		select {
		case <-h.sbdDone:
			raw, _ := os.ReadFile(logPath)
			last := strings.TrimSpace(string(raw))
			if i := strings.LastIndex(last, "\n"); i >= 0 {
				last = last[i+1:]
			}
			h.sandboxd, h.addr = nil, ""
			return strings.Contains(last, "reconcile"), fmt.Errorf("sandboxd exited at start: %s", last)
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false, fmt.Errorf("sandboxd not healthy after 30s; see %s", logPath)
}

// logAddr finds the "addr" of the first JSON log line with msg in path.
func logAddr(path, msg string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == msg && l.Addr != "" {
			return l.Addr
		}
	}
	return ""
}

// standaloneEnvd is an envd on the host, outside any sandbox, reached over
// TCP on loopback: the direct path the proxy is compared with.
type standaloneEnvd struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

func (e *standaloneEnvd) pid() int { return e.cmd.Process.Pid }

// startEnvd starts bin/envd on a free loopback port (never 49983, which the
// SDK compat tests use) at log level warn, as sandboxes run it.
func (h *Harness) startEnvd(ctx context.Context) (*standaloneEnvd, error) {
	var last error
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr := l.Addr().String()
		l.Close()
		logf, err := os.OpenFile(filepath.Join(h.workDir, "envd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(filepath.Join(h.binDir, "envd"), "--listen", addr, "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return nil, err
		}
		logf.Close()
		e := &standaloneEnvd{cmd: cmd, addr: addr, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); close(e.done) }()
		h.mu.Lock()
		h.envds = append(h.envds, e)
		h.mu.Unlock()
		if last = waitHTTP(ctx, h.api, "http://"+addr+"/health", e.done, 10*time.Second); last == nil {
			return e, nil
		}
		h.stopEnvd(e)
	}
	return nil, fmt.Errorf("standalone envd: %w", last)
}

func (h *Harness) stopEnvd(e *standaloneEnvd) {
	stopProcess(e.cmd, e.done, 5*time.Second)
	h.mu.Lock()
	h.envds = slices.DeleteFunc(h.envds, func(x *standaloneEnvd) bool { return x == e })
	h.mu.Unlock()
}

func waitHTTP(ctx context.Context, hc *http.Client, url string, died <-chan struct{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-died:
			return fmt.Errorf("exited at start (%v)", last)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("not healthy in %s: %v", within, last)
}

// stopProcess sends SIGTERM, then SIGKILL after grace.
func stopProcess(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Sandbox is a sandbox created through the E2B API.
type Sandbox struct {
	ID    string
	Token string // envdAccessToken
}

// createBody is what the SDKs send by default, give or take metadata:
// template base, internet access on unless internet is false.
func createBody(internet bool) []byte {
	b := map[string]any{"templateID": "base", "timeout": 3600}
	if !internet {
		b["allow_internet_access"] = false
	}
	raw, _ := json.Marshal(b)
	return raw
}

// errRateLimited is a 429 from sandboxd's limiter.
var errRateLimited = errors.New("rate limited (429)")

// create is POST /v2/sandboxes, the current SDKs' create. It returns once
// sandboxd answers 201: a cold sandbox's envd has answered /health and
// /init; a claimed warm member's /init follows in the background, and its
// first request waits for it (sandboxd --defer-claim-init).
func (h *Harness) create(ctx context.Context, internet bool) (*Sandbox, error) {
	return h.createAs(ctx, h.key, internet)
}

func (h *Harness) createAs(ctx context.Context, key string, internet bool) (*Sandbox, error) {
	return h.createBody(ctx, key, createBody(internet))
}

// createBody is createAs with the request's body.
func (h *Harness) createBody(ctx context.Context, key string, reqBody []byte) (*Sandbox, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+h.addr+apiPrefix+"/v2/sandboxes", bytes.NewReader(reqBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", key)
	resp, err := h.api.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusTooManyRequests {
		return nil, fmt.Errorf("create: %w: %s", errRateLimited, bytes.TrimSpace(raw))
	}
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("create: %s: %s", resp.Status, bytes.TrimSpace(raw))
	}
	var body struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(raw, &body); err != nil || body.SandboxID == "" {
		return nil, fmt.Errorf("create: bad body %q: %v", raw, err)
	}
	h.mu.Lock()
	h.live[body.SandboxID] = true
	h.mu.Unlock()
	return &Sandbox{ID: body.SandboxID, Token: body.EnvdAccessToken}, nil
}

// destroy is DELETE /sandboxes/{id}. It tries each tenant's key: the
// bench's own first.
func (h *Harness) destroy(ctx context.Context, id string) error {
	err := h.destroyAs(ctx, h.key, id)
	if errors.Is(err, errNotFound) {
		for _, k := range h.keys {
			if k != h.key {
				if err = h.destroyAs(ctx, k, id); !errors.Is(err, errNotFound) {
					break
				}
			}
		}
	}
	if errors.Is(err, errNotFound) {
		err = nil // gone already
	}
	if err == nil {
		h.mu.Lock()
		delete(h.live, id)
		h.mu.Unlock()
	}
	return err
}

var errNotFound = errors.New("not found")

func (h *Harness) destroyAs(ctx context.Context, key, id string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, "http://"+h.addr+apiPrefix+"/sandboxes/"+id, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := h.api.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent:
		return nil
	case http.StatusNotFound:
		return errNotFound
	}
	return fmt.Errorf("delete %s: %s", id, resp.Status)
}

// listRunning is GET /sandboxes for every tenant of the run: every running
// sandbox, including those the SDK scripts created.
func (h *Harness) listRunning(ctx context.Context) ([]string, error) {
	var all []string
	for _, k := range h.keys {
		ids, err := h.listAs(ctx, k)
		if err != nil {
			return all, err
		}
		all = append(all, ids...)
	}
	return all, nil
}

func (h *Harness) listAs(ctx context.Context, key string) ([]string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.addr+apiPrefix+"/sandboxes", nil)
	req.Header.Set("X-API-Key", key)
	resp, err := h.api.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("list: %s", resp.Status)
	}
	var body []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range body {
		ids = append(ids, s.SandboxID)
	}
	return ids, nil
}

// destroyAll deletes ids with a few workers, returning each delete's time.
func (h *Harness) destroyAll(ctx context.Context, ids []string, workers int) ([]time.Duration, int) {
	var (
		mu    sync.Mutex
		took  []time.Duration
		fails int
		wg    sync.WaitGroup
	)
	ch := make(chan string)
	for range max(1, workers) {
		wg.Go(func() {
			for id := range ch {
				t0 := time.Now()
				err := h.destroy(ctx, id)
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					fails++
				} else {
					took = append(took, d)
				}
				mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		ch <- id
	}
	close(ch)
	wg.Wait()
	return took, fails
}

// sandboxSocket is the host path of a sandbox's envd socket: what the
// proxy dials. Reaching envd there directly measures the proxy's cost. The
// local backend's layout is its own business, so look for it: the known
// places first, then anywhere in the sandbox's state dir but its rootfs.
func (h *Harness) sandboxSocket(id string) (string, error) {
	dir := filepath.Join(h.runDir, "sandboxes", id)
	for _, p := range []string{"disk/envd/envd.sock", "envd/envd.sock"} {
		if fi, err := os.Lstat(filepath.Join(dir, p)); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return filepath.Join(dir, p), nil
		}
	}
	var found string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || found != "" {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() && (rel == "rootfs" || strings.Count(rel, "/") > 3) {
			return filepath.SkipDir
		}
		if d.Name() == "envd.sock" && d.Type()&os.ModeSocket != 0 {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	if found == "" {
		return "", fmt.Errorf("no envd.sock under %s", dir)
	}
	return found, nil
}

// sandboxCgroupMem is the sandbox's memory cgroup directory (v1 or v2):
// <parent>/<id>, where the parent is the backend's business (/sandboxd, or
// one per run dir), so look for the id one level under the root.
func sandboxCgroupMem(id string) string {
	for _, pat := range []string{"/sys/fs/cgroup/memory/*/" + id, "/sys/fs/cgroup/*/" + id} {
		if m, _ := filepath.Glob(pat); len(m) > 0 {
			for _, p := range m {
				if exists(filepath.Join(p, "memory.usage_in_bytes")) || exists(filepath.Join(p, "memory.current")) {
					return p
				}
			}
		}
	}
	return ""
}

// cgroupMem reads a sandbox's memory cgroup: usage (what the kernel charges
// it, page cache and kernel memory included) and its processes.
type cgMem struct {
	Usage float64 // bytes
	Anon  float64 // rss (v1) / anon (v2)
	File  float64 // page cache, tmpfs included
	Kmem  float64 // kernel memory (v1 kmem.usage / v2 kernel)
	Pids  []int
}

func readCgroupMem(id string) (cgMem, error) {
	var m cgMem
	dir := sandboxCgroupMem(id)
	if dir == "" {
		return m, errors.New("no memory cgroup for " + id)
	}
	num := func(name string) float64 {
		v, _ := strconv.ParseFloat(readTrim(filepath.Join(dir, name)), 64)
		return v
	}
	if exists(filepath.Join(dir, "memory.usage_in_bytes")) {
		m.Usage = num("memory.usage_in_bytes")
		m.Kmem = num("memory.kmem.usage_in_bytes")
	} else {
		m.Usage = num("memory.current")
	}
	for _, l := range strings.Split(readTrim(filepath.Join(dir, "memory.stat")), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "total_rss", "anon":
			m.Anon = v
		case "total_cache", "file":
			m.File = v
		case "kernel":
			m.Kmem = v
		}
	}
	for _, l := range strings.Fields(readTrim(filepath.Join(dir, "cgroup.procs"))) {
		if pid, err := strconv.Atoi(l); err == nil {
			m.Pids = append(m.Pids, pid)
		}
	}
	return m, nil
}

// Close deletes every sandbox the run created (also those an SDK script
// left), stops sandboxd and the standalone envds, and removes the
// throw-away directories — unless something is still mounted there, which
// it reports instead of deleting through.
func (h *Harness) Close() {
	h.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if h.sandboxd != nil {
			select {
			case <-h.sbdDone:
			default:
				if h.addr == "" {
					break
				}
				ids := map[string]bool{}
				h.mu.Lock()
				for id := range h.live {
					ids[id] = true
				}
				h.mu.Unlock()
				if listed, err := h.listRunning(ctx); err == nil {
					for _, id := range listed {
						ids[id] = true
					}
				}
				if len(ids) > 0 {
					fmt.Fprintf(os.Stderr, "bench: deleting %d sandbox(es)\n", len(ids))
					_, fails := h.destroyAll(ctx, mapKeys(ids), 4)
					if fails > 0 {
						fmt.Fprintf(os.Stderr, "bench: %d sandbox(es) could not be deleted\n", fails)
					}
				}
			}
			stopProcess(h.sandboxd, h.sbdDone, 15*time.Second)
		}
		h.mu.Lock()
		envds := slices.Clone(h.envds)
		h.mu.Unlock()
		var wg sync.WaitGroup
		for _, e := range envds {
			wg.Go(func() { stopProcess(e.cmd, e.done, 5*time.Second) })
		}
		wg.Wait()
		if h.runDir != "" {
			left, _ := os.ReadDir(filepath.Join(h.runDir, "sandboxes"))
			if h.keep && len(left) > 0 {
				fmt.Fprintf(os.Stderr, "bench: %d sandbox(es) left in %s; the next run with it reconciles them\n", len(left), h.runDir)
			}
		}
		if h.runDir != "" && !h.keep {
			left, _ := os.ReadDir(filepath.Join(h.runDir, "sandboxes"))
			if len(left) > 0 || mountedUnder(h.runDir) {
				fmt.Fprintf(os.Stderr, "bench: %d sandbox(es) left in %s; start `sandboxd serve --run-dir %s --data-dir %s` to reconcile them\n",
					len(left), h.runDir, h.runDir, h.dataDir())
				return // keep the data dir too: it is what reconciles them
			}
			_ = os.RemoveAll(h.runDir)
		}
		if h.workDir != "" {
			if h.keepLogs {
				fmt.Fprintf(os.Stderr, "bench: logs kept in %s\n", h.workDir)
				return
			}
			_ = os.RemoveAll(h.workDir)
		}
	})
}

func mountedUnder(dir string) bool {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return true // cannot tell: be safe
	}
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			return true
		}
	}
	return false
}

func mapKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
