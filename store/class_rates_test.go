package store

import (
	"errors"
	"math"
	"testing"

	"github.com/sandboxd/sandboxd/tenant"
)

// TestClassRatesRoundTrip: the lifecycle, read and data-plane rates and
// bursts are stored, patched one by one and cleared back to NULL like the
// create ones.
func TestClassRatesRoundTrip(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")

		full := func() tenant.Settings {
			return tenant.Settings{Limits: map[tenant.Class]tenant.Limit{
				tenant.Create:    {Rate: tenant.Of(1.0), Burst: tenant.Of(2)},
				tenant.Lifecycle: {Rate: tenant.Of(3.5), Burst: tenant.Of(4)},
				tenant.Read:      {Rate: tenant.Of(0.25), Burst: tenant.Of(6)},
				tenant.DataPlane: {Rate: tenant.Of(0.0), Burst: tenant.Of(0)}, // zero is a value, not "default"
			}}
		}
		if _, err := s.SetTenantSettings(ctx, tn, full()); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetTenant(ctx, tn)
		if err != nil || !got.Settings.Equal(full()) {
			t.Fatalf("GetTenant() = %+v, %v; want %+v", got.Settings, err, full())
		}

		// Patch one class; the others stay.
		read := tenant.Limit{Rate: tenant.Of(9.0)}
		if _, err := s.UpdateTenantSettings(ctx, tn, func(st *tenant.Settings) { st.SetLimit(tenant.Read, read) }); err != nil {
			t.Fatal(err)
		}
		want := full()
		want.SetLimit(tenant.Read, read)
		ts, err := s.ListTenants(ctx)
		if err != nil || len(ts) != 1 || !ts[0].Settings.Equal(want) {
			t.Fatalf("ListTenants() = %+v, %v; want acme with %+v", ts, err, want)
		}

		if _, err := s.SetTenantSettings(ctx, tn, tenant.Settings{}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetTenant(ctx, tn); err != nil || !got.Settings.Equal(tenant.Settings{}) {
			t.Errorf("after reset: %+v, %v; want all unset", got.Settings, err)
		}
	})
}

func TestClassRatesInvalid(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		tn := mustTenant(t, s, "acme")
		for _, tt := range []struct {
			name  string
			class tenant.Class
			limit tenant.Limit
		}{
			{"negative lifecycle rate", tenant.Lifecycle, tenant.Limit{Rate: tenant.Of(-1.0)}},
			{"nan read rate", tenant.Read, tenant.Limit{Rate: tenant.Of(math.NaN())}},
			{"inf dataplane rate", tenant.DataPlane, tenant.Limit{Rate: tenant.Of(math.Inf(1))}},
			{"negative lifecycle burst", tenant.Lifecycle, tenant.Limit{Burst: tenant.Of(-1)}},
			{"negative read burst", tenant.Read, tenant.Limit{Burst: tenant.Of(-1)}},
			{"negative dataplane burst", tenant.DataPlane, tenant.Limit{Burst: tenant.Of(-2)}},
		} {
			set := tenant.Settings{Limits: map[tenant.Class]tenant.Limit{tt.class: tt.limit}}
			if _, err := s.SetTenantSettings(t.Context(), tn, set); !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: SetTenantSettings(%+v) = %v; want ErrInvalid", tt.name, set, err)
			}
		}
	})
}

// TestMigrateClassRates: a database at schema 2 (create rates only) with a
// tenant that has create settings is migrated on open; the tenant keeps
// them, and the new classes read as server defaults (nil) until set.
func TestMigrateClassRates(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		old := func() tenant.Settings {
			return tenant.Settings{MinWarm: tenant.Of(1), Limits: map[tenant.Class]tenant.Limit{
				tenant.Create: {Rate: tenant.Of(2.5), Burst: tenant.Of(5)},
			}}
		}
		s, tn := migratedFrom(t, db, 2, func(t *testing.T, s *Store, tn tenant.ID) {
			if _, err := s.SetTenantSettings(t.Context(), tn, old()); err != nil {
				t.Fatal(err)
			}
		})
		got, err := s.GetTenant(t.Context(), tn)
		if err != nil || !got.Settings.Equal(old()) {
			t.Fatalf("migrated tenant = %+v, %v; want %+v", got.Settings, err, old())
		}
		// The new columns take values after the migration.
		dataplane := tenant.Limit{Rate: tenant.Of(7.0)}
		if _, err := s.UpdateTenantSettings(t.Context(), tn, func(st *tenant.Settings) { st.SetLimit(tenant.DataPlane, dataplane) }); err != nil {
			t.Fatal(err)
		}
		want := old()
		want.SetLimit(tenant.DataPlane, dataplane)
		if got, err := s.GetTenant(t.Context(), tn); err != nil || !got.Settings.Equal(want) {
			t.Errorf("after update = %+v, %v; want %+v", got.Settings, err, want)
		}
	})
}
