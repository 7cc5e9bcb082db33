package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Warm pools and rate limits are measured only when this build's
// `sandboxd serve` has their flags; otherwise their rows say "not
// available". Each of these scenarios runs a sandboxd of its own, so that
// the cold scenarios never meet a pool or a limiter.

// metricSum scrapes h's /metrics and sums the samples of name whose labels
// include all of want. ok is false when /metrics cannot be read.
func (h *Harness) metricSum(ctx context.Context, name string, want map[string]string) (sum float64, ok bool) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.addr+"/metrics", nil)
	resp, err := h.api.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) || strings.HasPrefix(l, "#") {
			continue
		}
		series, val, found := strings.Cut(l, " ")
		if !found {
			continue
		}
		metric, labels, _ := strings.Cut(series, "{")
		if metric != name {
			continue
		}
		match := true
		for k, v := range want {
			if !strings.Contains(labels, k+`="`+v+`"`) {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		if f, err := strconv.ParseFloat(strings.Fields(val)[0], 64); err == nil {
			sum += f
		}
	}
	return sum, true
}

// poolReady waits until h's pools hold at least want ready members, or
// within passes; it returns how many are ready.
func (h *Harness) poolReady(ctx context.Context, want int, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		n, _ := h.metricSum(ctx, "sandboxd_pool_members", map[string]string{"state": "ready"})
		// No member of any pool (the spare pools' too) still starting: a
		// claim measured then shares the CPUs with no refill.
		starting, _ := h.metricSum(ctx, "sandboxd_pool_members", map[string]string{"state": "starting"})
		spares, _ := h.metricSum(ctx, "sandboxd_spare_members", map[string]string{"state": "starting"})
		if (int(n) >= want && starting+spares == 0) || time.Now().After(deadline) || ctx.Err() != nil {
			return int(n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *Harness) poolClaims(ctx context.Context) (hits, misses float64) {
	hits, _ = h.metricSum(ctx, "sandboxd_pool_claims_total", map[string]string{"result": "hit"})
	misses, _ = h.metricSum(ctx, "sandboxd_pool_claims_total", map[string]string{"result": "miss"})
	return hits, misses
}

// startPool starts a second sandboxd with a full warm pool of size for
// the bench tenant (fixed size where the build can say so), plus extra
// serve flags.
func (b *Bench) startPool(ctx context.Context, size int, extra ...string) (*Harness, error) {
	args := append(noLimits(b.flags), "--pool=true", fmt.Sprintf("--min-warm=%d", size))
	if b.flags["pool-lead"] {
		args = append(args, "--pool-lead=-1s") // fixed size: no adaptive growth during the measurement
	}
	h, err := b.startSide(ctx, []string{"bench"}, append(args, extra...)...)
	if err != nil {
		return nil, err
	}
	if got := h.poolReady(ctx, size, 60*time.Second); got < size {
		h.Close()
		return nil, fmt.Errorf("pool holds %d ready members after 60s, want %d", got, size)
	}
	return h, nil
}

// startSide starts a second sandboxd for one scenario; the caller closes it.
func (b *Bench) startSide(ctx context.Context, tenants []string, extra ...string) (*Harness, error) {
	h, err := newHarness(b.cfg.Root, b.cfg.BinDir)
	if err != nil {
		return nil, err
	}
	h.keepLogs = b.cfg.KeepLogs
	if err := h.startSandboxd(ctx, tenants, extra...); err != nil {
		h.Close()
		return nil, err
	}
	b.logf("second sandboxd on %s with %s", h.addr, strings.Join(extra, " "))
	return h, nil
}

// coldP50 finds this run's cold create p50 (internet on), if measured.
func (b *Bench) coldP50() *float64 {
	for _, r := range b.rows {
		if r.Scenario == "create" && strings.HasPrefix(r.Measure, "cold create → 201, internet on") {
			return r.P50
		}
	}
	return nil
}

// warmScenario: claims from a warm pool through POST /v2/sandboxes, one at
// a time against a full pool (each claim waits for the refill of the one
// before, so that it meets a full pool and no refill in flight); the SDKs'
// Sandbox.create() against the same pool; and a burst of concurrent creates
// against a pool of fixed size (200 against 50).
func warmScenario(ctx context.Context, b *Bench) error {
	if !b.flags["pool"] || !b.flags["min-warm"] {
		why := "warm pools are not implemented in this build"
		b.add(
			unavailable("warm", "warm claim through POST /v2/sandboxes with a pool", why),
			unavailable("warm", "SDK-observed Sandbox.create() from a pool", why),
			unavailable("warm", "200 concurrent creates against a pool of 50", why),
		)
		return nil
	}
	const size = 5
	h, err := b.startPool(ctx, size)
	if err != nil {
		return err
	}
	defer h.Close()

	n := b.iters(1, 2, 20)
	var claim, healthy []time.Duration
	errs, waits := 0, 0
	h0, m0 := h.poolClaims(ctx)
	b.loop(ctx, n, func(int) {
		if h.poolReady(ctx, size, 10*time.Second) < size {
			waits++
		}
		t0 := time.Now()
		sb, err := h.create(ctx, true)
		tc := time.Since(t0)
		if err != nil {
			errs++
			b.logf("warm claim: %v", err)
			return
		}
		t := h.proxyTarget(sb)
		err = t.health(ctx)
		th := time.Since(t0)
		t.close()
		_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
		if err != nil {
			errs++
			return
		}
		claim, healthy = append(claim, tc), append(healthy, th)
	})
	h1, m1 := h.poolClaims(ctx)
	// Before the SDKs run against the same sandboxd: every 201 to a
	// create so far is one of the loop's claims.
	server := h.serverDurations(http.MethodPost, "/sandboxes", http.StatusCreated)
	c := durDist("warm", fmt.Sprintf("warm claim → 201 (POST /v2/sandboxes, pool of %d, full)", size), claim, errs)
	c.Goal = "≤ 15 ms"
	c.Compare = fmt.Sprintf("%.0f hits, %.0f misses (pool metrics)", h1-h0, m1-m0)
	if cold := b.coldP50(); cold != nil && c.P50 != nil {
		c.Compare += fmt.Sprintf("; p50 %.1f× faster than this run's cold create", *cold / *c.P50)
	}
	if waits > 0 {
		c.Note = fmt.Sprintf("%d claims met a pool not yet refilled", waits)
	}
	sc := durDist("warm", "warm claim, server side (the access log's duration of each 201)", server, 0)
	sc.Goal = "≤ 1 ms p50, ≤ 5 ms p99 (issue 24)"
	b.add(c, sc, durDist("warm", "warm claim → first /health via proxy", healthy, 0))

	// The SDKs against the same pool: their creates come one after
	// another, so the refill races the next create.
	if ctx.Err() == nil {
		h.poolReady(ctx, size, 10*time.Second)
		sh0, sm0 := h.poolClaims(ctx)
		iters, runs := b.iters(1, 5, 10), 3
		if b.cfg.Quick {
			iters, runs = 2, 1
		}
		if err := b.runSDKs(ctx, h, "warm", "pool: ", iters, runs, ""); err != nil {
			return err
		}
		sh1, sm1 := h.poolClaims(ctx)
		for i := range b.rows {
			if r := &b.rows[i]; r.Scenario == "warm" && strings.HasSuffix(r.Measure, ": Sandbox.create()") && r.Compare == "" {
				r.Goal = "≤ 15 ms warm"
				r.Compare = fmt.Sprintf("the SDKs' creates together: %.0f hits, %.0f misses", sh1-sh0, sm1-sm0)
			}
		}
	}
	h.Close()
	if ctx.Err() != nil {
		return nil
	}
	return warmBurst(ctx, b)
}

// coldVariants are the cold-create admission settings a scenario compares
// in one run: unbounded (every miss starts its backend create at once, as
// builds before --cold-parallel did) against the build's default bound. A
// build without the flag has only its own behaviour.
func coldVariants(flags map[string]bool) []struct{ name, flag string } {
	if !flags["cold-parallel"] {
		return []struct{ name, flag string }{{"", ""}}
	}
	return []struct{ name, flag string }{
		{"cold creates unbounded", "--cold-parallel=-1"},
		{"cold creates bounded (default)", ""},
	}
}

func withVariant(measure, variant string) string {
	if variant == "" {
		return measure
	}
	return measure + " — " + variant
}

// tally says where the creates of ids were served from, as "cold 3, spare 97".
func tally(served map[string]string, ids []string) string {
	n := map[string]int{}
	for _, id := range ids {
		from := served[id]
		if from == "" {
			from = "unknown"
		}
		n[from]++
	}
	keys := slices.Sorted(maps.Keys(n))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

// servedFrom reads sandboxd's audit lines: sandbox id -> "pool" (claimed
// at once), "refill" (a miss that waited and got a refill) or "cold", for
// every successful create so far.
func (h *Harness) servedFrom() map[string]string {
	out := map[string]string{}
	h.eachLogLine(func(line []byte) {
		var l struct {
			Action     string `json:"action"`
			Result     string `json:"result"`
			ID         string `json:"sandbox_id"`
			ServedFrom string `json:"served_from"`
			WaitedMS   int64  `json:"waited_ms"`
		}
		if json.Unmarshal(line, &l) == nil && l.Action == "create" && l.Result == "ok" && l.ServedFrom != "" {
			if l.ServedFrom == "pool" && l.WaitedMS > 0 {
				l.ServedFrom = "refill"
			}
			out[l.ID] = l.ServedFrom
		}
	})
	return out
}

// serverDurations reads sandboxd's access log: how long the handlers took
// for every request so far of method to a path ending in suffix that got
// status (from the router's entry to the handler's return: no network, no
// request parsing).
func (h *Harness) serverDurations(method, suffix string, status int) []time.Duration {
	var out []time.Duration
	h.eachLogLine(func(line []byte) {
		var l struct {
			Msg        string  `json:"msg"`
			Method     string  `json:"method"`
			Path       string  `json:"path"`
			Status     int     `json:"status"`
			DurationMS float64 `json:"duration_ms"`
		}
		if json.Unmarshal(line, &l) == nil && l.Msg == "http request" && l.Method == method &&
			strings.HasSuffix(l.Path, suffix) && l.Status == status {
			out = append(out, time.Duration(l.DurationMS*float64(time.Millisecond)))
		}
	})
	return out
}

// eachLogLine calls fn with every line sandboxd has logged so far (all its
// starts).
func (h *Harness) eachLogLine(fn func(line []byte)) {
	logs, _ := filepath.Glob(filepath.Join(h.workDir, "sandboxd.*.log"))
	for _, p := range logs {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fn(sc.Bytes())
		}
		f.Close()
	}
}

// warmBurst fires cfg.Burst*4 concurrent creates (200 by default) at a
// pool of cfg.Burst (50), once per cold-create admission variant.
func warmBurst(ctx context.Context, b *Bench) error {
	for _, v := range coldVariants(b.flags) {
		if err := warmBurstOnce(ctx, b, v.name, v.flag); err != nil || ctx.Err() != nil {
			return err
		}
	}
	return nil
}

func warmBurstOnce(ctx context.Context, b *Bench, variant, flag string) error {
	size, fire := b.cfg.Burst, 4*b.cfg.Burst
	extra := append(noLimits(b.flags), "--pool=true", fmt.Sprintf("--min-warm=%d", size))
	if b.flags["pool-lead"] {
		extra = append(extra, "--pool-lead=-1s")
	}
	if b.flags["pool-max"] {
		extra = append(extra, fmt.Sprintf("--pool-max=%d", max(size, 64)))
	}
	if flag != "" {
		extra = append(extra, flag)
	}
	h, err := b.startSide(ctx, []string{"bench"}, extra...)
	if err != nil {
		return err
	}
	defer h.Close()
	if got := h.poolReady(ctx, size, 3*time.Minute); got < size {
		return fmt.Errorf("pool holds %d ready members after 3 min, want %d", got, size)
	}
	h0, m0 := h.poolClaims(ctx)
	var (
		mu   sync.Mutex
		took = map[string]time.Duration{}
	)
	each, wall, errs := concurrently(ctx, fire, func(ctx context.Context) error {
		t0 := time.Now()
		sb, err := h.create(ctx, true)
		if err == nil {
			mu.Lock()
			took[sb.ID] = time.Since(t0)
			mu.Unlock()
		} else {
			b.logf("burst create: %v", err)
		}
		return err
	})
	h1, m1 := h.poolClaims(ctx)
	r := durDist("warm", withVariant(fmt.Sprintf("%d concurrent creates against a pool of %d, each", fire, size), variant), each, errs)
	r.Goal = "0 errors, p99 ≤ 500 ms"
	r.Compare = fmt.Sprintf("%.0f hits, %.0f misses at claim time; all done in %.0f ms", h1-h0, m1-m0, float64(wall)/float64(time.Millisecond))
	b.add(r)
	// Split by where sandboxd says each came from: a miss that waited and
	// got a refill counts as pool.
	if from := h.servedFrom(); len(from) > 0 {
		var pool, refill, cold []time.Duration
		for id, d := range took {
			switch from[id] {
			case "pool":
				pool = append(pool, d)
			case "refill":
				refill = append(refill, d)
			case "cold":
				cold = append(cold, d)
			}
		}
		rp := durDist("warm", withVariant("  … of which pool hits (a ready member at once)", variant), pool, 0)
		rp.Goal = "milliseconds"
		b.add(rp)
		if len(refill) > 0 {
			b.add(durDist("warm", withVariant("  … of which misses that waited and got a refill", variant), refill, 0))
		}
		b.add(durDist("warm", withVariant("  … of which served cold", variant), cold, 0))
	}
	ids := make([]string, 0, len(took))
	for id := range took {
		ids = append(ids, id)
	}
	h.destroyAll(context.WithoutCancel(ctx), ids, 4)
	return nil
}

// fairnessScenario: tenant B creates one sandbox at a time, alone and
// while tenant A floods creates from many clients, in alternating rounds,
// with the build's default per-tenant limits on: first with the warm pools
// off, so that both sides create cold (what the kernel and sandboxd's
// create share between tenants), then with the pools at their defaults
// (what a user meets: B's creates served from the spare pool while it has
// members). -fairness-pools runs the latter only.
func fairnessScenario(ctx context.Context, b *Bench) error {
	if !b.flags["create-rate"] {
		b.add(unavailable("fairness", "tenant B's create latency while tenant A floods, vs B alone",
			"per-tenant rate limits are not implemented in this build"))
		return nil
	}
	// With the build's default rate limits, A's flood is held to a few
	// creates a second and B competes only with those. Without rate
	// limits, A's 8 clients keep 8 creates going, and only cold-create
	// admission stands between A and the CPUs B needs.
	if !b.cfg.FairPools {
		for _, limited := range []bool{true, false} {
			for _, v := range coldVariants(b.flags) {
				if err := fairnessOnce(ctx, b, v.name, v.flag, limited, false); err != nil || ctx.Err() != nil {
					return err
				}
			}
		}
	}
	if !b.flags["pool"] {
		return nil
	}
	return fairnessOnce(ctx, b, "", "", true, true)
}

// fairnessOnce measures B alone and flooded on a sandboxd of its own; pools
// keeps its warm pools at their defaults, else they are off.
func fairnessOnce(ctx context.Context, b *Bench, variant, flag string, limited, pools bool) error {
	// The bench's destroys keep pace with the flood: a destroy refused by
	// the lifecycle limit would leave a sandbox (and its egress address)
	// behind for the next sandboxd of the run.
	extra := []string{"--lifecycle-rate=0"}
	if b.flags["pool"] && !pools {
		extra = append(extra, "--pool=false") // cold creates on both sides
	}
	if flag != "" {
		extra = append(extra, flag)
	}
	extra = append(extra, strings.Fields(b.cfg.FairServeArgs)...)
	floodPhrase, limits := "tenant A floods (8 clients)", "limits are the build's defaults"
	if !limited {
		extra = append(extra, "--create-rate=0")
		floodPhrase, limits = "tenant A floods (8 clients) with no create rate limit", "no create rate limit"
	}
	if b.cfg.FairSplit {
		floodPhrase += ", on a second sandboxd at nice 19"
	}
	if b.cfg.FairClientsProc {
		floodPhrase += ", its clients in a process at nice 19"
	}
	h, err := b.startSide(ctx, []string{"b", "a"}, extra...)
	if err != nil {
		return err
	}
	defer h.Close()
	keyA, keyB := h.keys["a"], h.keys["b"]
	hA := h
	if b.cfg.FairSplit {
		hA, err = newHarness(b.cfg.Root, b.cfg.BinDir)
		if err != nil {
			return err
		}
		hA.nice = 19
		if err := hA.startSandboxd(ctx, []string{"a"}, append(extra, "--egress-subnet=10.136.0.0/16")...); err != nil {
			hA.Close()
			return err
		}
		defer hA.Close()
		keyA = hA.keys["a"]
	}
	// B's alone and flooded samples alternate in rounds, so that both
	// sides span the same minutes of a shared box: its other tenants'
	// load drifts by more than the effect measured. 100 a side by default,
	// so p99 is not the one slowest sample of a side.
	n := b.iters(1, 1, 10)
	rounds := 4
	if b.cfg.Quick {
		rounds = 1
	}
	gap := 250 * time.Millisecond // B is a modest user: 4 creates/s at most
	if b.cfg.Quick {
		gap = 50 * time.Millisecond
	}

	// Each of B's sandboxes then runs one command through the proxy, as
	// an SDK user's first commands.run: the create's answer may leave
	// work to the first request (a claimed member's envd /init follows
	// the answer), and B's wait for a sandbox that ran something is the sum.
	type bSide struct {
		took, first []time.Duration
		errs        int
		ids         []string
	}
	runB := func(count int, side *bSide) {
		b.loop(ctx, count, func(int) {
			t0 := time.Now()
			sb, err := h.createAs(ctx, keyB, true)
			d := time.Since(t0)
			if err != nil {
				side.errs++
				b.logf("tenant b: %v", err)
				time.Sleep(gap)
				return
			}
			side.took = append(side.took, d)
			side.ids = append(side.ids, sb.ID)
			tgt := h.proxyTarget(sb)
			if _, err := tgt.run(ctx, "/bin/true"); err != nil {
				side.errs++
				b.logf("tenant b: first command: %v", err)
			} else {
				side.first = append(side.first, time.Since(t0))
			}
			tgt.close()
			_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
			time.Sleep(gap)
		})
	}

	// A floods: 8 clients creating as fast as they are let, each backing
	// off 50 ms after a 429, for the flooded part of each round and within
	// a request count.
	var (
		okA, limitedA  atomic.Int64
		otherA, reqA   atomic.Int64
		alone, flooded bSide
		floodFor       time.Duration
	)
	const maxRequests = 20000
	flood := func(blockN int) {
		t0 := time.Now()
		left := maxRequests - reqA.Load()
		var finish func() (floodCounts, error)
		if b.cfg.FairClientsProc {
			var err error
			if finish, err = floodProcess(hA, keyA, 8, left, 19); err != nil {
				b.logf("tenant a: %v", err)
				return
			}
		} else {
			stop := make(chan struct{})
			done := make(chan floodCounts, 1)
			go func() { done <- floodClients(ctx, hA, keyA, 8, left, stop) }()
			finish = func() (floodCounts, error) { close(stop); return <-done, nil }
		}
		time.Sleep(time.Second) // let A use up its burst first
		runB(blockN, &flooded)
		c, err := finish()
		if err != nil {
			b.logf("tenant a: %v", err)
		}
		okA.Add(c.OK)
		limitedA.Add(c.Limited)
		otherA.Add(c.Other)
		reqA.Add(c.Requests)
		floodFor += time.Since(t0)
	}
	for r := range rounds {
		blockN := n / rounds
		if r < n%rounds {
			blockN++
		}
		runB(blockN, &alone)
		flood(blockN)
		// The flood's last destroys are still being torn down in the
		// kernel: B's next alone block waits for a quiet box.
		time.Sleep(500 * time.Millisecond)
	}
	createPhrase := "tenant B cold create"
	if pools {
		createPhrase = "tenant B create, warm pools at their defaults"
	}
	alonePhrase := createPhrase + ", alone"
	if !limited {
		alonePhrase += " (no create rate limit)"
	}
	a := durDist("fairness", withVariant(alonePhrase, variant), alone.took, alone.errs)
	f := durDist("fairness", withVariant(createPhrase+" while "+floodPhrase, variant), flooded.took, flooded.errs)
	a1 := durDist("fairness", withVariant("  … create → first command (/bin/true through the proxy), alone", variant), alone.first, alone.errs)
	f1 := durDist("fairness", withVariant("  … create → first command while "+floodPhrase, variant), flooded.first, flooded.errs)
	if pools {
		served := h.servedFrom()
		a.Note = "B's creates served from: " + tally(served, alone.ids)
		f.Note = "B's creates served from: " + tally(served, flooded.ids) + "; "
	}
	for _, r := range [][2]*Row{{&a, &f}, {&a1, &f1}} {
		if r[0].P50 != nil && r[1].P50 != nil {
			r[1].Compare = fmt.Sprintf("p50 %.1f×, p99 %.1f× B alone", *r[1].P50 / *r[0].P50, *r[1].P99 / *r[0].P99)
		}
	}
	f.Goal = "p99 ≤ 1.5× B alone (issue 24)"
	f.Note += "B's errors include any 429 and failed first commands: B must never be limited by A's flood"
	rate := float64(okA.Load()) / floodFor.Seconds()
	measure := "tenant A's creates let through during the flood"
	if !limited {
		measure = "tenant A's creates during the flood with no create rate limit"
	}
	fl := value("fairness", withVariant(measure, variant), "creates/s", rate, int(okA.Load()))
	fl.Note = fmt.Sprintf("%d created, %d refused with 429, %d other errors, over %.1f s; %s", okA.Load(), limitedA.Load(), otherA.Load(), floodFor.Seconds(), limits)
	b.add(a, f, a1, f1, fl)
	return nil
}
