package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/incus"
)

// The cluster scenario (issue 27): sandboxd's Incus backend on the
// three-member test cluster of scripts/incus-cluster.sh, reached through
// the members' relays.
//
//   - cold create on the three members against the same sandboxd held to
//     one member (--incus-member m1): what spreading costs or saves;
//   - envd's /health through sandboxd's proxy, one kept connection, for a
//     sandbox on a cluster member (proxy → relay over TLS → the member's
//     veth) against one on the host's own Incus (proxy → the unix socket
//     in the sandbox's socket directory): the relay's overhead.
//
// One sandboxd at a time: each is namespace-less and would reconcile the
// other's sandboxes away at start. Creates are sequential and each sandbox
// is destroyed (and waited for) before the next, so that a create never
// competes with a deletion.

const clusterEnvFile = "/var/lib/sandboxd-cluster/env"

func readClusterEnv() (map[string]string, error) {
	f, err := os.Open(clusterEnvFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok && !strings.HasPrefix(k, "#") {
			env[k] = strings.Trim(v, `"`)
		}
	}
	return env, sc.Err()
}

func clusterScenario(ctx context.Context, b *Bench) error {
	const (
		createLabel = "sandboxd cold create → 201, Incus cluster of 3 members (relays)"
		proxyLabel  = "envd /health via sandboxd's proxy, sandbox on a cluster member (relay)"
	)
	env, err := readClusterEnv()
	if err != nil || !b.flags["incus-remote"] {
		why := fmt.Sprintf("no test cluster (scripts/incus-cluster.sh up): %v", err)
		if err == nil {
			why = "this build's `sandboxd serve` has no --incus-remote"
		}
		b.add(unavailable("cluster", createLabel, why), unavailable("cluster", proxyLabel, why))
		return nil
	}
	remote := []string{"--incus-remote", env["SANDBOXD_INCUS_URL"],
		"--incus-client-cert", env["SANDBOXD_INCUS_CLIENT_CERT"], "--incus-client-key", env["SANDBOXD_INCUS_CLIENT_KEY"],
		"--incus-server-cert", env["SANDBOXD_INCUS_SERVER_CERT"], "--incus-simple-quotas"}
	cold := append(noLimits(b.flags), "--spare=false", "--pool=false")

	n := b.iters(1, 5, 10)
	// Alternating blocks of the two placements, so that drift over the run
	// (the members' page cache, the host's load) hits both alike.
	var spread, single []time.Duration
	var errs [2]int
	placements := [][]string{nil, {"--incus-member", "m1"}}
	for _, order := range [][2]int{{0, 1}, {1, 0}} {
		for _, i := range order {
			h, err := b.startIncusSide(ctx, append(append(append([]string{}, cold...), remote...), placements[i]...)...)
			if err != nil {
				return err
			}
			times, failed := clusterCreates(ctx, b, h, n/2+1)
			h.Close()
			errs[i] += failed
			if i == 0 {
				spread = append(spread, times...)
			} else {
				single = append(single, times...)
			}
		}
	}
	sp := durDist("cluster", createLabel, spread, errs[0])
	si := durDist("cluster", "sandboxd cold create → 201, the same cluster held to one member (--incus-member m1)", single, errs[1])
	if sp.P50 != nil && si.P50 != nil {
		sp.Compare = fmt.Sprintf("p50 %.2f× the one-member create", *sp.P50 / *si.P50)
	}
	sp.Goal = "≤ 1.2× a single-member create"
	b.add(sp, si)

	// The relay's overhead: /health through the proxy on a kept connection.
	h, err := b.startIncusSide(ctx, append(append([]string{}, cold...), remote...)...)
	if err != nil {
		return err
	}
	viaRelay, relayErrs := proxyHealths(ctx, b, h)
	h.Close()
	h, err = b.startIncusSide(ctx, cold...)
	if err != nil {
		return err
	}
	local, localErrs := proxyHealths(ctx, b, h)
	h.Close()
	pr := durDist("cluster", proxyLabel, viaRelay, relayErrs)
	lo := durDist("cluster", "envd /health via sandboxd's proxy, sandbox on this host's Incus (unix socket)", local, localErrs)
	if pr.P50 != nil && lo.P50 != nil {
		pr.Compare = fmt.Sprintf("p50 +%.3f ms over the host's Incus", *pr.P50-*lo.P50)
	}
	pr.Goal = "≤ +1 ms p50 over the local case"
	b.add(pr, lo)
	if ctx.Err() != nil {
		return nil
	}
	if err := clusterFailover(ctx, b, env, append(append([]string{}, cold...), remote...), false); err != nil || ctx.Err() != nil {
		return err
	}
	// The same with a spare on every member: a claim writes nothing to
	// Incus, and the pools skip the members the probes find down.
	spares := append(append(noLimits(b.flags), remote...), "--spare-min", "base=3")
	return clusterFailover(ctx, b, env, spares, true)
}

// clusterFailover: a member stopped (`incus-cluster.sh stop N`, its
// container forced off, as a machine losing power) while a client creates
// sandboxes every 20 ms; the time from the stop to the first create that
// succeeds. Two cases: a member that does not lead the cluster's database,
// and the one that does (Incus' writes wait for a new leader). The member
// is started again after each round (≈ 15 s). With spares, every round
// starts with three spare members ready (one a member, by placement), and
// the creates are claims.
func clusterFailover(ctx context.Context, b *Bench, env map[string]string, args []string, spares bool) error {
	script := filepath.Join(b.cfg.Root, "scripts", "incus-cluster.sh")
	h, err := b.startIncusSide(ctx, args...)
	if err != nil {
		return err
	}
	defer h.Close()
	// A sandbox on every member first, so that the stopped one holds some.
	for range 3 {
		if _, err := h.create(ctx, false); err != nil {
			return fmt.Errorf("failover: create: %w", err)
		}
	}
	cluster := func(args ...string) error {
		out, err := exec.CommandContext(context.WithoutCancel(ctx), "bash", append([]string{script}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("incus-cluster.sh %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	// Which member leads the cluster's database changes as members die and
	// come back: asked before every round.
	leader := func() (string, []string, error) {
		cfg, err := incus.LoadRemoteConfig(env["SANDBOXD_INCUS_URL"], env["SANDBOXD_INCUS_CLIENT_CERT"],
			env["SANDBOXD_INCUS_CLIENT_KEY"], env["SANDBOXD_INCUS_SERVER_CERT"])
		if err != nil {
			return "", nil, err
		}
		c, err := incus.NewRemoteClient(cfg)
		if err != nil {
			return "", nil, err
		}
		defer c.Close()
		ms, err := c.ClusterMembers(ctx)
		if err != nil {
			return "", nil, err
		}
		lead, others := "", []string(nil)
		for _, m := range ms {
			if slices.Contains(m.Roles, "database-leader") {
				lead = m.Name
			} else {
				others = append(others, m.Name)
			}
		}
		if lead == "" || len(others) == 0 {
			return "", nil, fmt.Errorf("failover: no database leader among %v", ms)
		}
		return lead, others, nil
	}
	for _, victim := range []struct {
		leader      bool
		label, note string
	}{
		{false, "a member killed → first create that succeeds elsewhere", "a member that does not lead the cluster's database, stopped with `incus stop -f`; creates every 20 ms"},
		{true, "the database leader's member killed → first create that succeeds", "the member leading the cluster's database (m1 at first: also sandboxd's Incus address), stopped with `incus stop -f`; creates every 20 ms"},
	} {
		var first []time.Duration
		errs := 0
		for range b.iters(1, 50, 2) {
			lead, others, err := leader()
			if err != nil {
				return err
			}
			name := others[len(others)-1]
			if victim.leader {
				name = lead
			}
			n := strings.TrimPrefix(name, "m") // member mN is container sbdc-N
			if spares {
				deadline := time.Now().Add(3 * time.Minute)
				for ctx.Err() == nil {
					ready, _ := h.metricSum(ctx, "sandboxd_spare_members", map[string]string{"state": "ready"})
					if ready >= 3 || time.Now().After(deadline) {
						b.logf("failover: %v spare members ready", ready)
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			b.logf("failover: stopping %s (database leader: %s)", name, lead)
			if err := cluster("stop", n); err != nil {
				return err
			}
			t0 := time.Now()
			var took time.Duration
			for time.Since(t0) < time.Minute {
				t1 := time.Now()
				// The spares have the default shape, internet access
				// included: a create of another shape is cold.
				sb, err := h.create(ctx, spares)
				if err == nil {
					took = time.Since(t0)
					_ = h.destroy(ctx, sb.ID)
					break
				}
				b.logf("failover %s: create after %v failed in %v: %v", name, time.Since(t0), time.Since(t1), err)
				time.Sleep(20 * time.Millisecond)
			}
			if took == 0 {
				errs++
			} else {
				first = append(first, took)
			}
			if err := cluster("start", n); err != nil {
				return err
			}
		}
		d := durDist("cluster", victim.label, first, errs)
		d.Goal = "≤ 2 s"
		d.Note = victim.note
		if spares {
			d.Measure += ", a spare on every member"
			d.Note = strings.Replace(d.Note, "; creates every 20 ms", "; three spare members (--spare-min base=3), creates every 20 ms", 1)
		}
		b.add(d)
	}
	return nil
}

// clusterCreates times n cold creates, each destroyed and waited for.
func clusterCreates(ctx context.Context, b *Bench, h *Harness, n int) ([]time.Duration, int) {
	var out []time.Duration
	failed := 0
	// One unmeasured: the members' first snapshot of the image.
	if sb, err := h.create(ctx, false); err == nil {
		_ = h.destroy(ctx, sb.ID)
	}
	b.loop(ctx, n, func(int) {
		t0 := time.Now()
		sb, err := h.create(ctx, false)
		d := time.Since(t0)
		if err != nil {
			failed++
			b.logf("cluster create: %v", err)
			return
		}
		out = append(out, d)
		if err := h.destroy(ctx, sb.ID); err != nil {
			b.logf("cluster destroy: %v", err)
		}
		time.Sleep(time.Second) // the forced stop and deletion: ≈ 0.6 s on Incus
	})
	return out, failed
}

// proxyHealths times envd's /health through the proxy on one kept
// connection, after a warm-up.
func proxyHealths(ctx context.Context, b *Bench, h *Harness) ([]time.Duration, int) {
	sb, err := h.create(ctx, false)
	if err != nil {
		b.logf("proxy health: create: %v", err)
		return nil, 1
	}
	defer func() { _ = h.destroy(context.WithoutCancel(ctx), sb.ID) }()
	t := h.proxyTarget(sb)
	defer t.close()
	for range 20 {
		_ = t.health(ctx)
	}
	var out []time.Duration
	failed := 0
	b.loop(ctx, b.iters(2, 1, 50), func(int) {
		t0 := time.Now()
		if err := t.health(ctx); err != nil {
			failed++
			return
		}
		out = append(out, time.Since(t0))
	})
	return out, failed
}
