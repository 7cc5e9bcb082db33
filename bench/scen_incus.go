package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/incus"
)

// The Incus scenario: a raw `incus launch --ephemeral` of the image the
// Incus backend uses, against sandboxd's cold create on the Incus backend
// (a second sandboxd with --backend incus), interleaved, on the same image
// and storage pool. Both sides are network-less: the raw launch runs with
// --no-profiles (so no profile can add a NIC: the only device is the root
// disk -s gives it), and sandboxd's Incus backend creates instances with no
// profiles and refuses internet access, so its creates ask for none. No
// network is ever created or attached.
//
// Every instance the raw side launches is deleted (`incus delete -f`) right
// after it is measured, and again at the end, also after an error or a
// Ctrl-C; the sandboxd side's sandboxes are deleted through the API, and
// whatever of them is still in Incus at the end is deleted too.

const (
	incusImage = "sandboxd-base" // alias: scripts/incus-setup.sh
	incusPool  = "sandboxd"      // storage pool: scripts/incus-setup.sh
)

// incusAPI talks to incusd's REST API on its unix socket, for the checks
// and the "is it gone" polls (the raw side itself uses the incus CLI).
type incusAPI struct{ hc *http.Client }

func newIncusAPI() *incusAPI {
	return &incusAPI{hc: &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			Proxy: nil,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", incus.DefaultSocket)
			},
		},
	}}
}

// get GETs path and decodes the envelope's metadata into out (when not nil).
func (a *incusAPI) get(ctx context.Context, path string, out any) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://incus"+path, nil)
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || out == nil {
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	var env struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return resp.StatusCode, err
	}
	return resp.StatusCode, json.Unmarshal(env.Metadata, out)
}

type incusInstance struct {
	Name   string            `json:"name"`
	Status string            `json:"status"`
	Config map[string]string `json:"config"`
}

func (a *incusAPI) instances(ctx context.Context) ([]incusInstance, error) {
	var out []incusInstance
	code, err := a.get(ctx, "/1.0/instances?recursion=1", &out)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /1.0/instances: %d", code)
	}
	return out, err
}

// exists reports whether instance name exists (false on a 404).
func (a *incusAPI) exists(ctx context.Context, name string) (bool, error) {
	code, err := a.get(ctx, "/1.0/instances/"+name, nil)
	if err != nil {
		return true, err
	}
	return code != http.StatusNotFound, nil
}

// waitGone polls until instance name is gone, up to within.
func (a *incusAPI) waitGone(ctx context.Context, name string, within time.Duration) (time.Duration, error) {
	t0 := time.Now()
	for {
		ok, err := a.exists(ctx, name)
		if err == nil && !ok {
			return time.Since(t0), nil
		}
		if time.Since(t0) > within {
			return 0, fmt.Errorf("instance %s still there after %s", name, within)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// incusUnavailable says why the scenario cannot run here, or "".
func (b *Bench) incusUnavailable(ctx context.Context, a *incusAPI) string {
	if !b.flags["backend"] {
		return "this build's `sandboxd serve` has no --backend flag (the Incus backend)"
	}
	if _, err := exec.LookPath("incus"); err != nil {
		return "the incus CLI is not installed (scripts/incus-setup.sh)"
	}
	if code, err := a.get(ctx, "/1.0", nil); err != nil || code != http.StatusOK {
		return fmt.Sprintf("incusd does not answer on %s (scripts/incus-setup.sh)", incus.DefaultSocket)
	}
	if code, _ := a.get(ctx, "/1.0/images/aliases/"+incusImage, nil); code != http.StatusOK {
		return "image alias " + incusImage + " does not exist (scripts/incus-setup.sh)"
	}
	if code, _ := a.get(ctx, "/1.0/storage-pools/"+incusPool, nil); code != http.StatusOK {
		return "storage pool " + incusPool + " does not exist (scripts/incus-setup.sh)"
	}
	// A sandboxd without a namespace reconciles every namespace-less
	// sandboxd instance at start-up: those of another sandboxd would be
	// destroyed as orphans. Never do that to someone else's sandboxes.
	ins, err := a.instances(ctx)
	if err != nil {
		return "cannot list Incus instances: " + err.Error()
	}
	for _, in := range ins {
		if in.Config["user.sandboxd.id"] != "" && in.Config["user.sandboxd.namespace"] == "" {
			return fmt.Sprintf("another sandboxd's Incus sandbox (%s) is live; a second sandboxd on the Incus backend would reconcile it away at start-up", in.Name)
		}
	}
	return ""
}

// incusCLI runs the incus client in a process group of its own (a Ctrl-C
// reaches only the bench, which then finishes the step and cleans up),
// bounded by timeout but not by the run's ctx.
func incusCLI(ctx context.Context, timeout time.Duration, args ...string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "incus", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The client needs no proxy to reach its unix socket; never inherit one.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return strings.EqualFold(k, "http_proxy") || strings.EqualFold(k, "https_proxy")
	})
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return d, fmt.Errorf("incus %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return d, nil
}

func randHex(n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}

func incusScenario(ctx context.Context, b *Bench) error {
	a := newIncusAPI()
	if why := b.incusUnavailable(ctx, a); why != "" {
		b.add(
			unavailable("incus", "incus launch --ephemeral vs sandboxd cold create (same image)", why),
			unavailable("incus", "warm claim on the Incus backend", why),
		)
		return nil
	}

	tag := randHex(4)
	prefix := "sbxbench-" + tag + "-"

	// The raw side's instances: launched and not yet deleted.
	var mu sync.Mutex
	launched := map[string]bool{}
	var ids []string // the sandboxd side's sandbox ids, for the final check
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		mu.Lock()
		names := mapKeys(launched)
		mu.Unlock()
		// Also whatever a launch cut short by a timeout left behind.
		if ins, err := a.instances(cctx); err == nil {
			for _, in := range ins {
				if strings.HasPrefix(in.Name, prefix) && !slices.Contains(names, in.Name) {
					names = append(names, in.Name)
				}
			}
		}
		for _, name := range names {
			if _, err := incusCLI(cctx, time.Minute, "delete", "-f", "-q", name); err != nil {
				if ok, _ := a.exists(cctx, name); ok {
					fmt.Fprintf(os.Stderr, "bench: incus: could not delete %s: %v\n", name, err)
				}
			}
		}
	}()

	var sbdInstances []string // sandboxd instance names seen, for the final check
	startIncus := func(extra ...string) (*Harness, error) {
		return b.startIncusSide(ctx, append(noLimits(b.flags), extra...)...)
	}
	// stopIncus deletes the API's sandboxes and stops sandboxd (which drains
	// its pool and waits for Incus's background deletes); whatever of this
	// run is still in Incus then (a delete that failed) is deleted too.
	stopIncus := func(h *Harness) {
		if ins, err := a.instances(context.WithoutCancel(ctx)); err == nil {
			for _, in := range ins {
				// No namespace-less sandboxd instance was live at the start
				// (incusUnavailable), so these are this run's.
				if in.Config["user.sandboxd.id"] != "" && in.Config["user.sandboxd.namespace"] == "" {
					sbdInstances = append(sbdInstances, in.Name)
				}
			}
		}
		h.Close()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		mu.Lock()
		for _, id := range ids {
			sbdInstances = append(sbdInstances, incus.InstanceName("", id))
		}
		ids = nil
		mu.Unlock()
		slices.Sort(sbdInstances)
		for _, name := range slices.Compact(sbdInstances) {
			if ok, err := a.exists(cctx, name); err == nil && ok {
				if _, err := incusCLI(cctx, time.Minute, "delete", "-f", "-q", name); err != nil {
					fmt.Fprintf(os.Stderr, "bench: incus: could not delete %s: %v\n", name, err)
				}
			}
		}
		sbdInstances = nil
	}
	var cold []string
	if b.flags["pool"] {
		cold = append(cold, "--pool=false")
	}
	h, err := startIncus(cold...)
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			stopIncus(h)
		}
	}()

	raw := func(i int) (launch, del time.Duration, err error) {
		name := fmt.Sprintf("%s%d", prefix, i)
		mu.Lock()
		launched[name] = true
		mu.Unlock()
		launch, err = incusCLI(ctx, 2*time.Minute, "launch", incusImage, name, "--ephemeral", "-s", incusPool, "--no-profiles", "-q")
		if err != nil {
			return 0, 0, err
		}
		del, err = incusCLI(ctx, 2*time.Minute, "delete", "-f", "-q", name)
		if err != nil {
			return launch, 0, err
		}
		mu.Lock()
		delete(launched, name)
		mu.Unlock()
		return launch, del, nil
	}
	type sbdTimes struct{ create, health, destroy, gone time.Duration }
	viaSandboxd := func() (t sbdTimes, err error) {
		t0 := time.Now()
		sb, err := h.create(ctx, false)
		if err != nil {
			return t, err
		}
		t.create = time.Since(t0)
		mu.Lock()
		ids = append(ids, sb.ID)
		mu.Unlock()
		pt := h.proxyTarget(sb)
		err = pt.health(ctx)
		t.health = time.Since(t0)
		pt.close()
		t1 := time.Now()
		if derr := h.destroy(ctx, sb.ID); derr != nil {
			return t, errors.Join(err, derr)
		}
		t.destroy = time.Since(t1)
		// The backend deletes the instance in the background: wait for it,
		// so that the next measurement does not compete with the deletion.
		if _, gerr := a.waitGone(ctx, incus.InstanceName("", sb.ID), time.Minute); gerr != nil {
			return t, errors.Join(err, gerr)
		}
		t.gone = time.Since(t1)
		return t, err
	}

	// One of each, unmeasured: page cache, the image's first btrfs snapshot.
	if _, _, err := raw(-1); err != nil {
		return fmt.Errorf("warm-up raw launch: %w", err)
	}
	if _, err := viaSandboxd(); err != nil {
		return fmt.Errorf("warm-up sandboxd create on Incus: %w", err)
	}

	n := b.iters(1, 10, 10)
	var launches, dels, creates, healths, destroys, gones []time.Duration
	var pairRatio []float64
	rawErrs, sbdErrs := 0, 0
	b.loop(ctx, n, func(i int) {
		var l time.Duration
		var st sbdTimes
		okR, okS := false, false
		doRaw := func() {
			lt, dt, err := raw(i)
			if err != nil {
				rawErrs++
				b.logf("raw incus launch %d: %v", i, err)
				return
			}
			l, okR = lt, true
			launches, dels = append(launches, lt), append(dels, dt)
		}
		doSbd := func() {
			t, err := viaSandboxd()
			if err != nil {
				sbdErrs++
				b.logf("sandboxd create on Incus %d: %v", i, err)
				return
			}
			st, okS = t, true
			creates, healths = append(creates, t.create), append(healths, t.health)
			destroys, gones = append(destroys, t.destroy), append(gones, t.gone)
		}
		if i%2 == 0 { // alternate which side goes first
			doRaw()
			doSbd()
		} else {
			doSbd()
			doRaw()
		}
		if okR && okS {
			pairRatio = append(pairRatio, float64(st.create)/float64(l))
		}
	})

	rl := durDist("incus", "raw `incus launch sandboxd-base --ephemeral -s sandboxd --no-profiles` (CLI, no NIC)", launches, rawErrs)
	cr := durDist("incus", "sandboxd cold create → 201, Incus backend, same image (internet off)", creates, sbdErrs)
	if rl.P50 != nil && cr.P50 != nil {
		cr.Compare = fmt.Sprintf("p50 %.2f×, p99 %.2f× raw incus launch; paired median %.2f×",
			*cr.P50 / *rl.P50, *cr.P99 / *rl.P99, median(pairRatio))
	}
	cr.Goal = "≤ 1.1× raw incus launch"
	b.add(
		rl,
		cr,
		durDist("incus", "sandboxd cold create → first /health via proxy, Incus backend", healths, sbdErrs),
		durDist("incus", "raw `incus delete -f` (CLI)", dels, rawErrs),
		durDist("incus", "sandboxd destroy (DELETE → 204), Incus backend", destroys, sbdErrs),
		durDist("incus", "sandboxd destroy → instance gone from Incus", gones, sbdErrs),
	)
	stopIncus(h)
	stopped = true
	if ctx.Err() != nil {
		return nil
	}
	return incusWarm(ctx, b, a, startIncus, stopIncus, cr.P50)
}

// incusWarm: warm claims through POST /v2/sandboxes on the Incus backend,
// one at a time against a full pool of 2 (each claim waits for the refill
// of the one before, and for the claimed instance's deletion, so that it
// meets a full pool and no Incus operation in flight).
func incusWarm(ctx context.Context, b *Bench, a *incusAPI, start func(...string) (*Harness, error), stop func(*Harness), coldP50 *float64) error {
	const measure = "warm claim → 201 on the Incus backend (POST /v2/sandboxes, pool of 2, full)"
	if !b.flags["pool"] || !b.flags["min-warm"] {
		b.add(unavailable("incus", measure, "warm pools are not implemented in this build"))
		return nil
	}
	const size = 2
	extra := []string{"--pool=true", fmt.Sprintf("--min-warm=%d", size)}
	if b.flags["pool-lead"] {
		extra = append(extra, "--pool-lead=-1s") // fixed size
	}
	h, err := start(extra...)
	if err != nil {
		return err
	}
	defer stop(h)
	// The tenant's default pool (the seed) is internet-on, which the Incus
	// backend refuses: it never fills. The internet-off pool is born of the
	// first claim (a miss, served cold), and fills from then on.
	sb, err := h.create(ctx, false)
	if err != nil {
		return fmt.Errorf("priming create on Incus: %w", err)
	}
	if err := h.destroy(ctx, sb.ID); err == nil {
		_, _ = a.waitGone(ctx, incus.InstanceName("", sb.ID), time.Minute)
	}
	if got := h.poolReady(ctx, size, 2*time.Minute); got < size {
		return fmt.Errorf("Incus pool holds %d ready members after 2 min, want %d", got, size)
	}
	n := b.iters(1, 10, 10)
	var claim, healthy []time.Duration
	errs, waits := 0, 0
	h0, m0 := h.poolClaims(ctx)
	b.loop(ctx, n, func(int) {
		if h.poolReady(ctx, size, 30*time.Second) < size {
			waits++
		}
		t0 := time.Now()
		sb, err := h.create(ctx, false)
		tc := time.Since(t0)
		if err != nil {
			errs++
			b.logf("warm claim on Incus: %v", err)
			return
		}
		t := h.proxyTarget(sb)
		err = t.health(ctx)
		th := time.Since(t0)
		t.close()
		if derr := h.destroy(context.WithoutCancel(ctx), sb.ID); derr == nil {
			_, _ = a.waitGone(ctx, incus.InstanceName("", sb.ID), time.Minute)
		}
		if err != nil {
			errs++
			return
		}
		claim, healthy = append(claim, tc), append(healthy, th)
	})
	h1, m1 := h.poolClaims(ctx)
	c := durDist("incus", measure, claim, errs)
	c.Goal = "≤ 15 ms"
	c.Compare = fmt.Sprintf("%.0f hits, %.0f misses (pool metrics)", h1-h0, m1-m0)
	if coldP50 != nil && c.P50 != nil {
		c.Compare += fmt.Sprintf("; p50 %.0f× faster than cold create on Incus", *coldP50 / *c.P50)
	}
	if waits > 0 {
		c.Note = fmt.Sprintf("%d claims met a pool not yet refilled", waits)
	}
	b.add(c, durDist("incus", "warm claim → first /health via proxy, Incus backend", healthy, 0))
	return nil
}

// startIncusSide starts a sandboxd on the Incus backend, with its own run
// dir and data dir, and the serve flags args. Only one runs at
// a time: a second one's start-up reconcile would destroy the first one's
// sandboxes (same, empty, namespace).
func (b *Bench) startIncusSide(ctx context.Context, extra ...string) (*Harness, error) {
	h, err := newHarness(b.cfg.Root, b.cfg.BinDir)
	if err != nil {
		return nil, err
	}
	_ = os.Remove(h.runDir)
	if h.runDir, err = os.MkdirTemp("/run/sandboxd", "bench-incus-"); err != nil {
		h.runDir = ""
		h.Close()
		return nil, err
	}
	h.keepLogs = b.cfg.KeepLogs
	args := append([]string{"--backend", "incus"}, extra...)
	if err := h.startSandboxd(ctx, []string{"bench"}, args...); err != nil {
		h.Close()
		return nil, err
	}
	b.logf("sandboxd on the Incus backend on %s (run dir %s, %s)", h.addr, h.runDir, strings.Join(args, " "))
	return h, nil
}
