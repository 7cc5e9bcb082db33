package server

import (
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/pool"
)

type stubPools struct{}

func (stubPools) Stats() []pool.Stat {
	k := pool.Key{Tenant: "a", Template: "base", MemoryMB: 512}
	k2 := k
	k2.MemoryMB = 1024 // another shape of the same template: summed
	spare := k
	spare.Tenant = ""
	return []pool.Stat{
		{Key: k, Ready: 2, Starting: 1, Target: 3},
		{Key: k2, Ready: 1, Starting: 0, Target: 1},
		{Key: spare, Ready: 5, Starting: 2, Target: 8},
	}
}

func (stubPools) Counts() []pool.Count {
	return []pool.Count{
		{Tenant: "a", Template: "base", Hits: 7, Spare: 4, Misses: 2, Waited: 1},
		{Tenant: "", Template: "base", Hits: 4, Misses: 2},
	}
}

func TestPoolMetrics(t *testing.T) {
	m := NewMetrics()
	lm := newLimitMetrics(m.Registry(), stubPools{})
	lm.rejected("a", "create")
	got := scrapeMetrics(t, m)
	for series, want := range map[string]float64{
		`sandboxd_pool_members{state="ready",template="base",tenant="a"}`:       3,
		`sandboxd_pool_members{state="starting",template="base",tenant="a"}`:    1,
		`sandboxd_pool_target{template="base",tenant="a"}`:                      4,
		`sandboxd_pool_claims_total{result="hit",template="base",tenant="a"}`:   7,
		`sandboxd_pool_claims_total{result="miss",template="base",tenant="a"}`:  2,
		`sandboxd_pool_claims_total{result="spare",template="base",tenant="a"}`: 4,
		`sandboxd_pool_waited_total{template="base",tenant="a"}`:                1,
		`sandboxd_spare_members{state="ready",template="base"}`:                 5,
		`sandboxd_spare_members{state="starting",template="base"}`:              2,
		`sandboxd_spare_target{template="base"}`:                                8,
		`sandboxd_spare_claims_total{result="hit",template="base"}`:             4,
		`sandboxd_spare_claims_total{result="miss",template="base"}`:            2,
		`sandboxd_ratelimit_rejections_total{class="create",tenant="a"}`:        1,
	} {
		if v, ok := got[series]; !ok || v != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
}

// The spare pools are no tenant's: they never show as tenant "".
func TestSpareNotATenant(t *testing.T) {
	m := NewMetrics()
	newLimitMetrics(m.Registry(), stubPools{})
	for series := range scrapeMetrics(t, m) {
		if strings.Contains(series, `tenant=""`) {
			t.Errorf("series %s has an empty tenant", series)
		}
	}
}
