package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// networkScenario: what an egress policy costs a create. Warm claims with
// a 20-rule policy (10 addresses, 10 names, deny-all) and without one,
// interleaved, from a full pool: the policy is one nft transaction and,
// for its names, the name filter's redirect.
func networkScenario(ctx context.Context, b *Bench) error {
	if !b.flags["pool"] || !b.flags["egress-dns"] {
		b.add(unavailable("network", "warm claim with a 20-rule egress policy", "egress policies are not implemented in this build"))
		return nil
	}
	const size = 5
	extra := append(noLimits(b.flags), "--pool=true", fmt.Sprintf("--min-warm=%d", size))
	if b.flags["pool-lead"] {
		extra = append(extra, "--pool-lead=-1s")
	}
	h, err := b.startSide(ctx, []string{"bench"}, extra...)
	if err != nil {
		return err
	}
	defer h.Close()
	if got := h.poolReady(ctx, size, 60*time.Second); got < size {
		return fmt.Errorf("pool holds %d ready members after 60s, want %d", got, size)
	}
	var allow []string
	for i := range 10 {
		allow = append(allow, fmt.Sprintf("192.52.193.%d", 16+i), fmt.Sprintf("api%d.example.com", i))
	}
	withPolicy, _ := json.Marshal(map[string]any{"templateID": "base", "timeout": 3600,
		"network": map[string]any{"allowOut": allow, "denyOut": []string{"0.0.0.0/0"}}})
	plain := createBody(true)

	n := b.iters(1, 2, 20)
	var none, pol []time.Duration
	errs := 0
	b.loop(ctx, n, func(i int) {
		runs := []struct {
			body []byte
			into *[]time.Duration
		}{{plain, &none}, {withPolicy, &pol}}
		if i%2 == 1 { // alternate which goes first
			runs[0], runs[1] = runs[1], runs[0]
		}
		for _, c := range runs {
			_ = h.poolReady(ctx, size, 10*time.Second)
			t0 := time.Now()
			sb, err := h.createBody(ctx, h.key, c.body)
			took := time.Since(t0)
			if err != nil {
				errs++
				b.logf("network: %v", err)
				continue
			}
			_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
			*c.into = append(*c.into, took)
		}
	})
	base := durDist("network", fmt.Sprintf("warm claim → 201, no egress policy (pool of %d)", size), none, 0)
	r := durDist("network", "warm claim → 201 with a 20-rule egress policy (10 addresses, 10 names, deny-all)", pol, errs)
	r.Goal = "≤ 2 ms over no policy (p50)"
	if base.P50 != nil && r.P50 != nil {
		r.Compare = fmt.Sprintf("p50 +%.1f ms over no policy, interleaved", *r.P50-*base.P50)
	}
	b.add(base, r)
	return nil
}
