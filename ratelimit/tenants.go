package ratelimit

import "github.com/sandboxd/sandboxd/tenant"

// Policy says which limit applies to a tenant's route class: the tenant's
// own setting of that class (tenant.Settings.Limits), its rate and burst
// each falling back on its own to the server default.
type Policy struct {
	// Defaults are the server's limits by class; a class absent has none.
	Defaults map[tenant.Class]Limit
	// Settings returns the tenant's settings (unset values: default). It is
	// called on every request, so it must be cheap (a cache); nil means
	// every tenant has the defaults.
	Settings func(tenant.ID) tenant.Settings
}

// Limit returns the limit of class c for tenant t.
func (p Policy) Limit(t tenant.ID, c tenant.Class) Limit {
	def := p.Defaults[c]
	if p.Settings == nil {
		return def
	}
	return Limit(p.Settings(t).Limit(c).Over(tenant.Bucket(def)))
}

// Tenants limits tenants by class.
type Tenants struct {
	*Limiter
	Policy Policy
}

// Allow takes a token from tenant t's bucket of class c.
func (ts *Tenants) Allow(t tenant.ID, c tenant.Class) Decision {
	return ts.Limiter.Allow(string(c)+"/"+string(t), ts.Policy.Limit(t, c))
}
