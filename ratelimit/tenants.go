package ratelimit

import (
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Class is a route class; each tenant has one bucket per class, so a flood
// of reads never starves its creates and the other way round.
type Class string

const (
	// Create is what makes a sandbox run: create, resume, connect, fork.
	Create Class = "create"
	// Lifecycle is every other mutating call (kill, pause, timeout, ...).
	Lifecycle Class = "lifecycle"
	// Read is GET and HEAD: get, list, metrics, logs, templates.
	Read Class = "read"
	// DataPlane is every request through the data-plane proxy (envd and
	// user ports), keyed by the tenant owning the sandbox.
	DataPlane Class = "dataplane"
)

// Classes lists the tenant classes.
var Classes = []Class{Create, Lifecycle, Read, DataPlane}

// Policy says which limit applies to a tenant's class: the tenant's own
// rate and burst of that class (store settings: create_rate, lifecycle_rate,
// read_rate, dataplane_rate and their bursts), each falling back on its own
// to the server default.
type Policy struct {
	Defaults map[Class]Limit
	// Settings returns the tenant's stored settings (nil fields: default).
	// It is called on every request, so it must be cheap (a cache).
	Settings func(tenant.ID) store.Settings
}

// Limit returns the limit of class c for tenant t.
func (p Policy) Limit(t tenant.ID, c Class) Limit {
	l := p.Defaults[c]
	if p.Settings == nil {
		return l
	}
	rate, burst := Override(p.Settings(t), c)
	if rate != nil {
		l.Rate = *rate
	}
	if burst != nil {
		l.Burst = *burst
	}
	return l
}

// Override returns the fields of s that override class c's rate and burst
// (nil: none; an unknown class has none).
func Override(s store.Settings, c Class) (rate *float64, burst *int) {
	switch c {
	case Create:
		return s.CreateRate, s.CreateBurst
	case Lifecycle:
		return s.LifecycleRate, s.LifecycleBurst
	case Read:
		return s.ReadRate, s.ReadBurst
	case DataPlane:
		return s.DataPlaneRate, s.DataPlaneBurst
	}
	return nil, nil
}

// Tenants limits tenants by class.
type Tenants struct {
	*Limiter
	Policy Policy
}

// Allow takes a token from tenant t's bucket of class c.
func (ts *Tenants) Allow(t tenant.ID, c Class) Decision {
	return ts.Limiter.Allow(string(c)+"/"+string(t), ts.Policy.Limit(t, c))
}
