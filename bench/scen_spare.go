package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/procstat"
)

// spareScenario measures issue 24's rows against sandboxes with the
// build's default settings (no per-tenant create rate, the default spare
// pool), each on a fresh sandboxd: a lone tenant's bursts, create → first
// command right after a burst, a burst against a spare pool of 50, and
// the lone tenant's burst and the loop after a burst through each SDK.
func spareScenario(ctx context.Context, b *Bench) error {
	if !b.flags["spare-min"] {
		b.add(unavailable("spare", "issue 24's bursts with the default settings", "this build has no spare pool"))
		return nil
	}
	for _, c := range []struct {
		fire  int
		extra []string
		spare int // ready spare members to wait for before the burst; 0: the default floor
		goal  string
		label string
	}{
		{100, nil, 0, "0 × 429, p99 ≤ 1 s", "one tenant, 100 concurrent creates, default settings"},
		{50, nil, 0, "p99 ≤ 100 ms", "50 concurrent creates, default settings"},
		{200, []string{"--spare-min=base=50", "--pool-lead=-1s"}, 50, "p99 ≤ 1 s, 0 errors", "200 concurrent creates vs a spare pool of 50"},
	} {
		if err := spareBurst(ctx, b, c.fire, c.spare, c.goal, c.label, c.extra...); err != nil || ctx.Err() != nil {
			return err
		}
	}
	if err := afterBurst(ctx, b); err != nil || ctx.Err() != nil {
		return err
	}
	return sdkBursts(ctx, b)
}

// startDefaults starts a sandboxd with the build's create defaults plus
// extra and waits for spare ready members of base. The lifecycle and read
// limits are off: the bench's own destroys and metric reads must not get
// 429s, and neither class is what these rows measure.
func (b *Bench) startDefaults(ctx context.Context, spare int, extra ...string) (*Harness, error) {
	extra = append([]string{"--lifecycle-rate=0", "--read-rate=0"}, extra...)
	h, err := b.startSide(ctx, []string{"bench"}, extra...)
	if err != nil {
		return nil, err
	}
	if _, err := h.waitSpare(ctx, spare, 3*time.Minute); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// waitSpare waits until h's spare pool holds at least want ready members
// of base (want 0: its target, once sandboxd reports one), and returns how
// many it holds.
func (h *Harness) waitSpare(ctx context.Context, want int, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for {
		n, _ := h.metricSum(ctx, "sandboxd_spare_members", map[string]string{"state": "ready", "template": "base"})
		target := want
		if want <= 0 {
			// 0 until the pools' first pass has sized it.
			t, _ := h.metricSum(ctx, "sandboxd_spare_target", map[string]string{"template": "base"})
			target = int(t)
		}
		if target > 0 && int(n) >= target {
			return int(n), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return int(n), fmt.Errorf("spare pool holds %.0f ready members after %s, want %d", n, within, target)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func spareBurst(ctx context.Context, b *Bench, fire, spare int, goal, label string, extra ...string) error {
	h, err := b.startDefaults(ctx, spare, extra...)
	if err != nil {
		return err
	}
	defer h.Close()
	cpu0, _ := procstat.Read()
	each, wall, errs, ids, limited := createBurst(ctx, b, h, fire)
	cpu1, _ := procstat.Read()
	cpu := cpuBetween(cpu0, cpu1, fire)
	from := h.servedFrom()
	count := map[string]int{}
	for _, id := range ids {
		count[from[id]]++
	}
	r := durDist("spare", label+", each", each, errs)
	r.Goal = goal
	r.Compare = fmt.Sprintf("%d × 429; served spare %d, cold %d; all done in %.0f ms; %s",
		limited, count["spare"], count["cold"], float64(wall)/float64(time.Millisecond), cpu)
	b.add(r)
	h.destroyAll(context.WithoutCancel(ctx), ids, 4)
	return nil
}

// afterBurst: 20 concurrent creates, then 10 sequential create → first
// commands.run('true') → kill, as issue 24's SDK loop does, over HTTP and
// the envd proxy (the SDK scenario's path without the SDK's own cost).
func afterBurst(ctx context.Context, b *Bench) error {
	h, err := b.startDefaults(ctx, 0)
	if err != nil {
		return err
	}
	defer h.Close()
	_, _, burstErrs, ids, _ := createBurst(ctx, b, h, 20)
	var took []time.Duration
	errs, limited := burstErrs, 0
	for range 10 {
		t0 := time.Now()
		sb, err := h.create(ctx, true)
		if err == nil {
			tgt := h.proxyTarget(sb)
			_, err = tgt.run(ctx, "true")
			tgt.close()
			took = append(took, time.Since(t0))
			_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
		}
		if err != nil {
			errs++
			if errors.Is(err, errRateLimited) {
				limited++
			}
			b.logf("after-burst create: %v", err)
		}
	}
	r := durDist("spare", "create → first commands.run, 10 sequential after a burst of 20, default settings (HTTP, no SDK)", took, errs)
	r.Goal = "p99 ≤ 40 ms, no 429"
	r.Compare = fmt.Sprintf("%d × 429 (burst errors %d)", limited, burstErrs)
	b.add(r)
	h.destroyAll(context.WithoutCancel(ctx), ids, 4)
	return nil
}

// createBurst fires n concurrent creates; it returns each one's time, the
// wall time, the failures, the sandboxes made and how many got a 429.
func createBurst(ctx context.Context, b *Bench, h *Harness, n int) (each []time.Duration, wall time.Duration, errs int, ids []string, limited int) {
	var mu sync.Mutex
	each, wall, errs = concurrently(ctx, n, func(ctx context.Context) error {
		sb, err := h.create(ctx, true)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if errors.Is(err, errRateLimited) {
				limited++
			}
			b.logf("burst create: %v", err)
			return err
		}
		ids = append(ids, sb.ID)
		return nil
	})
	return each, wall, errs, ids, limited
}

// sdkBursts measures issue 24's SDK rows with E2B's SDKs, as the issue
// did: sdk_burst.py (.mjs) fires 100 concurrent Sandbox.create() →
// commands.run('true') → kill(); then the same 100 with the commands and
// kills after the last create (BURST_CREATES_FIRST), the issue's "100
// concurrent SDK creates" with nothing else of the client's beside them;
// then 20 concurrent and 10 more one after another. Each burst starts
// once the spare pool is full again, against a sandboxd with the default
// settings whose spare pool holds its floor.
func sdkBursts(ctx context.Context, b *Bench) error {
	h, err := b.startDefaults(ctx, 0)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, sdk := range b.cfg.SDKs {
		label, argv, env, why := b.sdkScript(sdk, "sdk_burst")
		lone := label + ": one tenant, 100 concurrent Sandbox.create(), default settings"
		alone := label + ": one tenant, 100 concurrent Sandbox.create(), their commands and kills after the last create, default settings"
		after := label + ": create → first commands.run, 10 sequential after a burst of 20, default settings"
		if why != "" {
			b.add(unavailable("spare", lone, why), unavailable("spare", alone, why), unavailable("spare", after, why))
			continue
		}
		// burst runs the script once the spare pool is full again.
		burst := func(extraEnv []string, args ...string) (burstOut, time.Duration, error) {
			if _, err := h.waitSpare(ctx, 0, 3*time.Minute); err != nil {
				return burstOut{}, 0, err
			}
			lines, cpu, err := b.runSDKLines(ctx, h, append(slices.Clone(argv), args...), append(slices.Clone(env), extraEnv...))
			return b.parseBurst(label, lines, err), cpu, nil
		}

		out, cpu, err := burst(nil, "100")
		if err != nil {
			return err
		}
		// The creates; each then runs a command, as an agent would, and
		// the client's own CPU comes out of the same CPUs as sandboxd's.
		r := dist("spare", lone, "ms", out.create, out.errs)
		r.Goal = "0 × 429, p99 ≤ 1 s"
		r.Compare = fmt.Sprintf("%d × 429; all done in %.0f ms; the SDK client used %.2f s of CPU", out.limited, out.wall, cpu.Seconds())
		if total := dist("", "", "", out.total, 0); total.P99 != nil {
			r.Compare += fmt.Sprintf("; create → first commands.run p99 %.0f ms", *total.P99)
		}
		b.add(r)

		if out, _, err = burst([]string{"BURST_CREATES_FIRST=1"}, "100"); err != nil {
			return err
		}
		r = dist("spare", alone, "ms", out.create, out.errs)
		r.Goal = "0 × 429, p99 ≤ 1 s"
		r.Compare = fmt.Sprintf("%d × 429; the last create returned at %.0f ms, when the SDK client had used %.2f s of CPU (its start and imports included)", out.limited, out.createdMs, out.createdCPU)
		b.add(r)

		if out, _, err = burst(nil, "20", "10"); err != nil {
			return err
		}
		r = dist("spare", after, "ms", out.seq, out.errs)
		r.Goal = "p99 ≤ 40 ms, no 429"
		r.Compare = fmt.Sprintf("%d × 429 (burst and loop)", out.limited)
		b.add(r)
	}
	return nil
}

// burstOut is what sdk_burst.py (.mjs) printed: each burst create's
// create → first command time and create time, the burst's wall time, the
// sequential ones' times, and the failures (429s among them).
type burstOut struct {
	total, create, seq []float64
	wall               float64
	errs, limited      int
	// With BURST_CREATES_FIRST: when the burst's last create returned, and
	// the client's CPU by then.
	createdMs, createdCPU float64
}

// parseBurst reads sdk_burst's lines; err is the script's own failure,
// counted as one more error. Failures are logged under label.
func (b *Bench) parseBurst(label string, lines [][]byte, err error) burstOut {
	var out burstOut
	for _, l := range lines {
		var it struct {
			Kind     string  `json:"kind"`
			CreateMs float64 `json:"create_ms"`
			TotalMs  float64 `json:"total_ms"`
			Ms       float64 `json:"ms"`
			CPU      float64 `json:"cpu_s"`
			Error    string  `json:"error"`
		}
		if json.Unmarshal(l, &it) != nil {
			continue
		}
		switch it.Kind {
		case "item":
			out.total, out.create = append(out.total, it.TotalMs), append(out.create, it.CreateMs)
		case "seq":
			out.seq = append(out.seq, it.TotalMs)
		case "wall":
			out.wall = it.Ms
		case "created":
			out.createdMs, out.createdCPU = it.Ms, it.CPU
		case "error":
			out.errs++
			if strings.Contains(it.Error, "429") || strings.Contains(it.Error, "RateLimit") {
				out.limited++
			}
			b.logf("%s: %s", label, it.Error)
		}
	}
	if err != nil {
		out.errs++
		b.logf("%s: %v", label, err)
	}
	return out
}
