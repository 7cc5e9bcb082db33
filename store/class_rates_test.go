package store

import (
	"errors"
	"math"
	"testing"
)

// TestClassRatesRoundTrip: the lifecycle, read and data-plane rates and
// bursts are stored, patched one by one and cleared back to NULL like the
// create ones.
func TestClassRatesRoundTrip(t *testing.T) {
	s := openStore(t, "")
	ctx := t.Context()
	tn := mustTenant(t, s, "acme")

	full := Settings{
		CreateRate: ptr(1.0), CreateBurst: ptr(2),
		LifecycleRate: ptr(3.5), LifecycleBurst: ptr(4),
		ReadRate: ptr(0.25), ReadBurst: ptr(6),
		DataPlaneRate: ptr(0.0), DataPlaneBurst: ptr(0), // zero is a value, not "default"
	}
	if _, err := s.SetTenantSettings(ctx, tn, full); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTenant(ctx, tn)
	if err != nil || !settingsEqual(got.Settings, full) {
		t.Fatalf("GetTenant() = %s, %v; want %s", fmtSettings(got.Settings), err, fmtSettings(full))
	}

	// Patch one class; the others stay.
	if _, err := s.UpdateTenantSettings(ctx, tn, func(st *Settings) { st.ReadRate, st.ReadBurst = ptr(9.0), nil }); err != nil {
		t.Fatal(err)
	}
	want := full
	want.ReadRate, want.ReadBurst = ptr(9.0), nil
	ts, err := s.ListTenants(ctx)
	if err != nil || len(ts) != 1 || !settingsEqual(ts[0].Settings, want) {
		t.Fatalf("ListTenants() = %+v, %v; want acme with %s", ts, err, fmtSettings(want))
	}

	if _, err := s.SetTenantSettings(ctx, tn, Settings{}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTenant(ctx, tn); err != nil || got.Settings != (Settings{}) {
		t.Errorf("after reset: %s, %v; want all nil", fmtSettings(got.Settings), err)
	}
}

func TestClassRatesInvalid(t *testing.T) {
	s := openStore(t, "")
	tn := mustTenant(t, s, "acme")
	for name, set := range map[string]Settings{
		"negative lifecycle rate":  {LifecycleRate: ptr(-1.0)},
		"nan read rate":            {ReadRate: ptr(math.NaN())},
		"inf dataplane rate":       {DataPlaneRate: ptr(math.Inf(1))},
		"negative lifecycle burst": {LifecycleBurst: ptr(-1)},
		"negative read burst":      {ReadBurst: ptr(-1)},
		"negative dataplane burst": {DataPlaneBurst: ptr(-2)},
	} {
		if _, err := s.SetTenantSettings(t.Context(), tn, set); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: SetTenantSettings(%s) = %v; want ErrInvalid", name, fmtSettings(set), err)
		}
	}
}

// TestMigrateClassRates: a database at schema 2 (create rates only) with a
// tenant that has create settings is migrated on open; the tenant keeps
// them, and the new classes read as server defaults (nil) until set.
func TestMigrateClassRates(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	tn := mustTenant(t, s, "acme")
	old := Settings{MinWarm: ptr(1), CreateRate: ptr(2.5), CreateBurst: ptr(5)}
	if _, err := s.SetTenantSettings(t.Context(), tn, old); err != nil {
		t.Fatal(err)
	}
	downgrade(t, s, 2)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	if v, err := s.SchemaVersion(t.Context()); err != nil || v != 3 {
		t.Fatalf("SchemaVersion() = %d, %v; want 3", v, err)
	}
	got, err := s.GetTenant(t.Context(), tn)
	if err != nil || !settingsEqual(got.Settings, old) {
		t.Fatalf("migrated tenant = %s, %v; want %s", fmtSettings(got.Settings), err, fmtSettings(old))
	}
	// The new columns take values after the migration.
	if _, err := s.UpdateTenantSettings(t.Context(), tn, func(st *Settings) { st.DataPlaneRate = ptr(7.0) }); err != nil {
		t.Fatal(err)
	}
	want := old
	want.DataPlaneRate = ptr(7.0)
	if got, err := s.GetTenant(t.Context(), tn); err != nil || !settingsEqual(got.Settings, want) {
		t.Errorf("after update = %s, %v; want %s", fmtSettings(got.Settings), err, fmtSettings(want))
	}
}
