package store

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/tenant"
)

func TestCreateTenant(t *testing.T) {
	s := openStore(t, "")
	mustTenant(t, s, "taken")
	tests := []struct {
		name    string
		wantErr error
	}{
		{"a", nil},
		{"team-a", nil},
		{"0abc-9", nil},
		{strings.Repeat("x", 63), nil},
		{strings.Repeat("x", 64), ErrInvalid},
		{"", ErrInvalid},
		{"-lead", ErrInvalid},
		{"Upper", ErrInvalid},
		{"under_score", ErrInvalid},
		{"dot.ted", ErrInvalid},
		{"new\nline", ErrInvalid},
		{"taken", ErrConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.CreateTenant(t.Context(), tt.name)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr != nil) != (err != nil) {
				t.Fatalf("CreateTenant(%q) = %v; want %v", tt.name, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got.ID != tenant.ID(tt.name) || got.CreatedAt.IsZero() {
				t.Errorf("CreateTenant(%q) = %+v", tt.name, got)
			}
			back, err := s.GetTenant(t.Context(), got.ID)
			if err != nil || back.ID != got.ID || !back.CreatedAt.Equal(got.CreatedAt) {
				t.Errorf("GetTenant(%q) = %+v, %v; want %+v", got.ID, back, err, got)
			}
		})
	}
}

func TestEnsureTenant(t *testing.T) {
	s := openStore(t, "")
	first, err := s.EnsureTenant(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.EnsureTenant(t.Context(), "acme")
	if err != nil || !second.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("EnsureTenant twice = %+v, %v; want %+v", second, err, first)
	}
	if _, err := s.EnsureTenant(t.Context(), "Bad"); !errors.Is(err, ErrInvalid) {
		t.Errorf("EnsureTenant(Bad) = %v; want ErrInvalid", err)
	}
}

func TestGetTenantMissing(t *testing.T) {
	s := openStore(t, "")
	if _, err := s.GetTenant(t.Context(), "nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetTenant(nobody) = %v; want ErrNotFound", err)
	}
	if _, err := s.UpdateTenantSettings(t.Context(), "nobody", func(*Settings) {}); !errors.Is(err, ErrNotFound) {
		t.Errorf("UpdateTenantSettings(nobody) = %v; want ErrNotFound", err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestTenantSettings(t *testing.T) {
	s := openStore(t, "")
	ctx := t.Context()
	tn := mustTenant(t, s, "acme")

	got, err := s.GetTenant(ctx, tn)
	if err != nil || got.Settings != (Settings{}) {
		t.Fatalf("new tenant settings = %+v, %v; want all nil (server defaults)", got.Settings, err)
	}

	full := Settings{MinWarm: ptr(2), CreateRate: ptr(1.5), CreateBurst: ptr(10), MaxSandboxes: ptr(0), MaxMemoryMB: ptr(8192)}
	if _, err := s.SetTenantSettings(ctx, tn, full); err != nil {
		t.Fatal(err)
	}
	// Patch one field; the others stay.
	if _, err := s.UpdateTenantSettings(ctx, tn, func(st *Settings) { st.MinWarm = ptr(5) }); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetTenant(ctx, tn)
	if err != nil {
		t.Fatal(err)
	}
	want := full
	want.MinWarm = ptr(5)
	if !settingsEqual(got.Settings, want) {
		t.Errorf("settings = %s; want %s", fmtSettings(got.Settings), fmtSettings(want))
	}
	if !got.UpdatedAt.After(got.CreatedAt) {
		t.Errorf("UpdatedAt %v not after CreatedAt %v", got.UpdatedAt, got.CreatedAt)
	}

	// Back to defaults.
	if _, err := s.SetTenantSettings(ctx, tn, Settings{}); err != nil {
		t.Fatal(err)
	}
	ts, err := s.ListTenants(ctx)
	if err != nil || len(ts) != 1 || ts[0].Settings != (Settings{}) {
		t.Errorf("ListTenants() = %+v, %v; want acme with default settings", ts, err)
	}
}

func TestTenantSettingsInvalid(t *testing.T) {
	s := openStore(t, "")
	tn := mustTenant(t, s, "acme")
	tests := []struct {
		name string
		set  Settings
	}{
		{"negative min warm", Settings{MinWarm: ptr(-1)}},
		{"negative rate", Settings{CreateRate: ptr(-0.5)}},
		{"nan rate", Settings{CreateRate: ptr(math.NaN())}},
		{"inf rate", Settings{CreateRate: ptr(math.Inf(1))}},
		{"negative burst", Settings{CreateBurst: ptr(-1)}},
		{"negative max sandboxes", Settings{MaxSandboxes: ptr(-1)}},
		{"negative memory", Settings{MaxMemoryMB: ptr(-1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.SetTenantSettings(t.Context(), tn, tt.set); !errors.Is(err, ErrInvalid) {
				t.Errorf("SetTenantSettings(%s) = %v; want ErrInvalid", fmtSettings(tt.set), err)
			}
		})
	}
	got, err := s.GetTenant(t.Context(), tn)
	if err != nil || got.Settings != (Settings{}) {
		t.Errorf("after rejected updates: settings = %s, %v; want unchanged", fmtSettings(got.Settings), err)
	}
}

func TestListTenantsOrder(t *testing.T) {
	s := openStore(t, "")
	for _, n := range []string{"c", "a", "b"} {
		mustTenant(t, s, n)
	}
	ts, err := s.ListTenants(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tn := range ts {
		got = append(got, string(tn.ID))
	}
	if strings.Join(got, ",") != "a,b,c" {
		t.Errorf("ListTenants() = %v; want [a b c]", got)
	}
}

func settingsEqual(a, b Settings) bool {
	return fmtSettings(a) == fmtSettings(b)
}

// fmtSettings shows the values behind the pointers.
func fmtSettings(s Settings) string {
	return fmt.Sprintf("{MinWarm:%s CreateRate:%s CreateBurst:%s MaxSandboxes:%s MaxMemoryMB:%s "+
		"LifecycleRate:%s LifecycleBurst:%s ReadRate:%s ReadBurst:%s DataPlaneRate:%s DataPlaneBurst:%s}",
		deref(s.MinWarm), deref(s.CreateRate), deref(s.CreateBurst), deref(s.MaxSandboxes), deref(s.MaxMemoryMB),
		deref(s.LifecycleRate), deref(s.LifecycleBurst), deref(s.ReadRate), deref(s.ReadBurst),
		deref(s.DataPlaneRate), deref(s.DataPlaneBurst))
}

func deref[T any](p *T) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}
