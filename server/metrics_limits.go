package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/pool"
)

// PoolStats is what /metrics reads of the warm pools (package pool).
type PoolStats interface {
	Stats() []pool.Stat
	Counts() []pool.Count
}

// limitMetrics are the rate limiter's and the warm pools' series, registered
// on the server's registry:
//
//	sandboxd_ratelimit_rejections_total{tenant,class}  429s from the limiters
//	sandboxd_pool_members{tenant,template,state}       ready / starting members
//	sandboxd_pool_target{tenant,template}              current target size
//	sandboxd_pool_claims_total{tenant,template,result} hit (own pool) / spare / miss
//	sandboxd_spare_members{template,state}             the host-wide spare pools
//	sandboxd_spare_target{template}
//	sandboxd_spare_claims_total{template,result}       hit / miss, of claims that reached it
type limitMetrics struct {
	rejections *prometheus.CounterVec
}

func newLimitMetrics(reg *prometheus.Registry, pools PoolStats) *limitMetrics {
	lm := &limitMetrics{rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_ratelimit_rejections_total",
		Help: "Requests refused with 429 by the rate limiters, by tenant and class (create, lifecycle, read, dataplane; ip before auth).",
	}, []string{"tenant", "class"})}
	if reg == nil {
		return lm
	}
	reg.MustRegister(lm.rejections)
	if pools != nil {
		reg.MustRegister(poolCollector{pools})
	}
	return lm
}

func (lm *limitMetrics) rejected(tenant, class string) {
	if lm == nil {
		return
	}
	lm.rejections.WithLabelValues(tenant, class).Inc()
}

var (
	poolMembersDesc = prometheus.NewDesc("sandboxd_pool_members",
		"Warm pool members by tenant, template and state (ready: claimable; starting: being created).",
		[]string{"tenant", "template", "state"}, nil)
	poolTargetDesc = prometheus.NewDesc("sandboxd_pool_target",
		"Warm pool target size (min_warm or the adaptive size, capped) by tenant and template.",
		[]string{"tenant", "template"}, nil)
	poolClaimsDesc = prometheus.NewDesc("sandboxd_pool_claims_total",
		"Warm pool claims by tenant, template and result (hit: served from the tenant's pool; spare: from the host-wide spare pool; miss: cold create).",
		[]string{"tenant", "template", "result"}, nil)
	poolWaitedDesc = prometheus.NewDesc("sandboxd_pool_waited_total",
		"Misses (counted in sandboxd_pool_claims_total as result=miss) that waited for a cold-create slot and were served by the pool's refill instead.",
		[]string{"tenant", "template"}, nil)
	spareMembersDesc = prometheus.NewDesc("sandboxd_spare_members",
		"Host-wide spare pool members (never used, of no tenant) by template and state (ready: claimable; starting: being created).",
		[]string{"template", "state"}, nil)
	spareTargetDesc = prometheus.NewDesc("sandboxd_spare_target",
		"Host-wide spare pool target size (the --spare-min floor or the size the host-wide claim rate asks for, capped) by template.",
		[]string{"template"}, nil)
	spareClaimsDesc = prometheus.NewDesc("sandboxd_spare_claims_total",
		"Claims that found their tenant's pool empty and tried the spare pool, by template and result (hit: served; miss: the spare pool was empty too).",
		[]string{"template", "result"}, nil)
)

type poolCollector struct{ p PoolStats }

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, poolMembersDesc, poolTargetDesc, poolClaimsDesc, poolWaitedDesc, spareMembersDesc, spareTargetDesc, spareClaimsDesc)
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	type tt struct{ tenant, template string }
	type agg struct{ ready, starting, target int }
	sums := map[tt]*agg{}
	for _, s := range c.p.Stats() {
		k := tt{string(s.Key.Tenant), s.Key.Template}
		a := sums[k]
		if a == nil {
			a = &agg{}
			sums[k] = a
		}
		a.ready += s.Ready
		a.starting += s.Starting
		a.target += s.Target
	}
	for k, a := range sums {
		if k.tenant == "" {
			ch <- prometheus.MustNewConstMetric(spareMembersDesc, prometheus.GaugeValue, float64(a.ready), k.template, "ready")
			ch <- prometheus.MustNewConstMetric(spareMembersDesc, prometheus.GaugeValue, float64(a.starting), k.template, "starting")
			ch <- prometheus.MustNewConstMetric(spareTargetDesc, prometheus.GaugeValue, float64(a.target), k.template)
			continue
		}
		ch <- prometheus.MustNewConstMetric(poolMembersDesc, prometheus.GaugeValue, float64(a.ready), k.tenant, k.template, "ready")
		ch <- prometheus.MustNewConstMetric(poolMembersDesc, prometheus.GaugeValue, float64(a.starting), k.tenant, k.template, "starting")
		ch <- prometheus.MustNewConstMetric(poolTargetDesc, prometheus.GaugeValue, float64(a.target), k.tenant, k.template)
	}
	for _, cnt := range c.p.Counts() {
		if cnt.Tenant == "" {
			ch <- prometheus.MustNewConstMetric(spareClaimsDesc, prometheus.CounterValue, float64(cnt.Hits), cnt.Template, "hit")
			ch <- prometheus.MustNewConstMetric(spareClaimsDesc, prometheus.CounterValue, float64(cnt.Misses), cnt.Template, "miss")
			continue
		}
		ch <- prometheus.MustNewConstMetric(poolClaimsDesc, prometheus.CounterValue, float64(cnt.Hits), string(cnt.Tenant), cnt.Template, "hit")
		ch <- prometheus.MustNewConstMetric(poolClaimsDesc, prometheus.CounterValue, float64(cnt.Spare), string(cnt.Tenant), cnt.Template, "spare")
		ch <- prometheus.MustNewConstMetric(poolClaimsDesc, prometheus.CounterValue, float64(cnt.Misses), string(cnt.Tenant), cnt.Template, "miss")
		ch <- prometheus.MustNewConstMetric(poolWaitedDesc, prometheus.CounterValue, float64(cnt.Waited), string(cnt.Tenant), cnt.Template)
	}
}
