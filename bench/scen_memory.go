package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// rssScenario measures a standalone envd of its own: idle right after start,
// then idle again after a workload (Go keeps some of the heap it grew).
func rssScenario(ctx context.Context, b *Bench) error {
	e, err := b.h.startEnvd(ctx)
	if err != nil {
		return err
	}
	defer b.h.stopEnvd(e)
	settle := 2 * time.Second
	if b.cfg.Quick {
		settle = 200 * time.Millisecond
	}
	time.Sleep(settle)
	fresh, err := readProcMem(e.pid())
	if err != nil {
		return err
	}
	t := tcpTarget(e.addr)
	defer t.close()
	work := b.iters(1, 1, 5)
	for i := 0; i < work && ctx.Err() == nil; i++ {
		_, _ = t.shell(ctx, "true")
	}
	_, _, _ = concurrently(ctx, min(b.cfg.Procs, 50), func(ctx context.Context) error { _, err := t.shell(ctx, "true"); return err })
	_, _ = t.shell(ctx, `head -c 2097152 /dev/zero | tr '\0' x`)
	t.close()
	time.Sleep(settle)
	after, err := readProcMem(e.pid())
	if err != nil {
		return err
	}
	goal := "≤ 10 MiB idle RSS"
	r := value("rss", "standalone envd idle RSS, fresh", "MiB", fresh.RSS/mib, 1)
	r.Goal = goal
	r.Note = fmt.Sprintf("PSS %.1f MiB, anonymous PSS %.1f MiB, %d threads", fresh.PSS/mib, fresh.PSSAnon/mib, fresh.Threads)
	a := value("rss", fmt.Sprintf("standalone envd idle RSS after %d runs, %d concurrent, 2 MiB stdout", work, min(b.cfg.Procs, 50)), "MiB", after.RSS/mib, 1)
	a.Goal = goal
	a.Note = fmt.Sprintf("PSS %.1f MiB, anonymous PSS %.1f MiB, %d threads; measured %s after the load", after.PSS/mib, after.PSSAnon/mib, after.Threads, settle)
	b.add(r, a)
	return nil
}

// idleSet is a set of idle sandboxes and what they cost the host.
type idleSet struct {
	ids        []string
	avail      []float64 // MemAvailable after each create (bytes), index = sandboxes up
	create     []time.Duration
	createErrs int
	stopped    string // why filling stopped early, if it did
}

// fill creates up to n sandboxes with workers concurrent creates. It stops
// early when ctx ends, the time budget is spent, creates keep failing, or
// MemAvailable drops below a safety floor (the box is shared).
func (b *Bench) fill(ctx context.Context, n, workers int, internet bool, budget time.Duration) *idleSet {
	s := &idleSet{}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		next    atomic.Int64
		stop    atomic.Bool
		lastLog = time.Now()
	)
	deadline := time.Now().Add(budget)
	const memFloor = 4 << 30
	maxErrs := max(5, n/20)
	for range max(1, workers) {
		wg.Go(func() {
			for !stop.Load() && ctx.Err() == nil {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				if time.Now().After(deadline) {
					stop.Store(true)
					mu.Lock()
					s.stopped = fmt.Sprintf("time budget %s spent", budget)
					mu.Unlock()
					return
				}
				if i%10 == 0 && meminfo()["MemAvailable"] < memFloor {
					stop.Store(true)
					mu.Lock()
					s.stopped = "MemAvailable below 4 GiB"
					mu.Unlock()
					return
				}
				t0 := time.Now()
				sb, err := b.h.create(ctx, internet)
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					s.createErrs++
					if s.createErrs <= 3 {
						b.logf("create %d: %v", i, err)
					}
					if s.createErrs >= maxErrs {
						stop.Store(true)
						s.stopped = fmt.Sprintf("%d create errors", s.createErrs)
					}
				} else {
					s.ids = append(s.ids, sb.ID)
					s.create = append(s.create, d)
					s.avail = append(s.avail, float64(meminfo()["MemAvailable"]))
				}
				if time.Since(lastLog) > 10*time.Second {
					lastLog = time.Now()
					b.logf("%d/%d sandboxes up", len(s.ids), n)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil && s.stopped == "" {
		s.stopped = "interrupted"
	}
	return s
}

// hostCost is what a set of idle sandboxes costs, from the host's view and
// from their cgroups.
type hostCost struct {
	memAvailDelta float64 // bytes, per sandbox
	slabDelta     float64
	shmemDelta    float64
	sandboxdDelta float64 // sandboxd's RSS growth, per sandbox
	cgUsage       float64 // mean memory cgroup usage
	cgAnon        float64
	cgFile        float64
	cgKmem        float64
	envdRSS       float64 // mean over sandboxes of the sum over their processes
	envdPSS       float64
	tasks         float64 // mean threads per sandbox
	measured      int     // sandboxes whose cgroup could be read
	slope         float64 // least-squares MemAvailable drop per sandbox over the fill
}

// slope fits MemAvailable against the number of sandboxes up (least
// squares) and returns the drop per sandbox: less at the mercy of one
// reading than the difference of two, though not of a neighbour that grows
// steadily while the fill runs.
func slope(avail []float64) float64 {
	n := float64(len(avail))
	if n < 3 {
		return math.NaN()
	}
	var sx, sy, sxx, sxy float64
	for i, y := range avail {
		x := float64(i + 1)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	return -(n*sxy - sx*sy) / (n*sxx - sx*sx)
}

type hostSnap struct {
	memAvail, slab, shmem, sandboxdRSS float64
}

func (b *Bench) snap(quick bool) hostSnap {
	n, gap := 5, 300*time.Millisecond
	if quick {
		n, gap = 2, 50*time.Millisecond
	}
	var s hostSnap
	s.memAvail = memAvailable(n, gap)
	mi := meminfo()
	s.slab, s.shmem = float64(mi["Slab"]), float64(mi["Shmem"])
	if m, err := readProcMem(b.h.sandboxd.Process.Pid); err == nil {
		s.sandboxdRSS = m.RSS
	}
	return s
}

func (b *Bench) cost(before, after hostSnap, set *idleSet) hostCost {
	var c hostCost
	ids := set.ids
	c.slope = slope(set.avail)
	n := float64(len(ids))
	if n == 0 {
		return c
	}
	c.memAvailDelta = (before.memAvail - after.memAvail) / n
	c.slabDelta = (after.slab - before.slab) / n
	c.shmemDelta = (after.shmem - before.shmem) / n
	c.sandboxdDelta = (after.sandboxdRSS - before.sandboxdRSS) / n
	for _, id := range ids {
		m, err := readCgroupMem(id)
		if err != nil {
			continue
		}
		c.measured++
		c.cgUsage += m.Usage
		c.cgAnon += m.Anon
		c.cgFile += m.File
		c.cgKmem += m.Kmem
		for _, pid := range m.Pids {
			if pm, err := readProcMem(pid); err == nil {
				c.envdRSS += pm.RSS
				c.envdPSS += pm.PSS
				c.tasks += float64(pm.Threads)
			}
		}
	}
	if c.measured > 0 {
		k := float64(c.measured)
		c.cgUsage, c.cgAnon, c.cgFile, c.cgKmem = c.cgUsage/k, c.cgAnon/k, c.cgFile/k, c.cgKmem/k
		c.envdRSS, c.envdPSS, c.tasks = c.envdRSS/k, c.envdPSS/k, c.tasks/k
	}
	return c
}

func (c hostCost) rows(scenario, label string, n int) []Row {
	if n == 0 {
		return []Row{unavailable(scenario, "host memory per idle sandbox, "+label, "no sandbox could be created")}
	}
	host := value(scenario, "host memory per idle sandbox (MemAvailable drop / N), "+label, "MiB", c.memAvailDelta/mib, n)
	host.Goal = "≤ 5 MiB per idle sandbox"
	host.Note = fmt.Sprintf("least-squares slope over the fill %s MiB/sandbox; Slab %+.2f, Shmem %+.2f, sandboxd RSS %+.2f MiB per sandbox; other work on this box moves MemAvailable too",
		fmtNum(c.slope/mib), c.slabDelta/mib, c.shmemDelta/mib, c.sandboxdDelta/mib)
	cg := value(scenario, "memory cgroup usage per idle sandbox, "+label, "MiB", c.cgUsage/mib, c.measured)
	cg.Note = fmt.Sprintf("anon %.2f MiB, page cache/tmpfs %.2f MiB, kernel %.2f MiB (cgroup v1 kmem)", c.cgAnon/mib, c.cgFile/mib, c.cgKmem/mib)
	envd := value(scenario, "envd per sandbox: PSS, "+label, "MiB", c.envdPSS/mib, c.measured)
	envd.Note = fmt.Sprintf("RSS %.2f MiB (counts the shared envd text in full), %.1f host tasks (threads) per sandbox", c.envdRSS/mib, c.tasks)
	if c.measured == 0 {
		why := "the sandboxes' memory cgroups were not found under /sys/fs/cgroup"
		return []Row{host, unavailable(scenario, "memory cgroup usage per idle sandbox, "+label, why),
			unavailable(scenario, "envd per sandbox: PSS, "+label, why)}
	}
	return []Row{host, cg, envd}
}

// memoryScenario: cfg.MemoryN idle sandboxes with internet on (the SDK
// default: a veth pair each) and then with internet off.
func memoryScenario(ctx context.Context, b *Bench) error {
	n := b.cfg.MemoryN
	settle := 3 * time.Second
	if b.cfg.Quick {
		settle = 200 * time.Millisecond
	}
	for _, v := range []struct {
		label    string
		internet bool
	}{{"internet on (SDK default)", true}, {"internet off", false}} {
		if ctx.Err() != nil {
			break
		}
		time.Sleep(settle)
		before := b.snap(b.cfg.Quick)
		set := b.fill(ctx, n, 1, v.internet, b.cfg.Budget)
		time.Sleep(settle)
		after := b.snap(b.cfg.Quick)
		c := b.cost(before, after, set)
		b.logf("%s: %d sandboxes, %.2f MiB each (MemAvailable), %.2f MiB cgroup", v.label, len(set.ids), c.memAvailDelta/mib, c.cgUsage/mib)
		b.add(c.rows("memory", v.label, len(set.ids))...)
		if set.stopped != "" {
			b.rows[len(b.rows)-3].Note += "; stopped early: " + set.stopped
		}
		_, derrs := b.h.destroyAll(context.WithoutCancel(ctx), set.ids, 2)
		if derrs > 0 || set.createErrs > 0 {
			b.logf("%d create errors, %d destroy errors", set.createErrs, derrs)
		}
	}
	return nil
}

// densityScenario holds cfg.Density idle sandboxes at once, checks that
// every one answers through the proxy, runs commands on a sample of them,
// and measures what they cost and how creates and destroys slow down.
func densityScenario(ctx context.Context, b *Bench) error {
	n := b.cfg.Density
	settle := 3 * time.Second
	if b.cfg.Quick {
		settle = 200 * time.Millisecond
	}
	time.Sleep(settle)
	before := b.snap(b.cfg.Quick)
	t0 := time.Now()
	set := b.fill(ctx, n, b.cfg.DensityWorkers, true, 4*b.cfg.Budget)
	fillWall := time.Since(t0)
	up := len(set.ids)
	b.logf("%d/%d sandboxes up in %.1f s", up, n, fillWall.Seconds())

	// Every one healthy through the proxy?
	var healthy atomic.Int64
	var wg sync.WaitGroup
	ch := make(chan string)
	for i := 0; i < 8; i++ {
		wg.Go(func() {
			for id := range ch {
				t := b.h.proxyTarget(&Sandbox{ID: id})
				if t.health(ctx) == nil {
					healthy.Add(1)
				}
				t.close()
			}
		})
	}
	for _, id := range set.ids {
		ch <- id
	}
	close(ch)
	wg.Wait()

	// Commands on a sample, while all of them idle. The token comes from a
	// fresh sandbox: the density ones' tokens are not kept.
	var execs []time.Duration
	execErrs := 0
	if up > 0 && ctx.Err() == nil {
		sb, err := b.h.create(ctx, true)
		if err == nil {
			t := b.h.proxyTarget(sb)
			for i := 0; i < b.iters(1, 2, 5) && ctx.Err() == nil; i++ {
				t1 := time.Now()
				if _, err := t.shell(ctx, "true"); err != nil {
					execErrs++
				} else {
					execs = append(execs, time.Since(t1))
				}
			}
			t.close()
			_ = b.h.destroy(context.WithoutCancel(ctx), sb.ID)
		}
	}
	hold := 20 * time.Second // four passes at the default interval
	if b.cfg.Quick {
		hold = 2 * time.Second
	}
	idle := b.idleCost(ctx, up, hold)
	time.Sleep(settle)
	after := b.snap(b.cfg.Quick)
	c := b.cost(before, after, set)
	tasks := 0
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		// field 4 is running/total tasks
		var a, bb, cc float64
		var run, total int
		fmt.Sscanf(string(raw), "%f %f %f %d/%d", &a, &bb, &cc, &run, &total)
		tasks = total
	}

	all := value("density", fmt.Sprintf("idle sandboxes held at once (asked %d)", n), "count", float64(up), up)
	all.Goal = "500 all healthy, then → 1,000"
	all.Note = fmt.Sprintf("%d healthy via proxy; filled in %.1f s with %d concurrent creates; %d create errors; host tasks at peak %d (pid_max %s)",
		healthy.Load(), fillWall.Seconds(), b.cfg.DensityWorkers, set.createErrs, tasks, readTrim("/proc/sys/kernel/pid_max"))
	if set.stopped != "" {
		all.Note += "; stopped early: " + set.stopped
	}
	b.add(all)
	k := max(1, up/10)
	if up > 0 {
		b.add(durDist("density", "cold create, first 10% of the fill", set.create[:k], 0))
		last := durDist("density", "cold create, last 10% of the fill", set.create[up-k:], 0)
		b.add(last)
	}
	ex := durDist("density", fmt.Sprintf("commands.run('true') via proxy with %d idle sandboxes", up), execs, execErrs)
	b.add(ex, idle)
	b.add(c.rows("density", strconv.Itoa(up)+" idle", up)...)

	t1 := time.Now()
	dt, derrs := b.h.destroyAll(context.WithoutCancel(ctx), set.ids, b.cfg.DensityWorkers)
	d := durDist("density", fmt.Sprintf("destroy, %d at a time", b.cfg.DensityWorkers), dt, derrs)
	d.Compare = fmt.Sprintf("all %d gone in %.1f s", len(dt), time.Since(t1).Seconds())
	b.add(d)
	return nil
}

// idleCost is sandboxd's own CPU while the n sandboxes of the density
// scenario idle, over hold, in % of one CPU, with its metrics passes (which
// sample every running sandbox each --metrics-interval) in that time: what
// sandboxd spends on sandboxes nobody uses.
func (b *Bench) idleCost(ctx context.Context, n int, hold time.Duration) Row {
	measure := fmt.Sprintf("sandboxd's CPU while %d sandboxes idle", n)
	pid := b.h.sandboxd.Process.Pid
	sum0, count0, err := b.metricsPasses(ctx)
	if err != nil {
		return unavailable("density", measure, err.Error())
	}
	cpu0 := cpuTime(pid)
	select {
	case <-ctx.Done():
		return unavailable("density", measure, "interrupted")
	case <-time.After(hold):
	}
	cpu1 := cpuTime(pid)
	sum1, count1, err := b.metricsPasses(ctx)
	if err != nil {
		return unavailable("density", measure, err.Error())
	}
	r := value("density", measure, "% of a CPU", 100*float64(cpu1-cpu0)/float64(hold), n)
	r.Note = fmt.Sprintf("over %v; %d metrics passes ended in it", hold, int(count1-count0))
	if count1 > count0 {
		r.Note += fmt.Sprintf(", %.2f s each", (sum1-sum0)/(count1-count0))
	}
	return r
}

// metricsPasses reads the sum and count of sandboxd's metrics pass
// histogram (sandboxd_sandbox_metrics_pass_seconds) from its /metrics.
func (b *Bench) metricsPasses(ctx context.Context) (sum, count float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.h.addr+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := b.h.api.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	found := 0
	for line := range strings.SplitSeq(string(body), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		switch name {
		case "sandboxd_sandbox_metrics_pass_seconds_sum":
			sum, err = strconv.ParseFloat(v, 64)
			found++
		case "sandboxd_sandbox_metrics_pass_seconds_count":
			count, err = strconv.ParseFloat(v, 64)
			found++
		}
		if err != nil {
			return 0, 0, fmt.Errorf("sandboxd's /metrics: %s: %w", name, err)
		}
	}
	if found != 2 {
		return 0, 0, errors.New("sandboxd's /metrics has no metrics pass histogram")
	}
	return sum, count, nil
}
