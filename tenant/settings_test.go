package tenant

import (
	"errors"
	"math"
	"testing"

	"github.com/sandboxd/sandboxd/errdefs"
)

func TestValue(t *testing.T) {
	tests := []struct {
		name    string
		v       Value[float64]
		wantSet bool
		wantOr  float64
		wantStr string
	}{
		{"unset", Value[float64]{}, false, 9, "default"},
		{"zero is a value", Of(0.0), true, 0, "0"},
		{"fraction", Of(0.25), true, 0.25, "0.25"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.v.IsSet(); got != tt.wantSet {
				t.Errorf("IsSet() = %v, want %v", got, tt.wantSet)
			}
			if got := tt.v.Or(9); got != tt.wantOr {
				t.Errorf("Or(9) = %v, want %v", got, tt.wantOr)
			}
			if got := tt.v.String(); got != tt.wantStr {
				t.Errorf("String() = %q, want %q", got, tt.wantStr)
			}
		})
	}
}

func TestOver(t *testing.T) {
	def := Effective{MinWarm: 1, MaxSandboxes: 10, MaxMemoryMB: 4096, Limits: map[Class]Bucket{
		Create: {Rate: 5, Burst: 20}, Lifecycle: {Rate: 20, Burst: 50}, Read: {Rate: 50, Burst: 100},
	}}
	tests := []struct {
		name string
		s    Settings
		want Effective
	}{
		{"nothing set: the defaults", Settings{}, def},
		{"counts set, zero included", Settings{MinWarm: Of(3), MaxSandboxes: Of(0)},
			Effective{MinWarm: 3, MaxSandboxes: 0, MaxMemoryMB: 4096, Limits: def.Limits}},
		{"rate and burst fall back each on its own", Settings{Limits: map[Class]Limit{
			Create: {Rate: Of(1.0)}, Read: {Burst: Of(7)}, DataPlane: {Rate: Of(9.0), Burst: Of(8)},
		}}, Effective{MinWarm: 1, MaxSandboxes: 10, MaxMemoryMB: 4096, Limits: map[Class]Bucket{
			Create: {Rate: 1, Burst: 20}, Lifecycle: {Rate: 20, Burst: 50}, Read: {Rate: 50, Burst: 7},
			DataPlane: {Rate: 9, Burst: 8},
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.s.Over(def)
			if got.MinWarm != tt.want.MinWarm || got.MaxSandboxes != tt.want.MaxSandboxes || got.MaxMemoryMB != tt.want.MaxMemoryMB {
				t.Errorf("Over() = %+v, want %+v", got, tt.want)
			}
			for _, c := range Classes {
				if got.Limit(c) != tt.want.Limit(c) {
					t.Errorf("Over().Limit(%s) = %+v, want %+v", c, got.Limit(c), tt.want.Limit(c))
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	one := func(c Class, l Limit) Settings { return Settings{Limits: map[Class]Limit{c: l}} }
	tests := []struct {
		name string
		s    Settings
		ok   bool
	}{
		{"empty", Settings{}, true},
		{"zeros", Settings{MinWarm: Of(0), Limits: map[Class]Limit{Read: {Rate: Of(0.0), Burst: Of(0)}}}, true},
		{"negative min warm", Settings{MinWarm: Of(-1)}, false},
		{"negative max sandboxes", Settings{MaxSandboxes: Of(-1)}, false},
		{"negative memory", Settings{MaxMemoryMB: Of(-1)}, false},
		{"negative rate", one(Create, Limit{Rate: Of(-0.5)}), false},
		{"nan rate", one(Read, Limit{Rate: Of(math.NaN())}), false},
		{"inf rate", one(DataPlane, Limit{Rate: Of(math.Inf(1))}), false},
		{"negative burst", one(Lifecycle, Limit{Burst: Of(-1)}), false},
		{"unknown class", one("writes", Limit{Rate: Of(1.0)}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate()
			if tt.ok && err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
			if !tt.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Validate() = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

func TestEqualAndSetLimit(t *testing.T) {
	var s Settings
	s.SetLimit(Read, Limit{Rate: Of(1.0)})
	if s.Equal(Settings{}) || !s.Equal(Settings{Limits: map[Class]Limit{Read: {Rate: Of(1.0)}}}) {
		t.Fatalf("after SetLimit(read): %+v", s)
	}
	// Clearing both halves removes the class: equal to never having set it.
	s.SetLimit(Read, Limit{})
	if !s.Equal(Settings{}) || len(s.Limits) != 0 {
		t.Fatalf("after clearing read: %+v, want equal to unset", s)
	}
	tests := []struct {
		name string
		a, b Settings
		want bool
	}{
		{"unset vs zero", Settings{}, Settings{MinWarm: Of(0)}, false},
		{"nil vs empty map", Settings{}, Settings{Limits: map[Class]Limit{}}, true},
		{"other class", Settings{Limits: map[Class]Limit{Read: {Burst: Of(1)}}},
			Settings{Limits: map[Class]Limit{Create: {Burst: Of(1)}}}, false},
		{"rate vs burst", Settings{Limits: map[Class]Limit{Read: {Burst: Of(1)}}},
			Settings{Limits: map[Class]Limit{Read: {Rate: Of(1.0)}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a.Equal(tt.b); got != tt.want {
				t.Errorf("Equal() = %v, want %v", got, tt.want)
			}
			if got := tt.b.Equal(tt.a); got != tt.want {
				t.Errorf("reversed Equal() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestVolumeSettings(t *testing.T) {
	def := Effective{Volumes: VolumeBudget{Max: 20, MaxMB: 20480, SizeMB: 1024}}
	s := Settings{Volumes: VolumeLimits{Max: Of(0), SizeMB: Of(256)}}
	if got, want := s.Over(def).Volumes, (VolumeBudget{Max: 0, MaxMB: 20480, SizeMB: 256}); got != want {
		t.Errorf("Over(def).Volumes = %+v; want %+v", got, want)
	}
	if s.Equal(Settings{}) {
		t.Error("settings with volume limits Equal the empty settings")
	}
	if err := (Settings{Volumes: VolumeLimits{MaxMB: Of(-1)}}).Validate(); err == nil {
		t.Error("Validate(negative max volumes size) = nil; want an error")
	}
}
