package main

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"
)

// op is one timed call against one target.
type op struct {
	name string
	fn   func(ctx context.Context, t *envdTarget) error
}

// measureTargets runs every op on every target n times, interleaved: in
// each round each target runs each op once, the targets' order rotating,
// so that the targets share whatever else the box is doing.
func (b *Bench) measureTargets(ctx context.Context, n, warmup int, targets []*envdTarget, ops []op) (samples [][][]time.Duration, errs [][]int) {
	samples = make([][][]time.Duration, len(ops))
	errs = make([][]int, len(ops))
	for o := range ops {
		samples[o] = make([][]time.Duration, len(targets))
		errs[o] = make([]int, len(targets))
	}
	for range warmup {
		for _, t := range targets {
			for _, o := range ops {
				_ = o.fn(ctx, t)
			}
		}
	}
	ran := b.loop(ctx, n, func(i int) {
		for o, op := range ops {
			for k := range targets {
				j := (i + k) % len(targets)
				t0 := time.Now()
				err := op.fn(ctx, targets[j])
				d := time.Since(t0)
				if err != nil {
					errs[o][j]++
					if errs[o][j] <= 3 {
						b.logf("%s via %s: %v", op.name, targets[j].name, err)
					}
					continue
				}
				samples[o][j] = append(samples[o][j], d)
			}
		}
	})
	b.logf("%d rounds", ran)
	return samples, errs
}

// proxyCompare describes what the proxy adds over the socket path: the
// difference of the p50s and the median of the per-round differences.
func proxyCompare(proxy, socket []time.Duration) string {
	if len(proxy) == 0 || len(socket) == 0 {
		return ""
	}
	p, s := msOf(proxy), msOf(socket)
	return fmt.Sprintf("proxy adds %+.2f ms p50 (paired median %+.2f ms) over the envd socket", median(p)-median(s), median(pairedDiff(p, s)))
}

// execScenario: commands.run('true') — Start of `/bin/bash -l -c true`
// with stdin closed, the SDK's headers, read to the end of the stream —
// through sandboxd's proxy, straight to the same sandbox's envd on its unix
// socket (what the proxy dials), and to a standalone envd over loopback
// TCP. Also GET /health (the transport alone) and /bin/true without a shell.
func execScenario(ctx context.Context, b *Bench) error {
	sb, err := b.h.create(ctx, true)
	if err != nil {
		return err
	}
	defer b.h.destroy(context.WithoutCancel(ctx), sb.ID)
	sock, err := b.h.socketTarget(sb)
	if err != nil {
		return err
	}
	targets := []*envdTarget{b.h.proxyTarget(sb), sock, tcpTarget(b.envd.addr)}
	for _, t := range targets {
		defer t.close()
	}
	names := []string{"sandbox envd via sandboxd proxy", "sandbox envd via its unix socket (no proxy)", "standalone envd via loopback TCP"}
	ops := []op{
		{"GET /health", func(ctx context.Context, t *envdTarget) error { return t.health(ctx) }},
		{"commands.run('true') = Start /bin/bash -l -c true", func(ctx context.Context, t *envdTarget) error { _, err := t.shell(ctx, "true"); return err }},
		{"Start /bin/true (no shell)", func(ctx context.Context, t *envdTarget) error { _, err := t.run(ctx, "/bin/true"); return err }},
	}
	s, e := b.measureTargets(ctx, b.iters(2, 1, 20), 5, targets, ops)
	for o, op := range ops {
		for j := range targets {
			r := durDist("exec", op.name+" — "+names[j], s[o][j], e[o][j])
			switch {
			case j == 0:
				r.Compare = proxyCompare(s[o][0], s[o][1])
				r.Goal = "proxy adds ≤ 1 ms p50"
			case j == 2 && o == 1:
				r.Goal = "≤ 3 ms (envd exec round trip)"
			}
			b.add(r)
		}
	}
	return nil
}

// filesScenario: files.write and files.read of 1 KB and 10 MB through the
// proxy and on the socket, interleaved.
func filesScenario(ctx context.Context, b *Bench) error {
	sb, err := b.h.create(ctx, true)
	if err != nil {
		return err
	}
	defer b.h.destroy(context.WithoutCancel(ctx), sb.ID)
	sock, err := b.h.socketTarget(sb)
	if err != nil {
		return err
	}
	targets := []*envdTarget{b.h.proxyTarget(sb), sock}
	for _, t := range targets {
		defer t.close()
	}
	names := []string{"via proxy", "via envd socket (no proxy)"}
	for _, size := range []struct {
		label string
		bytes int
		n     int
	}{
		{"1 KB", 1 << 10, b.iters(1, 1, 20)},
		{"10 MB", 10 << 20, b.iters(1, 5, 5)},
	} {
		data := bytes.Repeat([]byte("sandboxd"), size.bytes/8)
		path := fmt.Sprintf("/home/user/bench-%d.bin", size.bytes)
		up := newUpload(path, data)
		ops := []op{
			{"files.write " + size.label, func(ctx context.Context, t *envdTarget) error { return t.write(ctx, path, up) }},
			{"files.read " + size.label, func(ctx context.Context, t *envdTarget) error { return t.read(ctx, path, size.bytes) }},
		}
		s, e := b.measureTargets(ctx, size.n, 2, targets, ops)
		for o, op := range ops {
			for j := range targets {
				r := durDist("files", op.name+" "+names[j], s[o][j], e[o][j])
				if j == 0 {
					r.Compare = proxyCompare(s[o][0], s[o][1])
				}
				b.add(r)
				if size.bytes >= 1<<20 && r.P50 != nil {
					b.add(value("files", op.name+" "+names[j]+": throughput at p50", "MiB/s", float64(size.bytes)/mib/(*r.P50/1000), r.N))
				}
			}
		}
	}
	return nil
}

// concurrently runs c copies of fn at once and returns each one's time and
// the time for all.
func concurrently(ctx context.Context, c int, fn func(ctx context.Context) error) (each []time.Duration, wall time.Duration, errs int) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start := make(chan struct{})
	for range c {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			err := fn(ctx)
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs++
				return
			}
			each = append(each, d)
		})
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return each, time.Since(t0), errs
}

// procsScenario: cfg.Procs concurrent commands.run('true') on one envd.
func procsScenario(ctx context.Context, b *Bench) error {
	sb, err := b.h.create(ctx, true)
	if err != nil {
		return err
	}
	defer b.h.destroy(context.WithoutCancel(ctx), sb.ID)
	targets := []*envdTarget{tcpTarget(b.envd.addr), b.h.proxyTarget(sb)}
	names := []string{"standalone envd (TCP)", "sandbox envd via proxy"}
	rounds := b.iters(1, 10, 5)
	p := b.cfg.Procs
	for j, t := range targets {
		defer t.close()
		var each, walls []time.Duration
		errs := 0
		_, _, _ = concurrently(ctx, min(p, 10), func(ctx context.Context) error { _, err := t.shell(ctx, "true"); return err })
		b.loop(ctx, rounds, func(int) {
			e, w, n := concurrently(ctx, p, func(ctx context.Context) error { _, err := t.shell(ctx, "true"); return err })
			each, walls, errs = append(each, e...), append(walls, w), errs+n
		})
		r := durDist("procs", fmt.Sprintf("%d concurrent commands.run('true'), each — %s", p, names[j]), each, errs)
		w := durDist("procs", fmt.Sprintf("%d concurrent commands.run('true'), all — %s", p, names[j]), walls, 0)
		if len(walls) > 0 {
			w.Compare = fmt.Sprintf("%.0f processes/s at p50", float64(p)/(*w.P50/1000))
		}
		b.add(r, w)
	}
	return nil
}

// stdoutScenario: a process writing 2 MiB to stdout, read to the end.
func stdoutScenario(ctx context.Context, b *Bench) error {
	sb, err := b.h.create(ctx, true)
	if err != nil {
		return err
	}
	defer b.h.destroy(context.WithoutCancel(ctx), sb.ID)
	const size = 2 << 20
	script := fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x`, size)
	sock, err := b.h.socketTarget(sb)
	if err != nil {
		return err
	}
	targets := []*envdTarget{tcpTarget(b.envd.addr), b.h.proxyTarget(sb), sock}
	for _, t := range targets {
		defer t.close()
	}
	names := []string{"standalone envd (TCP)", "sandbox envd via proxy", "sandbox envd via socket (no proxy)"}
	ops := []op{{"2 MiB stdout", func(ctx context.Context, t *envdTarget) error {
		r, err := t.shell(ctx, script)
		if err == nil && r.stdout != size {
			err = fmt.Errorf("got %d bytes of stdout, want %d", r.stdout, size)
		}
		return err
	}}}
	s, e := b.measureTargets(ctx, b.iters(1, 4, 10), 2, targets, ops)
	for j := range targets {
		r := durDist("stdout", "commands.run(2 MiB to stdout) — "+names[j], s[0][j], e[0][j])
		if j == 1 {
			r.Compare = proxyCompare(s[0][1], s[0][2])
		}
		b.add(r)
		if r.P50 != nil {
			b.add(value("stdout", "2 MiB stdout throughput at p50 — "+names[j], "MiB/s", 2/(*r.P50/1000), r.N))
		}
	}
	return nil
}
