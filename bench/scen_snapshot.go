package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// snapshotScenario: issue 23's figures on a sandbox with 100 MB written in
// its home: POST /sandboxes/{id}/snapshots → 201 and POST …/fork (count 1)
// → 201 (goal ≤ 300 ms each on the local backend), and a create from the
// snapshot against cold creates of its template, interleaved (goal: within
// 20%).
func snapshotScenario(ctx context.Context, b *Bench) error {
	return snapshotOn(ctx, b, "snapshot", false)
}

// snapshotIncusScenario is snapshotScenario on the Incus backend, where a
// snapshot is a layer instance (a copy of the commit's instance snapshot)
// and a fork a copy of the instance.
func snapshotIncusScenario(ctx context.Context, b *Bench) error {
	return snapshotOn(ctx, b, "snapshot-incus", true)
}

// snapshotOn runs the snapshot scenario, its rows labelled name, on the
// local backend or on Incus.
func snapshotOn(ctx context.Context, b *Bench, name string, onIncus bool) error {
	var extra []string
	if b.flags["pool"] {
		extra = append(extra, "--pool=false") // both creates cold
	}
	var h *Harness
	var err error
	if onIncus {
		if why := b.incusUnavailable(ctx, newIncusAPI()); why != "" {
			b.add(unavailable(name, "snapshot, fork and creates on the Incus backend", why))
			return nil
		}
		h, err = b.startIncusSide(ctx, append(noLimits(b.flags), extra...)...)
	} else {
		h, err = b.startSide(ctx, []string{"bench"}, append(noLimits(b.flags), extra...)...)
	}
	if err != nil {
		return err
	}
	defer h.Close()
	n := b.iters(1, 10, 10)
	var snap, fork, fromSnap, cold []time.Duration
	errs := 0
	fail := func(what string, err error) {
		errs++
		b.logf("snapshot scenario: %s: %v", what, err)
	}
	b.loop(ctx, n, func(int) {
		src, err := h.createTemplate(ctx, "base")
		if err != nil {
			fail("create", err)
			return
		}
		defer h.destroy(context.WithoutCancel(ctx), src.ID)
		t := h.proxyTarget(src)
		defer t.close()
		if r, err := t.shell(ctx, "head -c 104857600 /dev/urandom > ~/big && sync"); err != nil || r.exit != 0 {
			fail("write 100 MB", fmt.Errorf("%v %+v", err, r))
			return
		}
		var info struct {
			SnapshotID string `json:"snapshotID"`
		}
		t0 := time.Now()
		if err := h.apiCall(ctx, http.MethodPost, "/sandboxes/"+src.ID+"/snapshots", map[string]any{}, &info); err != nil {
			fail("snapshot", err)
			return
		}
		snap = append(snap, time.Since(t0))
		defer h.apiCall(context.WithoutCancel(ctx), http.MethodDelete, "/templates/"+url.PathEscape(info.SnapshotID), nil, nil)

		var forks []struct {
			Sandbox *struct {
				SandboxID string `json:"sandboxID"`
			} `json:"sandbox"`
		}
		t0 = time.Now()
		err = h.apiCall(ctx, http.MethodPost, "/sandboxes/"+src.ID+"/fork", map[string]any{"count": 1}, &forks)
		d := time.Since(t0)
		if err != nil || len(forks) != 1 || forks[0].Sandbox == nil {
			fail("fork", fmt.Errorf("%v %+v", err, forks))
			return
		}
		fork = append(fork, d)
		_ = h.destroy(context.WithoutCancel(ctx), forks[0].Sandbox.SandboxID)

		// Interleaved, in alternating order: a create from the snapshot
		// (its 100 MB a lower layer) and a cold create of base.
		for _, which := range []string{info.SnapshotID, "base"} {
			t0 := time.Now()
			sb, err := h.createTemplate(ctx, which)
			if err != nil {
				fail("create "+which, err)
				return
			}
			if which == "base" {
				cold = append(cold, time.Since(t0))
			} else {
				fromSnap = append(fromSnap, time.Since(t0))
			}
			_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
		}
	})
	rs := durDist(name, "snapshot of a sandbox with 100 MB written: POST /sandboxes/{id}/snapshots → 201", snap, errs)
	rs.Goal = "≤ 300 ms"
	rf := durDist(name, "fork of that sandbox (count 1): POST /sandboxes/{id}/fork → 201, the fork's envd initialised", fork, 0)
	rf.Goal = "≤ 300 ms"
	rc := durDist(name, "create from the snapshot → 201 (cold)", fromSnap, 0)
	rc.Goal = "within 20% of a cold create of its template"
	rb := durDist(name, "cold create of base → 201 (interleaved)", cold, 0)
	if rc.P50 != nil && rb.P50 != nil && *rb.P50 > 0 {
		rc.Compare = fmt.Sprintf("p50 %+.0f%% vs base cold", (*rc.P50 / *rb.P50 - 1)*100)
	}
	b.add(rs, rf, rc, rb)
	return nil
}
