package main

// Harness of the end-to-end tests in e2e_test.go: they build the real envd
// and sandboxd binaries once per test binary run, start real sandboxd
// processes on the local backend (Linux namespaces via libcontainer, so they
// need root) on loopback, and talk to them only over HTTP, as E2B's SDKs do.
//
//	go test -race -tags seccomp ./cmd/sandboxd/
//
// Environment:
//
//	SANDBOXD_BIN_DIR   use the prebuilt envd and sandboxd in this directory
//	                   instead of building them (and envd-rs, sandboxd's
//	                   default agent, where it is there)
//	SANDBOXD_E2E_AGENT "envd": the sandboxes run envd (Go) even where cargo
//	                   could build envd-rs, the default agent, which the
//	                   harness builds otherwise (`make envd-rs BIN=<dir>`)
//	SANDBOXD_E2E_RACE  "1": build sandboxd with -race; any data race it
//	                   reports on stderr fails the test that ran it
//	SANDBOXD_E2E_EGRESS_SUBNET
//	                   the --egress-subnet of every sandboxd a test starts
//	                   without one of its own, and the tests run one at a
//	                   time; unset, each installation gets a /20 of
//	                   10.96.0.0/12 of its own and the local backend's tests
//	                   run side by side (go test -parallel)
//	SANDBOXD_E2E_KNOWN_BUGS
//	                   "1": also run the tests that known bugs of sandboxd
//	                   fail (they skip otherwise, naming the bug)
//
// Each test gets its own data dir, run dir (/run/sandboxd/e2e-<random>, and
// so its own cgroup parent), egress subnet (and so its own nftables table)
// and sandboxd, and its cleanup kills every sandbox, checks that none left
// anything on the host (state dir, mount, cgroup) and removes the run dir,
// its cgroup parent and its subnet's table. Nothing is shared, so the tests
// on the local backend run side by side: they spend most of their time
// waiting on sandboxes, and one at a time they took 16 of CI's minutes. The
// tests on Incus stay serial (newSerialE2EEnv): a sandboxd on Incus adopts
// every instance of no namespace at start-up.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/api/process/processconnect"
	"github.com/sandboxd/sandboxd/internal/agentbin"
	"github.com/sandboxd/sandboxd/runtime/egress"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// e2eAPIPrefix is where sandboxd mounts E2B's REST API (server.E2BPrefix,
// spelled out: it is part of the contract users configure).
const e2eAPIPrefix = "/v1/sandboxes/e2b"

// e2eEnvdPort is envd's port in E2B's addressing (E2b-Sandbox-Port).
const e2eEnvdPort = "49983"

var (
	// e2eBinDir holds the envd and sandboxd binaries under test.
	e2eBinDir string
	// e2eSkipReason is set when this host cannot run the tests.
	e2eSkipReason string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runE2ETests(m))
}

func runE2ETests(m *testing.M) int {
	switch {
	case testing.Short():
		e2eSkipReason = "end-to-end tests of sandboxd skipped in -short mode"
	case os.Geteuid() != 0:
		e2eSkipReason = "end-to-end tests of sandboxd need root (the local backend makes namespaces, mounts and cgroups); run them as root"
	case !e2eExists("/sys/fs/cgroup"):
		e2eSkipReason = "end-to-end tests of sandboxd need cgroups at /sys/fs/cgroup"
	}
	if e2eSkipReason != "" {
		return m.Run()
	}
	if dir := os.Getenv("SANDBOXD_BIN_DIR"); dir != "" {
		for _, b := range []string{"envd", "sandboxd"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || !fi.Mode().IsRegular() {
				fmt.Fprintf(os.Stderr, "SANDBOXD_BIN_DIR=%s: no %s binary there\n", dir, b)
				return 1
			}
		}
		e2eBinDir = dir
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "sandboxd-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildE2EBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	e2eBinDir = dir
	return m.Run()
}

// buildE2EBinaries builds what `make build` builds: a static envd and
// code-interpreter, sandboxd and sandboxd-init with cgo and the seccomp
// profile, sandboxd-spawn, and envd-rs (by make, which knows cargo's
// flags; without cargo it says so, and the sandboxes run envd).
func buildE2EBinaries(dir string) error {
	if os.Getenv("SANDBOXD_E2E_AGENT") != "envd" {
		cmd := exec.Command("make", "--no-print-directory", "-C", filepath.Join("..", ".."), "envd-rs", "BIN="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("make envd-rs: %v\n%s", err, out)
		} else if len(out) > 0 {
			os.Stderr.Write(out)
		}
	}
	sandboxdArgs := []string{"build", "-tags", "seccomp", "-trimpath"}
	if os.Getenv("SANDBOXD_E2E_RACE") == "1" {
		sandboxdArgs = append(sandboxdArgs, "-race")
	}
	builds := []struct {
		args []string
		cgo  string
	}{
		{[]string{"build", "-trimpath", "-o", filepath.Join(dir, "envd"), "github.com/sandboxd/sandboxd/cmd/envd"}, "CGO_ENABLED=0"},
		{[]string{"build", "-trimpath", "-o", filepath.Join(dir, "code-interpreter"), "github.com/sandboxd/sandboxd/cmd/code-interpreter"}, "CGO_ENABLED=0"},
		{append(sandboxdArgs, "-o", filepath.Join(dir, "sandboxd"), "github.com/sandboxd/sandboxd/cmd/sandboxd"), "CGO_ENABLED=1"},
		{[]string{"build", "-tags", "seccomp", "-trimpath", "-o", filepath.Join(dir, "sandboxd-init"), "github.com/sandboxd/sandboxd/cmd/sandboxd-init"}, "CGO_ENABLED=1"},
	}
	for _, b := range builds {
		cmd := exec.Command("go", b.args...)
		cmd.Env = append(os.Environ(), b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(b.args, " "), err, out)
		}
	}
	return runtimetest.BuildSpawn(filepath.Join(dir, "sandboxd-spawn"))
}

func e2eExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func e2eRandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// e2eMissingID returns a well-formed sandbox id that names no sandbox: 20
// characters of [a-z0-9], like sandboxd's own.
func e2eMissingID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// ---------------------------------------------------------------------------
// env: one data dir, one run dir, its tenants and the sandboxd serving them.

// e2eEnv is one test's installation: a data dir (the store), a run dir (the
// local backend's host state), tenants with their keys, and the sandboxd
// currently serving them (several in turn across a restart).
type e2eEnv struct {
	t       *testing.T
	dataDir string
	runDir  string
	logDir  string
	keys    map[string]string // tenant -> API key
	// serveArgs are added to every `sandboxd serve` the env starts.
	serveArgs []string
	// launch is the binary and extra environment of the next start (the
	// crash tests' fault-injection build); zero: e2eBinDir's sandboxd.
	launch e2eLaunch

	mu      sync.Mutex
	srv     *e2eServer        // the current sandboxd; nil before start
	servers []*e2eServer      // every sandboxd started, for logs
	created map[string]string // sandbox id -> API key of its tenant
}

// newE2EEnv prepares an installation with the given tenants, each with a key
// made by `sandboxd keys create`. Its cleanup kills every sandbox through
// the API, stops sandboxd with SIGTERM and then checks that nothing of any
// sandbox is left on the host: no state directory in the run dir, no mount
// under it, no cgroup.
//
// A top-level test that makes one runs beside the other such tests, unless
// SANDBOXD_E2E_EGRESS_SUBNET puts every sandboxd on one subnet.
func newE2EEnv(t *testing.T, tenants ...string) *e2eEnv {
	t.Helper()
	if e2eSkipReason != "" {
		t.Skip(e2eSkipReason)
	}
	if !strings.Contains(t.Name(), "/") && os.Getenv("SANDBOXD_E2E_EGRESS_SUBNET") == "" {
		if _, twice := e2eParallel.LoadOrStore(t, true); !twice { // a test with two installations
			t.Parallel()
		}
	}
	return newSerialE2EEnv(t, tenants...)
}

// e2eParallel holds the tests newE2EEnv let run beside the others.
var e2eParallel sync.Map // *testing.T -> true

// newSerialE2EEnv is newE2EEnv for a test that must run alone: one that
// shares something host-wide with other tests' sandboxd, the host's Incus
// or the test cluster.
func newSerialE2EEnv(t *testing.T, tenants ...string) *e2eEnv {
	t.Helper()
	if e2eSkipReason != "" {
		t.Skip(e2eSkipReason)
	}
	if err := os.MkdirAll("/run/sandboxd", 0o700); err != nil {
		t.Fatal(err)
	}
	e := &e2eEnv{
		t:       t,
		dataDir: t.TempDir(),
		runDir:  filepath.Join("/run/sandboxd", "e2e-"+e2eRandHex(6)),
		logDir:  t.TempDir(),
		keys:    map[string]string{},
		created: map[string]string{},
	}
	// Registered first, so run last: the table outlives the sandboxd that
	// made it (sandboxd leaves its rules for sandboxes that outlive it).
	t.Cleanup(func() {
		if subnet, ok := e2eSubnets.LoadAndDelete(e.runDir); ok {
			_ = egress.DeleteTable(subnet.(netip.Prefix))
		}
	})
	t.Cleanup(e.cleanup)
	for _, name := range tenants {
		e.keys[name] = e.createKey(name)
	}
	return e
}

var e2eKeyRE = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)

// createKey runs `sandboxd keys create`, which prints the key alone on
// stdout.
func (e *e2eEnv) createKey(tenant string) string {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(e2eBinDir, "sandboxd"), "keys", "create", "--data-dir", e.dataDir, "--tenant", tenant)
	cmd.Env = e2eSandboxdEnviron()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		e.t.Fatalf("sandboxd keys create --tenant %s: %v\n%s", tenant, err, stderr.Bytes())
	}
	key := strings.TrimSuffix(stdout.String(), "\n")
	if !e2eKeyRE.MatchString(key) {
		e.t.Fatalf("sandboxd keys create printed %q on stdout, want the key alone (e2b_ + 40 lowercase hex)", stdout.String())
	}
	return key
}

var e2eKeyIDRE = regexp.MustCompile(`created key (\S+) `)

// createKeyWithID is createKey that also returns the key's id (for `keys
// revoke`), which `keys create` reports on stderr.
func (e *e2eEnv) createKeyWithID(tenant string) (key, id string) {
	e.t.Helper()
	stdout, stderr := e.sandboxdCLI(e.t, "keys", "create", "--data-dir", e.dataDir, "--tenant", tenant)
	key = strings.TrimSuffix(stdout, "\n")
	m := e2eKeyIDRE.FindStringSubmatch(stderr)
	if !e2eKeyRE.MatchString(key) || m == nil {
		e.t.Fatalf("sandboxd keys create: stdout %q stderr %q", stdout, stderr)
	}
	return key, m[1]
}

// sandboxdCLI runs a sandboxd subcommand to completion.
func (e *e2eEnv) sandboxdCLI(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(e2eBinDir, "sandboxd"), args...)
	cmd.Env = e2eSandboxdEnviron()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxd %s: %v\n%s", strings.Join(args, " "), err, errOut.Bytes())
	}
	return out.String(), errOut.String()
}

// e2eSandboxdEnviron is the environment sandboxd runs with: ours minus any
// SANDBOXD_* setting of the developer's shell, plus the per-tenant API rate
// limits turned off. The tests fire hundreds of calls in a second on
// purpose (every route with every bad credential...) and assert exact
// statuses, which a 429 would break; rate limiting has tests of its own.
// They are set through the environment, not flags, so that a sandboxd
// without these settings (SANDBOXD_BIN_DIR) still starts.
func e2eSandboxdEnviron() []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SANDBOXD_") })
	// No code-interpreter build behind every test's back (its own e2e
	// turns it on).
	return append(env, "SANDBOXD_CREATE_RATE=0", "SANDBOXD_LIFECYCLE_RATE=0", "SANDBOXD_READ_RATE=0",
		"SANDBOXD_CODE_INTERPRETER=off")
}

// start starts a sandboxd on the env's data and run dirs and waits until it
// is healthy. It becomes the env's current server.
func (e *e2eEnv) start() *e2eServer {
	e.t.Helper()
	e.mu.Lock()
	n := len(e.servers)
	e.mu.Unlock()
	s := startE2EServer(e.t, e.launch, e.dataDir, e.runDir, filepath.Join(e.logDir, fmt.Sprintf("sandboxd-%d.log", n)), e.serveArgs...)
	e.mu.Lock()
	e.srv = s
	e.servers = append(e.servers, s)
	e.mu.Unlock()
	return s
}

func (e *e2eEnv) current() *e2eServer {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.srv
}

// track records a sandbox for the final cleanup.
func (e *e2eEnv) track(id, key string) {
	e.mu.Lock()
	e.created[id] = key
	e.mu.Unlock()
}

func (e *e2eEnv) sandboxIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for id := range e.created {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (e *e2eEnv) cleanup() {
	t := e.t
	s := e.current()
	if s != nil && !s.running() && !s.stopped.Load() {
		t.Errorf("sandboxd exited on its own during the test: %v\n%s", s.waitErr, e2eTail(e2eWithoutAccessLog(s.logs()), 40))
	}
	if s != nil && s.running() {
		e.killAll(s)
		if err := s.stop(syscall.SIGTERM); err != nil {
			t.Errorf("cleanup: stop sandboxd: %v", err)
		}
	}
	leaks := e.leaks()
	if leaks != nil && s != nil {
		// Do not leave sandboxes running on the host: a fresh sandboxd
		// re-adopts them and kills them through the API.
		t.Errorf("cleanup: sandboxes left on the host after killing them all through the API and stopping sandboxd:\n  %s",
			strings.Join(leaks, "\n  "))
		if fresh := tryStartE2EServer(e2eLaunch{}, e.dataDir, e.runDir, filepath.Join(e.logDir, "sandboxd-cleanup.log"), e.serveArgs...); fresh != nil {
			e.killAll(fresh)
			_ = fresh.stop(syscall.SIGTERM)
			e.mu.Lock()
			e.servers = append(e.servers, fresh)
			e.mu.Unlock()
		}
		if still := e.leaks(); still != nil {
			t.Errorf("cleanup: still left after a second sandboxd killed what it found:\n  %s", strings.Join(still, "\n  "))
		}
	}
	e.mu.Lock()
	servers := slices.Clone(e.servers)
	e.mu.Unlock()
	for _, srv := range servers {
		logs := srv.logs()
		if bytes.Contains(logs, []byte("WARNING: DATA RACE")) {
			t.Errorf("sandboxd (%s) reported a data race:\n%s", srv.logPath, logs)
		} else if t.Failed() {
			t.Logf("sandboxd log %s (last lines but access log):\n%s", srv.logPath, e2eTail(e2eWithoutAccessLog(logs), 60))
		}
	}
	if ms := e2eMountsUnder(e.runDir); len(ms) == 0 {
		if err := os.RemoveAll(e.runDir); err != nil {
			t.Errorf("cleanup: remove run dir: %v", err)
		}
		e.removeCgroupParent()
	} else {
		t.Errorf("cleanup: not removing %s: mounts remain under it: %v", e.runDir, ms)
	}
}

// killAll kills every sandbox the test created, then every sandbox any of
// the env's tenants still lists, through s's API.
func (e *e2eEnv) killAll(s *e2eServer) {
	t := e.t
	for _, id := range e.sandboxIDs() {
		e.mu.Lock()
		key := e.created[id]
		e.mu.Unlock()
		r, err := s.tryDo(http.MethodDelete, e2eAPIPrefix+"/sandboxes/"+id, key, nil, nil)
		if err != nil {
			t.Errorf("cleanup: kill %s: %v", id, err)
		} else if r.status != http.StatusNoContent && r.status != http.StatusNotFound {
			t.Errorf("cleanup: kill %s: %d %s", id, r.status, r.body)
		}
	}
	for tenant, key := range e.keys {
		r, err := s.tryDo(http.MethodGet, e2eAPIPrefix+"/v2/sandboxes", key, nil, nil)
		if err != nil || r.status != http.StatusOK {
			t.Errorf("cleanup: list sandboxes of %s: %v %+v", tenant, err, r)
			continue
		}
		var left []map[string]any
		_ = json.Unmarshal(r.body, &left)
		for _, sb := range left {
			id, _ := sb["sandboxID"].(string)
			t.Errorf("cleanup: tenant %s still has sandbox %s (%v) that the test did not create or track", tenant, id, sb["state"])
			_, _ = s.tryDo(http.MethodDelete, e2eAPIPrefix+"/sandboxes/"+id, key, nil, nil)
		}
	}
}

// leaks lists what sandboxes left on the host: state directories in the run
// dir, mounts under it, and cgroups of the sandboxes the test created.
func (e *e2eEnv) leaks() []string {
	var out []string
	ents, err := os.ReadDir(filepath.Join(e.runDir, "sandboxes"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		out = append(out, err.Error())
	}
	for _, ent := range ents {
		out = append(out, "state dir "+filepath.Join(e.runDir, "sandboxes", ent.Name()))
	}
	for _, m := range e2eMountsUnder(e.runDir) {
		out = append(out, "mount "+m)
	}
	for _, id := range e.sandboxIDs() {
		for _, p := range e2eSandboxCgroups(id) {
			out = append(out, "cgroup "+p)
		}
	}
	return out
}

// e2eSandboxCgroups lists the cgroup directories of sandbox id in every
// hierarchy: the local backend makes <parent>/<id>, and the parent depends
// on the run dir, so any parent is searched.
func e2eSandboxCgroups(id string) []string {
	v1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/*", id))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", id))
	return append(v1, v2...)
}

// removeCgroupParent removes the (empty) cgroup parent sandboxd made for the
// env's run dir, and its own cpu group beside it, in every hierarchy, when a
// test's sandboxd did not remove them itself (it does on a clean stop with
// no sandbox left; not after a SIGKILL). A parent that still has child cgroups is a leak and fails the
// test.
func (e *e2eEnv) removeCgroupParent() {
	parent := cgroupParent(e.runDir)
	if parent == "/sandboxd" { // shared with other instances: never ours to remove
		return
	}
	for _, p := range e2eCgroupDirs(parent) {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			e.t.Errorf("cleanup: remove the run dir's cgroup parent %s: %v", p, err)
		}
	}
	// sandboxd's own cpu group (--local-cpu-group), which a SIGKILL leaves.
	for _, p := range e2eCgroupDirs(parent + ".daemon") {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			e.t.Errorf("cleanup: remove sandboxd's cpu group %s: %v", p, err)
		}
	}
}

// e2eMountsUnder lists the mount points at or below dir in this process's mount
// namespace (which sandboxd, our child, shares).
func e2eMountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := e2eUnescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// e2eUnescapeMountinfo undoes the kernel's octal escapes (\040 for a space...).
func e2eUnescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// e2eWithoutAccessLog drops sandboxd's one-line-per-request access log.
func e2eWithoutAccessLog(b []byte) []byte {
	var out []byte
	for line := range bytes.Lines(b) {
		if !bytes.Contains(line, []byte(`"msg":"http request"`)) {
			out = append(out, line...)
		}
	}
	return out
}

func e2eTail(b []byte, lines int) string {
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// ---------------------------------------------------------------------------
// server: one sandboxd process.

// e2eServer is one running `sandboxd serve`.
type e2eServer struct {
	base    string // http://127.0.0.1:PORT
	logPath string // sandboxd's stdout and stderr
	cmd     *exec.Cmd
	client  *http.Client
	tr      *http.Transport

	done    chan struct{} // closed when the process has exited
	waitErr error         // set before done is closed
	stopped atomic.Bool   // stop was called: an exit is expected
}

// startE2EServer starts sandboxd serve on a free loopback port and waits for
// GET /health to answer 200 (it does once Reconcile is done). A sandboxd that
// exits first fails the test with its log.
func startE2EServer(t *testing.T, l e2eLaunch, dataDir, runDir, logPath string, extraArgs ...string) *e2eServer {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := launchE2EServer(l, dataDir, runDir, logPath, extraArgs...)
		if err != nil {
			t.Fatalf("start sandboxd: %v", err)
		}
		err = s.waitHealthy(90 * time.Second)
		if err == nil {
			return s
		}
		lastErr = err
		_ = s.stop(syscall.SIGKILL)
		logs := s.logs()
		if bytes.Contains(logs, []byte("address already in use")) {
			continue // the free port was taken meanwhile: pick another
		}
		t.Fatalf("sandboxd did not become healthy: %v\nlog %s:\n%s", err, logPath, e2eTail(logs, 80))
	}
	t.Fatalf("sandboxd did not become healthy: %v", lastErr)
	return nil
}

// tryStartE2EServer is startE2EServer for cleanups: nil instead of failing.
func tryStartE2EServer(l e2eLaunch, dataDir, runDir, logPath string, extraArgs ...string) *e2eServer {
	s, err := launchE2EServer(l, dataDir, runDir, logPath, extraArgs...)
	if err != nil {
		return nil
	}
	if err := s.waitHealthy(90 * time.Second); err != nil {
		_ = s.stop(syscall.SIGKILL)
		return nil
	}
	return s
}

// e2eLaunch is what a sandboxd is started from besides its flags.
type e2eLaunch struct {
	bin   string   // the sandboxd binary; "": e2eBinDir's
	env   []string // added to e2eSandboxdEnviron
	unset []string // names taken out of e2eSandboxdEnviron (a default under test)
}

func launchE2EServer(l e2eLaunch, dataDir, runDir, logPath string, extraArgs ...string) (*e2eServer, error) {
	port, err := e2eFreePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// A cluster's sandboxes are on the members' relays' subnet, not ours.
	if !slices.ContainsFunc(extraArgs, func(a string) bool {
		return strings.HasPrefix(a, "--egress-subnet") || strings.HasPrefix(a, "--incus-remote")
	}) {
		extraArgs = append(extraArgs, "--egress-subnet="+e2eSubnet(runDir))
	}
	// No spare floor unless the test asks for one: a test that counts what
	// is on the host must not race the spare pool's first fill.
	if !slices.ContainsFunc(extraArgs, func(a string) bool { return strings.HasPrefix(a, "--spare-min") }) {
		extraArgs = append(extraArgs, "--spare-min=")
	}
	bin := l.bin
	if bin == "" {
		bin = filepath.Join(e2eBinDir, "sandboxd")
	}
	cmd := exec.Command(bin, append([]string{"serve",
		"--listen", addr,
		"--data-dir", dataDir,
		"--run-dir", runDir,
		"--envd", agentbin.Path(e2eBinDir),
	}, extraArgs...)...)
	cmd.Env = append(slices.DeleteFunc(e2eSandboxdEnviron(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(l.unset, name)
	}), l.env...)
	// A file, not a pipe: sandboxes outlive a SIGKILLed sandboxd, and
	// nothing may hold a pipe of ours open past the process we wait for.
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
		DisableCompression:  true,
	}
	s := &e2eServer{
		base:    "http://" + addr,
		logPath: logPath,
		cmd:     cmd,
		tr:      tr,
		client:  &http.Client{Transport: tr, Timeout: 2 * time.Minute},
		done:    make(chan struct{}),
	}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	return s, nil
}

// e2eSubnets holds the egress subnet of each run dir that e2eSubnet gave
// one: every sandboxd of an installation (a restart, an HA pair) shares it,
// and no other installation of this process gets it while it lives.
var (
	e2eSubnets    sync.Map // run dir -> netip.Prefix
	e2eSubnetNext atomic.Uint32
)

// e2eSubnet is the --egress-subnet of a sandboxd on runDir that was given
// none: SANDBOXD_E2E_EGRESS_SUBNET, or the next /20 of 10.96.0.0/12 (256 of
// them, far more than the tests that run at once; no other test or script
// of the repository uses the block).
func e2eSubnet(runDir string) string {
	if subnet := os.Getenv("SANDBOXD_E2E_EGRESS_SUBNET"); subnet != "" {
		return subnet
	}
	if subnet, ok := e2eSubnets.Load(runDir); ok {
		return subnet.(netip.Prefix).String()
	}
	n := e2eSubnetNext.Add(1) - 1
	fresh := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(96 + n/16%16), byte(n % 16 * 16), 0}), 20)
	subnet, _ := e2eSubnets.LoadOrStore(runDir, fresh)
	return subnet.(netip.Prefix).String()
}

// e2eFreePort asks the kernel for a free loopback port.
func e2eFreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *e2eServer) waitHealthy(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("sandboxd exited: %v", s.waitErr)
		default:
		}
		resp, err := s.client.Get(s.base + "/health")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GET /health did not answer 200 within %v (last: %v)", limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *e2eServer) running() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// stop signals sandboxd and waits for it to exit (SIGKILL after 30 s). After
// SIGTERM a clean exit (status 0) is required.
func (s *e2eServer) stop(sig syscall.Signal) error {
	s.stopped.Store(true)
	defer s.tr.CloseIdleConnections()
	if !s.running() {
		return nil
	}
	if err := s.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("sandboxd did not exit within 30s of %v", sig)
	}
	if sig == syscall.SIGKILL {
		return nil
	}
	return s.waitErr
}

// logs returns everything sandboxd wrote to stdout and stderr so far.
func (s *e2eServer) logs() []byte {
	b, _ := os.ReadFile(s.logPath)
	return b
}

// logLines returns sandboxd's JSON log lines (slog's JSON handler).
func (s *e2eServer) logLines() []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(string(s.logs()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// HTTP helpers.

// e2eResponse is one HTTP answer, read fully.
type e2eResponse struct {
	status int
	header http.Header
	body   []byte
}

func (r e2eResponse) String() string {
	return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body))
}

// tryDo sends one request to sandboxd. body is sent as is when it is a
// string or []byte, as JSON otherwise (nil: no body). key goes in
// X-API-KEY when not empty; hdr adds headers.
func (s *e2eServer) tryDo(method, path, key string, body any, hdr http.Header) (e2eResponse, error) {
	var rd io.Reader
	ctype := ""
	switch b := body.(type) {
	case nil:
	case string:
		rd, ctype = strings.NewReader(b), "application/json"
	case []byte:
		rd, ctype = bytes.NewReader(b), "application/json"
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return e2eResponse{}, err
		}
		rd, ctype = bytes.NewReader(raw), "application/json"
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		return e2eResponse{}, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return e2eResponse{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return e2eResponse{}, err
	}
	return e2eResponse{status: resp.StatusCode, header: resp.Header, body: raw}, nil
}

// do is tryDo that fails the test on a transport error.
func (s *e2eServer) do(t *testing.T, method, path, key string, body any) e2eResponse {
	t.Helper()
	r, err := s.tryDo(method, path, key, body, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// api calls E2B's REST API under its mount point.
func (s *e2eServer) api(t *testing.T, method, path, key string, body any) e2eResponse {
	t.Helper()
	return s.do(t, method, e2eAPIPrefix+path, key, body)
}

// wantStatus fails the test unless r has status want.
func wantStatus(t *testing.T, what string, r e2eResponse, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("%s: got %s, want status %d", what, r, want)
	}
}

// wantError checks E2B's error shape: status want, a JSON body
// {"code": want, "message": "<non-empty>"} and nothing else (error_code is
// optional on E2B). It returns the message.
func wantError(t *testing.T, what string, r e2eResponse, want int) string {
	t.Helper()
	if r.status != want {
		t.Fatalf("%s: got %s, want status %d", what, r, want)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: Content-Type %q, want application/json", what, ct)
	}
	var body map[string]any
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("%s: error body %q is not a JSON object: %v", what, r.body, err)
	}
	code, ok := body["code"].(float64)
	if !ok || int(code) != want {
		t.Errorf("%s: body %s: code %v, want %d (E2B's JS SDK reads the body's code)", what, r.body, body["code"], want)
	}
	msg, ok := body["message"].(string)
	if !ok || msg == "" {
		t.Errorf("%s: body %s: want a non-empty message", what, r.body)
	}
	for k := range body {
		if k != "code" && k != "message" && k != "error_code" {
			t.Errorf("%s: body %s: unexpected key %q", what, r.body, k)
		}
	}
	return msg
}

// e2eDecode unmarshals r's body into v.
func e2eDecode(t *testing.T, what string, r e2eResponse, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("%s: decode %q: %v", what, r.body, err)
	}
}

// ---------------------------------------------------------------------------
// Sandboxes through the REST API.

// e2eSandbox is E2B's Sandbox (create and connect answers).
type e2eSandbox struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    *string `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// e2eDetail is E2B's SandboxDetail and ListedSandbox.
type e2eDetail struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	ClientID        string            `json:"clientID"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken *string           `json:"envdAccessToken"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
}

var (
	e2eSandboxIDRE = regexp.MustCompile(`^[a-z0-9]+$`)
	// e2eSemverRE is semver 2.0.0, which both SDKs parse envdVersion with.
	e2eSemverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
)

// wantKeys fails unless the JSON object raw has every key (E2B's Python SDK
// crashes on a missing required key).
func wantKeys(t *testing.T, what string, raw []byte, keys ...string) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: %q is not a JSON object: %v", what, raw, err)
	}
	for _, k := range keys {
		if v, ok := m[k]; !ok || string(v) == "null" {
			t.Errorf("%s: required key %q missing or null in %s", what, k, raw)
		}
	}
}

// wantSandboxBody validates a Sandbox body (create, connect).
func wantSandboxBody(t *testing.T, what string, raw []byte) e2eSandbox {
	t.Helper()
	wantKeys(t, what, raw, "sandboxID", "templateID", "clientID", "envdVersion")
	var sb e2eSandbox
	if err := json.Unmarshal(raw, &sb); err != nil {
		t.Fatalf("%s: decode %q: %v", what, raw, err)
	}
	if !e2eSandboxIDRE.MatchString(sb.SandboxID) {
		t.Errorf("%s: sandboxID %q does not match %s", what, sb.SandboxID, e2eSandboxIDRE)
	}
	if sb.ClientID == "" {
		t.Errorf("%s: clientID is empty", what)
	}
	if !e2eSemverRE.MatchString(sb.EnvdVersion) {
		t.Errorf("%s: envdVersion %q is not semver", what, sb.EnvdVersion)
	}
	return sb
}

// e2eDetailKeys are the keys E2B's Python SDK requires in SandboxDetail and
// ListedSandbox.
var e2eDetailKeys = []string{"templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount",
	"memoryMB", "diskSizeMB", "state", "envdVersion"}

// wantDetailBody validates a SandboxDetail or ListedSandbox object.
func wantDetailBody(t *testing.T, what string, raw []byte) e2eDetail {
	t.Helper()
	wantKeys(t, what, raw, e2eDetailKeys...)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	for _, k := range []string{"startedAt", "endAt"} {
		var s string
		if err := json.Unmarshal(m[k], &s); err != nil {
			t.Errorf("%s: %s %s is not a string", what, k, m[k])
			continue
		}
		if _, err := time.Parse(time.RFC3339, s); err != nil {
			t.Errorf("%s: %s %q is not RFC 3339: %v", what, k, s, err)
		}
	}
	var d e2eDetail
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: decode %q: %v", what, raw, err)
	}
	if d.State != "running" && d.State != "paused" {
		t.Errorf("%s: state %q, want running or paused", what, d.State)
	}
	if d.CPUCount < 1 || d.MemoryMB < 1 || d.DiskSizeMB < 1 {
		t.Errorf("%s: resources cpuCount=%d memoryMB=%d diskSizeMB=%d, want all >= 1", what, d.CPUCount, d.MemoryMB, d.DiskSizeMB)
	}
	if !e2eSemverRE.MatchString(d.EnvdVersion) {
		t.Errorf("%s: envdVersion %q is not semver", what, d.EnvdVersion)
	}
	if !d.EndAt.After(d.StartedAt) {
		t.Errorf("%s: endAt %v is not after startedAt %v", what, d.EndAt, d.StartedAt)
	}
	return d
}

// create makes a sandbox through path (/sandboxes or /v2/sandboxes) and
// tracks it for the env's cleanup. Sandboxes get no internet access unless
// the body says otherwise: the tests need only loopback, and this keeps the
// host's network (veths, nftables) untouched.
// createKept creates a sandbox with a 10-minute timeout and the env var
// SBX_KEPT set, for the tests of what a restart of its envd must keep; it
// returns the sandbox's id and envd access token.
func (e *e2eEnv) createKept(t *testing.T, key string) (id, tok string) {
	t.Helper()
	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{
		"timeout": 600, "envVars": map[string]string{"SBX_KEPT": "kept " + e2eRandHex(4)},
	})
	return sb.SandboxID, *sb.EnvdAccessToken
}

func (e *e2eEnv) create(t *testing.T, path, key string, body map[string]any) (e2eSandbox, e2eResponse) {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	if _, ok := body["templateID"]; !ok {
		body["templateID"] = "base"
	}
	if _, ok := body["allow_internet_access"]; !ok {
		body["allow_internet_access"] = false
	}
	r := e.current().api(t, http.MethodPost, path, key, body)
	if r.status == http.StatusCreated {
		var sb e2eSandbox
		if json.Unmarshal(r.body, &sb) == nil && sb.SandboxID != "" {
			e.track(sb.SandboxID, key)
		}
	}
	wantStatus(t, "POST "+path, r, http.StatusCreated)
	return wantSandboxBody(t, "POST "+path, r.body), r
}

// get returns a sandbox's detail, failing unless it is 200.
func (s *e2eServer) get(t *testing.T, key, id string) e2eDetail {
	t.Helper()
	r := s.api(t, http.MethodGet, "/sandboxes/"+id, key, nil)
	wantStatus(t, "GET /sandboxes/"+id, r, http.StatusOK)
	return wantDetailBody(t, "GET /sandboxes/"+id, r.body)
}

// list returns GET /v2/sandboxes?query, checking each item.
func (s *e2eServer) list(t *testing.T, key, query string) ([]e2eDetail, e2eResponse) {
	t.Helper()
	path := "/v2/sandboxes"
	if query != "" {
		path += "?" + query
	}
	r := s.api(t, http.MethodGet, path, key, nil)
	wantStatus(t, "GET "+path, r, http.StatusOK)
	var items []json.RawMessage
	e2eDecode(t, "GET "+path, r, &items)
	var out []e2eDetail
	for i, raw := range items {
		out = append(out, wantDetailBody(t, fmt.Sprintf("GET %s item %d", path, i), raw))
	}
	return out, r
}

func e2eIDs(ds []e2eDetail) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.SandboxID)
	}
	return out
}

// e2eMetadataQuery encodes a metadata filter byte for byte as E2B's JS SDK
// does for Sandbox.list({query: {metadata}}): every key and value through encodeURIComponent, the
// pairs through URLSearchParams (form encoding), and that string once more
// through encodeURIComponent as the query value.
func e2eMetadataQuery(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var pairs []string
	for _, k := range keys {
		pairs = append(pairs, e2eFormEncode(e2eEncodeURIComponent(k))+"="+e2eFormEncode(e2eEncodeURIComponent(md[k])))
	}
	return "metadata=" + e2eEncodeURIComponent(strings.Join(pairs, "&"))
}

// e2eEncodeURIComponent is JavaScript's: everything but A-Z a-z 0-9 - _ . ! ~
// * ' ( ) is percent-encoded as UTF-8.
func e2eEncodeURIComponent(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.!~*'()", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// e2eFormEncode is WHATWG's application/x-www-form-urlencoded byte serializer
// (URLSearchParams.toString): space becomes +, everything but A-Z a-z 0-9
// * - . _ is percent-encoded.
func e2eFormEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ':
			b.WriteByte('+')
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("*-._", c) >= 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// e2eEventually polls cond every interval until it reports true, failing the
// test with cond's last explanation after limit. It bounds waits for things
// that happen asynchronously (the sweeper); it asserts nothing about speed.
func e2eEventually(t *testing.T, what string, limit, interval time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, limit, why)
		}
		time.Sleep(interval)
	}
}

// ---------------------------------------------------------------------------
// The data plane: envd through sandboxd's proxy, as the SDKs reach it with
// E2B_SANDBOX_URL set.

// e2eRouteTransport adds the routing headers E2B's SDKs send on every envd
// request, and the sandbox's access token when there is one.
type e2eRouteTransport struct {
	id, token string
	base      http.RoundTripper
}

func (rt e2eRouteTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("E2b-Sandbox-Id", rt.id)
	req.Header.Set("E2b-Sandbox-Port", e2eEnvdPort)
	if rt.token != "" {
		req.Header.Set("X-Access-Token", rt.token)
	}
	return rt.base.RoundTrip(req)
}

// envdHTTP is an HTTP client whose requests go to sandbox id's envd through
// the proxy (token "" sends no X-Access-Token).
func (s *e2eServer) envdHTTP(id, token string) *http.Client {
	return &http.Client{Transport: e2eRouteTransport{id: id, token: token, base: s.tr}, Timeout: 2 * time.Minute}
}

// envd sends one plain HTTP request to sandbox id's envd through the proxy.
func (s *e2eServer) envd(t *testing.T, id, token, method, path string, body []byte, ctype string) e2eResponse {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := s.envdHTTP(id, token).Do(req)
	if err != nil {
		t.Fatalf("%s %s to sandbox %s: %v", method, path, id, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s to sandbox %s: read body: %v", method, path, id, err)
	}
	return e2eResponse{status: resp.StatusCode, header: resp.Header, body: raw}
}

// e2eCommandResult is what process.Start streamed back.
type e2eCommandResult struct {
	stdout, stderr string
	exitCode       int32
	ended          bool
}

// run starts `/bin/sh -c script` in the sandbox through the proxy with
// envd's generated Connect client (Connect protocol, JSON, as the SDKs speak
// it) and collects its output until the end event.
func (s *e2eServer) run(ctx context.Context, id, token, script string) (e2eCommandResult, error) {
	client := processconnect.NewProcessClient(s.envdHTTP(id, token), s.base, connect.WithProtoJSON())
	stream, err := client.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}},
	}))
	if err != nil {
		return e2eCommandResult{}, err
	}
	defer stream.Close()
	var res e2eCommandResult
	var stdout, stderr strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			stdout.Write(d.GetStdout())
			stderr.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			res.ended = true
			res.exitCode = end.GetExitCode()
		}
	}
	res.stdout, res.stderr = stdout.String(), stderr.String()
	if err := stream.Err(); err != nil {
		return res, err
	}
	return res, nil
}

// mustRun is run that fails the test unless the command ended with exit
// code 0.
func (s *e2eServer) mustRun(t *testing.T, id, token, script string) e2eCommandResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := s.run(ctx, id, token, script)
	if err != nil {
		t.Fatalf("run %q in %s through the proxy: %v", script, id, err)
	}
	if !res.ended || res.exitCode != 0 {
		t.Fatalf("run %q in %s: ended=%v exit=%d stdout=%q stderr=%q", script, id, res.ended, res.exitCode, res.stdout, res.stderr)
	}
	return res
}

// writeFile uploads content to path in the sandbox through envd's /files.
func (s *e2eServer) writeFile(t *testing.T, id, token, path string, content []byte) {
	t.Helper()
	r := s.envd(t, id, token, http.MethodPost, "/files?path="+e2eEncodeURIComponent(path), content, "application/octet-stream")
	wantStatus(t, "POST /files?path="+path, r, http.StatusOK)
}

// readFile downloads path from the sandbox through envd's /files.
func (s *e2eServer) readFile(t *testing.T, id, token, path string) []byte {
	t.Helper()
	r := s.envd(t, id, token, http.MethodGet, "/files?path="+e2eEncodeURIComponent(path), nil, "")
	wantStatus(t, "GET /files?path="+path, r, http.StatusOK)
	return r.body
}

// wantProxyNotFound checks the proxy's answer for an unknown or dead
// sandbox, as E2B's client proxy answers it: 502 and exactly {"sandboxId": id, "message": "The
// sandbox was not found", "code": 502}; the SDKs read 502 as "gone".
func wantProxyNotFound(t *testing.T, what string, r e2eResponse, id string) {
	t.Helper()
	if r.status != http.StatusBadGateway {
		t.Fatalf("%s: got %s, want 502", what, r)
	}
	var got map[string]any
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatalf("%s: body %q is not JSON: %v", what, r.body, err)
	}
	want := map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": float64(502)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: body %s, want %v", what, r.body, want)
	}
}
