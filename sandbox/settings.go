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
// tenants (or fields) with none stored. For every limit, 0 means "no limit";
// MinWarm 0 means "no warm members kept ahead of demand".
type Defaults struct {
	MinWarm      int
	CreateRate   float64
	CreateBurst  int
	MaxSandboxes int
	MaxMemoryMB  int
}

// Effective is a tenant's settings with the defaults filled in.
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
	m  map[tenant.ID]store.Settings
}

// NewSettings returns a cache over st; call Refresh once (or Run) to fill it.
// A nil st makes a cache that only ever answers the defaults (tests).
func NewSettings(st *store.Store, d Defaults, log *slog.Logger) *Settings {
	if log == nil {
		log = slog.Default()
	}
	return &Settings{store: st, defaults: d, log: log, m: map[tenant.ID]store.Settings{}}
}

// Defaults returns the server-wide defaults.
func (s *Settings) Defaults() Defaults { return s.defaults }

// Stored returns tenant t's stored settings (nil fields: default). The rate
// limits of every route class (create, lifecycle, read, data plane) are read
// from here by package ratelimit's Policy, over its server defaults.
func (s *Settings) Stored(t tenant.ID) store.Settings {
	if s == nil {
		return store.Settings{}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[t]
}

// Set replaces tenant t's cached settings (tests; the store stays as is).
func (s *Settings) Set(t tenant.ID, st store.Settings) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[t] = st
}

// Get returns tenant t's effective settings.
func (s *Settings) Get(t tenant.ID) Effective {
	if s == nil {
		return Effective{}
	}
	st := s.Stored(t)
	d := s.defaults
	return Effective{
		MinWarm:      deref(st.MinWarm, d.MinWarm),
		CreateRate:   deref(st.CreateRate, d.CreateRate),
		CreateBurst:  deref(st.CreateBurst, d.CreateBurst),
		MaxSandboxes: deref(st.MaxSandboxes, d.MaxSandboxes),
		MaxMemoryMB:  deref(st.MaxMemoryMB, d.MaxMemoryMB),
	}
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

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
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
	m := make(map[tenant.ID]store.Settings, len(ts))
	for _, t := range ts {
		m[t.ID] = t.Settings
	}
	s.mu.Lock()
	changed := !maps.EqualFunc(s.m, m, sameSettings)
	s.m = m
	s.mu.Unlock()
	if changed {
		s.log.Info("tenant settings loaded", "tenants", len(m))
	}
	return nil
}

func sameSettings(a, b store.Settings) bool {
	return eq(a.MinWarm, b.MinWarm) && eq(a.CreateRate, b.CreateRate) && eq(a.CreateBurst, b.CreateBurst) &&
		eq(a.MaxSandboxes, b.MaxSandboxes) && eq(a.MaxMemoryMB, b.MaxMemoryMB) &&
		eq(a.LifecycleRate, b.LifecycleRate) && eq(a.LifecycleBurst, b.LifecycleBurst) &&
		eq(a.ReadRate, b.ReadRate) && eq(a.ReadBurst, b.ReadBurst) &&
		eq(a.DataPlaneRate, b.DataPlaneRate) && eq(a.DataPlaneBurst, b.DataPlaneBurst)
}

func eq[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// Run refreshes the cache every interval until ctx ends.
func (s *Settings) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Refresh(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("refresh tenant settings", "err", err)
			}
		}
	}
}
