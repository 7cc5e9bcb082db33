package tenant

import (
	"fmt"
	"math"
	"slices"

	"github.com/sandboxd/sandboxd/errdefs"
)

// Class is a route class. Each tenant has one rate limit (and token bucket)
// per class, so a flood of reads never starves its creates and the other way
// round.
type Class string

const (
	// Create is what makes a sandbox run: create, resume, connect, fork.
	Create Class = "create"
	// Lifecycle is every other mutating call (kill, pause, timeout, ...).
	Lifecycle Class = "lifecycle"
	// Read is GET and HEAD: get, list, metrics, logs, templates.
	Read Class = "read"
	// DataPlane is every request through the data-plane proxy (envd and
	// user ports), counted against the tenant owning the sandbox.
	DataPlane Class = "dataplane"
)

// Classes lists the route classes.
var Classes = []Class{Create, Lifecycle, Read, DataPlane}

// Value is one tenant setting. The zero Value is unset: the server default
// applies. A set Value is used as is, zero included (for a limit, 0 means
// "no limit", which differs from "whatever the server says").
type Value[T int | float64] struct {
	v   T
	set bool
}

// Of returns a set Value.
func Of[T int | float64](v T) Value[T] { return Value[T]{v: v, set: true} }

// Get returns the value and whether it is set.
func (v Value[T]) Get() (T, bool) { return v.v, v.set }

// IsSet reports whether v overrides the server default.
func (v Value[T]) IsSet() bool { return v.set }

// Or returns v if set, else def.
func (v Value[T]) Or(def T) T {
	if v.set {
		return v.v
	}
	return def
}

// String returns the value, or "default" when unset.
func (v Value[T]) String() string {
	if !v.set {
		return "default"
	}
	return fmt.Sprint(v.v)
}

// Bucket is the shape of a token bucket: Rate tokens per second, up to
// Burst. A Rate of 0 means no limit.
type Bucket struct {
	Rate  float64
	Burst int
}

// Limit is a tenant's setting of one route class's rate limit. Rate and
// Burst fall back to the server default each on its own, so setting only a
// tenant's read rate keeps the default read burst.
type Limit struct {
	Rate  Value[float64]
	Burst Value[int]
}

// Over returns l with its unset halves taken from def.
func (l Limit) Over(def Bucket) Bucket {
	return Bucket{Rate: l.Rate.Or(def.Rate), Burst: l.Burst.Or(def.Burst)}
}

// Settings are what a tenant has set of its pool, quota and rate settings;
// everything unset falls back to the server default (see Over).
//
// The Limits map is shared by copies of a Settings: a Settings handed out by
// a cache must be read only (store and CLI build their own).
type Settings struct {
	MinWarm      Value[int] // warm sandboxes kept per pool
	MaxSandboxes Value[int] // live sandboxes at once, paused included
	MaxMemoryMB  Value[int] // total memory of live sandboxes, MiB
	// Build limits the tenant's template builds.
	Build BuildLimits
	// Volumes limits the tenant's volumes.
	Volumes VolumeLimits
	// Limits holds the rate limits by route class; a class absent from it
	// has both halves unset.
	Limits map[Class]Limit
}

// BuildLimits are a tenant's settings for its template builds: a build
// sandbox's CPUs, memory and disk (where the template names none; a
// template's own CPUs and memory above these are lowered to them), and how
// long one build may run.
type BuildLimits struct {
	CPU, MemoryMB, DiskMB, TimeoutS Value[int]
}

// VolumeLimits are a tenant's settings for its volumes: how many it may
// have, their total size (MiB), and the size a new volume gets (MiB; E2B's
// create names none).
type VolumeLimits struct {
	Max, MaxMB, SizeMB Value[int]
}

// VolumeBudget is VolumeLimits in effect; 0 Max or MaxMB means no limit.
type VolumeBudget struct {
	Max, MaxMB, SizeMB int
}

// BuildBudget is BuildLimits in effect; 0 CPU means the server's default
// sandbox CPUs.
type BuildBudget struct {
	CPU, MemoryMB, DiskMB, TimeoutS int
}

// Limit returns the setting of class c (unset when absent).
func (s Settings) Limit(c Class) Limit { return s.Limits[c] }

// SetLimit sets the setting of class c; a Limit with both halves unset is
// removed, so that equal settings have equal maps.
func (s *Settings) SetLimit(c Class, l Limit) {
	if l == (Limit{}) {
		delete(s.Limits, c)
		return
	}
	if s.Limits == nil {
		s.Limits = map[Class]Limit{}
	}
	s.Limits[c] = l
}

// Equal reports whether s and o set the same values.
func (s Settings) Equal(o Settings) bool {
	if s.MinWarm != o.MinWarm || s.MaxSandboxes != o.MaxSandboxes || s.MaxMemoryMB != o.MaxMemoryMB || s.Build != o.Build || s.Volumes != o.Volumes {
		return false
	}
	for c, l := range s.Limits {
		if o.Limits[c] != l {
			return false
		}
	}
	for c, l := range o.Limits {
		if s.Limits[c] != l {
			return false
		}
	}
	return true
}

// Validate reports a negative count, a negative, NaN or infinite rate, or a
// limit of an unknown class, as errdefs.ErrInvalidArgument (the store's
// ErrInvalid).
func (s Settings) Validate() error {
	for _, f := range []struct {
		name string
		v    Value[int]
	}{{"min warm", s.MinWarm}, {"max sandboxes", s.MaxSandboxes}, {"max memory", s.MaxMemoryMB},
		{"build cpu", s.Build.CPU}, {"build memory", s.Build.MemoryMB}, {"build disk", s.Build.DiskMB}, {"build timeout", s.Build.TimeoutS},
		{"max volumes", s.Volumes.Max}, {"max volumes size", s.Volumes.MaxMB}, {"volume size", s.Volumes.SizeMB}} {
		if err := nonNegative(f.name, f.v); err != nil {
			return err
		}
	}
	for c, l := range s.Limits {
		if !slices.Contains(Classes, c) {
			return fmt.Errorf("%w: unknown route class %q", errdefs.ErrInvalidArgument, c)
		}
		if err := nonNegative(string(c)+" burst", l.Burst); err != nil {
			return err
		}
		if r, ok := l.Rate.Get(); ok && (r < 0 || math.IsNaN(r) || math.IsInf(r, 0)) {
			return fmt.Errorf("%w: %s rate %v is not a finite non-negative number", errdefs.ErrInvalidArgument, c, r)
		}
	}
	return nil
}

func nonNegative(name string, v Value[int]) error {
	if n, ok := v.Get(); ok && n < 0 {
		return fmt.Errorf("%w: %s %d is negative", errdefs.ErrInvalidArgument, name, n)
	}
	return nil
}

// Effective is a tenant's settings with the server defaults filled in; the
// server defaults themselves are the Effective settings of a tenant that set
// nothing. For every limit, 0 means "no limit"; MinWarm 0 means "no warm
// members kept ahead of demand". A class absent from Limits has no limit.
type Effective struct {
	MinWarm      int
	MaxSandboxes int
	MaxMemoryMB  int
	Build        BuildBudget
	Volumes      VolumeBudget
	Limits       map[Class]Bucket
}

// Limit returns the limit of class c.
func (e Effective) Limit(c Class) Bucket { return e.Limits[c] }

// Over returns s with every unset value taken from def.
func (s Settings) Over(def Effective) Effective {
	e := Effective{
		MinWarm:      s.MinWarm.Or(def.MinWarm),
		MaxSandboxes: s.MaxSandboxes.Or(def.MaxSandboxes),
		MaxMemoryMB:  s.MaxMemoryMB.Or(def.MaxMemoryMB),
		Build: BuildBudget{
			CPU: s.Build.CPU.Or(def.Build.CPU), MemoryMB: s.Build.MemoryMB.Or(def.Build.MemoryMB),
			DiskMB: s.Build.DiskMB.Or(def.Build.DiskMB), TimeoutS: s.Build.TimeoutS.Or(def.Build.TimeoutS),
		},
		Volumes: VolumeBudget{
			Max: s.Volumes.Max.Or(def.Volumes.Max), MaxMB: s.Volumes.MaxMB.Or(def.Volumes.MaxMB),
			SizeMB: s.Volumes.SizeMB.Or(def.Volumes.SizeMB),
		},
		Limits: make(map[Class]Bucket, len(Classes)),
	}
	for _, c := range Classes {
		e.Limits[c] = s.Limit(c).Over(def.Limit(c))
	}
	return e
}
