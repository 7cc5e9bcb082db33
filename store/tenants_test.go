package store

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/tenant"
)

func TestCreateTenant(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
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
	})
}

func TestEnsureTenant(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
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
	})
}

func TestGetTenantMissing(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		if _, err := s.GetTenant(t.Context(), "nobody"); !errors.Is(err, ErrNotFound) {
			t.Errorf("GetTenant(nobody) = %v; want ErrNotFound", err)
		}
		if _, err := s.UpdateTenantSettings(t.Context(), "nobody", func(*tenant.Settings) {}); !errors.Is(err, ErrNotFound) {
			t.Errorf("UpdateTenantSettings(nobody) = %v; want ErrNotFound", err)
		}
	})
}

func TestTenantSettings(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")

		got, err := s.GetTenant(ctx, tn)
		if err != nil || !got.Settings.Equal(tenant.Settings{}) {
			t.Fatalf("new tenant settings = %+v, %v; want all unset (server defaults)", got.Settings, err)
		}

		full := func() tenant.Settings {
			return tenant.Settings{
				MinWarm: tenant.Of(2), MaxSandboxes: tenant.Of(0), MaxMemoryMB: tenant.Of(8192),
				Limits: map[tenant.Class]tenant.Limit{tenant.Create: {Rate: tenant.Of(1.5), Burst: tenant.Of(10)}},
			}
		}
		if _, err := s.SetTenantSettings(ctx, tn, full()); err != nil {
			t.Fatal(err)
		}
		// Patch one field; the others stay.
		if _, err := s.UpdateTenantSettings(ctx, tn, func(st *tenant.Settings) { st.MinWarm = tenant.Of(5) }); err != nil {
			t.Fatal(err)
		}
		got, err = s.GetTenant(ctx, tn)
		if err != nil {
			t.Fatal(err)
		}
		want := full()
		want.MinWarm = tenant.Of(5)
		if !got.Settings.Equal(want) {
			t.Errorf("settings = %+v; want %+v", got.Settings, want)
		}
		if !got.UpdatedAt.After(got.CreatedAt) {
			t.Errorf("UpdatedAt %v not after CreatedAt %v", got.UpdatedAt, got.CreatedAt)
		}

		// Back to defaults.
		if _, err := s.SetTenantSettings(ctx, tn, tenant.Settings{}); err != nil {
			t.Fatal(err)
		}
		ts, err := s.ListTenants(ctx)
		if err != nil || len(ts) != 1 || !ts[0].Settings.Equal(tenant.Settings{}) {
			t.Errorf("ListTenants() = %+v, %v; want acme with default settings", ts, err)
		}
	})
}

func TestTenantSettingsInvalid(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		tn := mustTenant(t, s, "acme")
		tests := []struct {
			name string
			set  tenant.Settings
		}{
			{"negative min warm", tenant.Settings{MinWarm: tenant.Of(-1)}},
			{"negative rate", createLimit(tenant.Limit{Rate: tenant.Of(-0.5)})},
			{"nan rate", createLimit(tenant.Limit{Rate: tenant.Of(math.NaN())})},
			{"inf rate", createLimit(tenant.Limit{Rate: tenant.Of(math.Inf(1))})},
			{"negative burst", createLimit(tenant.Limit{Burst: tenant.Of(-1)})},
			{"negative max sandboxes", tenant.Settings{MaxSandboxes: tenant.Of(-1)}},
			{"negative memory", tenant.Settings{MaxMemoryMB: tenant.Of(-1)}},
			{"unknown class", tenant.Settings{Limits: map[tenant.Class]tenant.Limit{"writes": {Rate: tenant.Of(1.0)}}}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if _, err := s.SetTenantSettings(t.Context(), tn, tt.set); !errors.Is(err, ErrInvalid) {
					t.Errorf("SetTenantSettings(%+v) = %v; want ErrInvalid", tt.set, err)
				}
			})
		}
		got, err := s.GetTenant(t.Context(), tn)
		if err != nil || !got.Settings.Equal(tenant.Settings{}) {
			t.Errorf("after rejected updates: settings = %+v, %v; want unchanged", got.Settings, err)
		}
	})
}

func TestListTenantsOrder(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
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
	})
}

// createLimit returns settings with only the create class's limit set.
func createLimit(l tenant.Limit) tenant.Settings {
	return tenant.Settings{Limits: map[tenant.Class]tenant.Limit{tenant.Create: l}}
}
