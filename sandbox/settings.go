package sandbox

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Defaults are the server-wide values of the per-tenant settings, for
// tenants (or values) with none stored: the effective settings of a tenant
// that has set nothing.
type Defaults = tenant.Effective

// Effective is what admission and the warm pools read of a tenant's
// effective settings (its stored tenant.Settings over the defaults), with the
// create limit flattened into CreateRate and CreateBurst.
type Effective struct {
	MinWarm      int
	CreateRate   float64
	CreateBurst  int
	MaxSandboxes int // 0: no limit
	MaxMemoryMB  int // 0: no limit
}

// Settings caches every tenant's stored settings, re-read from the store
// every poll interval, so that `sandboxd tenants set` (another process on
// the same SQLite file) takes effect on a running server within one
// interval. Lookups never touch the store.
type Settings struct {
	store    *store.Store
	defaults Defaults
	log      *slog.Logger

	mu sync.RWMutex
	m  map[tenant.ID]tenant.Settings
}

// NewSettings returns a cache over st; call Refresh once (or Run) to fill it.
// A nil st makes a cache that only ever answers the defaults (tests).
func NewSettings(st *store.Store, d Defaults, log *slog.Logger) *Settings {
	if log == nil {
		log = slog.Default()
	}
	return &Settings{store: st, defaults: d, log: log, m: map[tenant.ID]tenant.Settings{}}
}

// Defaults returns the server-wide defaults.
func (s *Settings) Defaults() Defaults { return s.defaults }

// Stored returns tenant t's stored settings (unset values: default), to be
// read only. The rate limits of every route class (create, lifecycle, read,
// data plane) are read from here by package ratelimit's Policy, over its
// server defaults.
func (s *Settings) Stored(t tenant.ID) tenant.Settings {
	if s == nil {
		return tenant.Settings{}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[t]
}

// Set replaces tenant t's cached settings (tests; the store stays as is).
func (s *Settings) Set(t tenant.ID, st tenant.Settings) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[t] = st
}

// Get returns tenant t's effective settings.
func (s *Settings) Get(t tenant.ID) Effective {
	if s == nil {
		return Effective{}
	}
	e := s.Stored(t).Over(s.defaults)
	create := e.Limit(tenant.Create)
	return Effective{
		MinWarm:      e.MinWarm,
		CreateRate:   create.Rate,
		CreateBurst:  create.Burst,
		MaxSandboxes: e.MaxSandboxes,
		MaxMemoryMB:  e.MaxMemoryMB,
	}
}

// Build returns what tenant t's template builds may use.
func (s *Settings) Build(t tenant.ID) tenant.BuildBudget {
	if s == nil {
		return tenant.BuildBudget{}
	}
	return s.Stored(t).Over(s.defaults).Build
}

// Volumes returns tenant t's volume settings in effect.
func (s *Settings) Volumes(t tenant.ID) tenant.VolumeBudget {
	if s == nil {
		return tenant.VolumeBudget{}
	}
	return s.Stored(t).Over(s.defaults).Volumes
}

// Tenants returns the tenants the cache knows of.
func (s *Settings) Tenants() []tenant.ID {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]tenant.ID, 0, len(s.m))
	for t := range s.m {
		out = append(out, t)
	}
	return out
}

// Refresh re-reads every tenant's settings from the store.
func (s *Settings) Refresh(ctx context.Context) error {
	if s.store == nil {
		return nil
	}
	ts, err := s.store.ListTenants(ctx)
	if err != nil {
		return err
	}
	m := make(map[tenant.ID]tenant.Settings, len(ts))
	for _, t := range ts {
		m[t.ID] = t.Settings
	}
	s.mu.Lock()
	changed := !maps.EqualFunc(s.m, m, tenant.Settings.Equal)
	s.m = m
	s.mu.Unlock()
	if changed {
		s.log.Info("tenant settings loaded", "tenants", len(m))
	}
	return nil
}

// Run refreshes the cache every interval until ctx ends.
func (s *Settings) Run(ctx context.Context, interval time.Duration) {
	every(ctx, interval, func(ctx context.Context) {
		if err := s.Refresh(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("refresh tenant settings", "err", err)
		}
	})
}

// every calls fn each interval until ctx ends; it returns when ctx is done.
func every(ctx context.Context, interval time.Duration, fn func(ctx context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}
