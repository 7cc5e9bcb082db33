package main

import (
	"context"
	"fmt"
	"os/exec"
	osuser "os/user"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// floorCmds are the floors of a sandbox start: bubblewrap with the exact
// arguments of the issue (a mount namespace and a bind), plain fork+exec,
// and bubblewrap with every namespace (what a sandbox gets) for context.
var floorCmds = []struct {
	measure string
	argv    []string
}{
	{"bwrap --ro-bind / / true", []string{"bwrap", "--ro-bind", "/", "/", "true"}},
	{"/bin/true (fork+exec)", []string{"/bin/true"}},
	{"bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev true", []string{"bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"}},
	{"/bin/bash -l -c true as user (what commands.run starts, on the host)", []string{"/bin/bash", "-l", "-c", "true"}},
}

// asUser is the account envd runs commands as; the bash floor runs as it
// too (root's login profile on this box is far slower than user's).
const asUser = "user"

func runCmd(argv []string) (time.Duration, error) {
	return runCmdAs(argv, false)
}

func runCmdAs(argv []string, user bool) (time.Duration, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	if user {
		u, err := osuser.Lookup(asUser)
		if err != nil {
			return 0, err
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Env = []string{"HOME=" + u.HomeDir, "USER=" + asUser, "LOGNAME=" + asUser, "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}
		cmd.Dir = u.HomeDir
	}
	t0 := time.Now()
	err := cmd.Run()
	return time.Since(t0), err
}

func haveBwrap() bool {
	_, err := exec.LookPath("bwrap")
	return err == nil
}

func floorScenario(ctx context.Context, b *Bench) error {
	if !haveBwrap() {
		b.add(unavailable("floor", "bwrap --ro-bind / / true", "bwrap is not installed (scripts/deps.sh installs it)"))
	}
	n := b.iters(2, 1, 20)
	samples := make([][]time.Duration, len(floorCmds))
	errs := make([]int, len(floorCmds))
	runc, err := newRuncFloor(b.cfg.BinDir)
	if err != nil {
		b.logf("libcontainer floor: %v", err)
		b.add(unavailable("floor", runcFloorMeasure, err.Error()))
	} else {
		defer runc.Close()
	}
	var runcSamples []time.Duration
	var runcErrs int
	for range 3 { // warm the page cache
		for _, c := range floorCmds {
			_, _ = runCmdAs(c.argv, c.argv[0] == "/bin/bash")
		}
		if runc != nil {
			_, _ = runc.run()
		}
	}
	ran := b.loop(ctx, n, func(i int) {
		for k := range floorCmds {
			j := (i + k) % len(floorCmds) // rotate the order: no command always runs first
			if floorCmds[j].argv[0] == "bwrap" && !haveBwrap() {
				continue
			}
			d, err := runCmdAs(floorCmds[j].argv, floorCmds[j].argv[0] == "/bin/bash")
			if err != nil {
				errs[j]++
				continue
			}
			samples[j] = append(samples[j], d)
		}
		if runc != nil {
			if d, err := runc.run(); err != nil {
				b.logf("%v", err)
				runcErrs++
			} else {
				runcSamples = append(runcSamples, d)
			}
		}
	})
	b.logf("%d rounds", ran)
	rows := make([]Row, len(floorCmds))
	for j, c := range floorCmds {
		rows[j] = durDist("floor", c.measure, samples[j], errs[j])
	}
	if rows[0].P50 != nil && rows[1].P50 != nil {
		rows[0].Compare = fmt.Sprintf("%.1f× /bin/true", *rows[0].P50 / *rows[1].P50)
	}
	if rows[2].P50 != nil && rows[0].P50 != nil {
		rows[2].Compare = fmt.Sprintf("%.1f× bwrap --ro-bind / / true", *rows[2].P50 / *rows[0].P50)
	}
	rows[3].Note = "floor of the exec scenario: envd's own cost is what commands.run adds to it"
	rows[3].Compare = rows[3].Note
	if runc != nil {
		r := durDist("floor", runcFloorMeasure, runcSamples, runcErrs)
		if r.P50 != nil && rows[0].P50 != nil {
			r.Compare = fmt.Sprintf("%.1f× bwrap --ro-bind / / true", *r.P50 / *rows[0].P50)
		}
		rows = append(rows, r)
	}
	b.add(rows...)
	return nil
}

// createScenario measures a cold create through the E2B API (POST
// /v2/sandboxes → 201, which sandboxd sends once envd in the sandbox
// answered /health and took /init), the first /health through the proxy
// after it, and DELETE, with internet access on (the SDKs' default: a veth
// and nftables) and off (loopback only). The bwrap floor runs between
// creates, so the ratio compares like with like.
func createScenario(ctx context.Context, b *Bench) error {
	n := b.iters(1, 1, 3)
	type series struct {
		create, healthy, destroy []time.Duration
		errs                     int
	}
	variants := []struct {
		name     string
		internet bool
	}{{"internet on (SDK default)", true}, {"internet off", false}}
	res := make([]series, len(variants))
	var floor, runcFl []time.Duration
	floorOK := haveBwrap()
	runc, err := newRuncFloor(b.cfg.BinDir)
	if err != nil {
		b.logf("libcontainer floor: %v", err)
	} else {
		defer runc.Close()
	}

	one := func(internet bool, s *series, record bool) {
		t0 := time.Now()
		sb, err := b.h.create(ctx, internet)
		tc := time.Since(t0)
		if err != nil {
			if record {
				s.errs++
			}
			b.logf("create: %v", err)
			return
		}
		t := b.h.proxyTarget(sb)
		err = t.health(ctx)
		th := time.Since(t0)
		t.close()
		t1 := time.Now()
		derr := b.h.destroy(ctx, sb.ID)
		td := time.Since(t1)
		if !record {
			return
		}
		if err != nil || derr != nil {
			s.errs++
			b.logf("health/destroy: %v %v", err, derr)
			return
		}
		s.create = append(s.create, tc)
		s.healthy = append(s.healthy, th)
		s.destroy = append(s.destroy, td)
	}
	for v := range variants { // warm-up: the first creates warm caches (sandboxd's and the page cache)
		for range 2 {
			one(variants[v].internet, &res[v], false)
		}
	}
	ran := b.loop(ctx, n, func(i int) {
		if floorOK {
			if d, err := runCmd(floorCmds[0].argv); err == nil {
				floor = append(floor, d)
			}
		}
		if runc != nil {
			if d, err := runc.run(); err == nil {
				runcFl = append(runcFl, d)
			}
		}
		for k := range variants {
			v := (i + k) % len(variants)
			one(variants[v].internet, &res[v], true)
		}
	})
	b.logf("%d rounds", ran)

	fl := durDist("create", "bwrap --ro-bind / / true (floor, between creates)", floor, 0)
	b.add(fl)
	var rf Row
	if runc != nil {
		rf = durDist("create", "runc run /bin/true (libcontainer floor, between creates)", runcFl, 0)
		if rf.P50 != nil && fl.P50 != nil {
			rf.Compare = fmt.Sprintf("p50 %.1f× bwrap floor", *rf.P50 / *fl.P50)
		}
		b.add(rf)
	}
	for v, vr := range variants {
		c := durDist("create", "cold create → 201, "+vr.name, res[v].create, res[v].errs)
		c.Goal = "≤ 60 ms and ≤ 4× floor (p50)"
		if c.P50 != nil && fl.P50 != nil {
			c.Compare = fmt.Sprintf("p50 %.1f× floor", *c.P50 / *fl.P50)
			if rf.P50 != nil {
				c.Compare += fmt.Sprintf(", %.2f× runc run", *c.P50 / *rf.P50)
			}
		}
		h := durDist("create", "cold create → first /health via proxy, "+vr.name, res[v].healthy, 0)
		d := durDist("create", "destroy (DELETE → 204), "+vr.name, res[v].destroy, 0)
		b.add(c, h, d)
	}
	return nil
}

// burstScenario fires cfg.Burst cold creates at once, with no pool: every
// one of them is a cold create competing for 2 cores. (The same against a
// warm pool is part of the warm scenario.) With cfg.BurstRounds > 1 the
// rounds before the last are fired and destroyed unmeasured.
func burstScenario(ctx context.Context, b *Bench) error {
	c := b.cfg.Burst
	for range b.cfg.BurstRounds - 1 {
		_, ids, _, _, _ := fireBurst(ctx, b, c, nil)
		if _, errs := b.h.destroyAll(context.WithoutCancel(ctx), ids, 4); errs > 0 {
			return fmt.Errorf("burst: %d destroys of an unmeasured round failed", errs)
		}
	}
	pw, err := openPerfWindow()
	if err != nil {
		return err
	}
	took, ids, errs, wall, err := fireBurst(ctx, b, c, func() error { return pw.send("enable") })
	if err != nil {
		return err
	}
	r := durDist("burst", fmt.Sprintf("%d concurrent cold creates (no pool), each", c), took, errs)
	r.Note = fmt.Sprintf("all done in %.0f ms", float64(wall)/float64(time.Millisecond))
	r.Compare = r.Note
	b.add(r, value("burst", fmt.Sprintf("%d concurrent cold creates: wall time for all", c), "ms", float64(wall)/float64(time.Millisecond), c))
	dt, derrs := b.h.destroyAll(context.WithoutCancel(ctx), ids, 4)
	b.add(durDist("burst", "destroy after the burst (4 at a time)", dt, derrs))
	if pw != nil {
		// What a destroy leaves to the background (the veth's release,
		// the kernel's teardown of the network namespaces) is the
		// creates' too.
		time.Sleep(perfSettle)
	}
	return pw.send("disable")
}

// fireBurst fires c cold creates at once, once before (if not nil) has
// returned nil, and returns each one's time, the ids made, the errors and
// the time until the last answered; if before fails, nothing is fired.
func fireBurst(ctx context.Context, b *Bench, c int, before func() error) (took []time.Duration, ids []string, errs int, wall time.Duration, err error) {
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		abort bool
	)
	start := make(chan struct{})
	for range c {
		wg.Go(func() {
			<-start
			if abort {
				return
			}
			t0 := time.Now()
			sb, err := b.h.create(ctx, true)
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs++
				b.logf("burst create: %v", err)
				return
			}
			took = append(took, d)
			ids = append(ids, sb.ID)
		})
	}
	if before != nil {
		if err = before(); err != nil {
			abort = true // before close: the creates see it
			close(start)
			wg.Wait()
			return nil, nil, 0, 0, err
		}
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return took, ids, errs, time.Since(t0), nil
}

// perfSettle is how long the burst's perf window stays open after the last
// destroy answered: the local backend's background releases wait up to 2 s
// (linkGoneWait) for the kernel's.
const perfSettle = 2500 * time.Millisecond
