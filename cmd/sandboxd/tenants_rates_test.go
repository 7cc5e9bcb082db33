package main

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// ratesOpenStore opens a store in a fresh data dir.
func ratesOpenStore(t *testing.T) (*store.Store, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, dir
}

// ratesSet parses args as the flags of `tenants set` and applies them to
// tenant name, returning the printed table.
func ratesSet(t *testing.T, st *store.Store, name string, args ...string) string {
	t.Helper()
	var f settingFlags
	fs := flag.NewFlagSet("tenants set", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	var out bytes.Buffer
	if err := tenantsSet(t.Context(), st, name, &f, &out); err != nil {
		t.Fatalf("tenants set %s %v: %v", name, args, err)
	}
	return out.String()
}

// ratesColumns returns the cells of tenant name's row in a printed table,
// by column header.
func ratesColumns(t *testing.T, table, name string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(table), "\n")
	head := strings.Fields(lines[0])
	for _, l := range lines[1:] {
		cells := strings.Fields(l)
		if len(cells) == 0 || cells[0] != name {
			continue
		}
		if len(cells) != len(head) {
			t.Fatalf("row %q has %d cells, header %d", l, len(cells), len(head))
		}
		m := map[string]string{}
		for i, h := range head {
			m[h] = cells[i]
		}
		return m
	}
	t.Fatalf("no row for %s in\n%s", name, table)
	return nil
}

func TestTenantsSetClassRates(t *testing.T) {
	st, _ := ratesOpenStore(t)
	out := ratesSet(t, st, "acme",
		"--lifecycle-rate", "3", "--lifecycle-burst", "4",
		"--read-rate", "0.5", "--read-burst", "1",
		"--dataplane-rate", "100", "--dataplane-burst", "0",
		"--create-rate", "2")
	want := map[string]string{
		"TENANT": "acme", "MIN_WARM": "-", "CREATE_RATE": "2", "CREATE_BURST": "-",
		"LIFECYCLE_RATE": "3", "LIFECYCLE_BURST": "4", "READ_RATE": "0.5", "READ_BURST": "1",
		"DATAPLANE_RATE": "100", "DATAPLANE_BURST": "0",
	}
	got := ratesColumns(t, out, "acme")
	for k, v := range want {
		if got[k] != v {
			t.Errorf("set: %s = %q, want %q\n%s", k, got[k], v, out)
		}
	}
	tn, err := st.GetTenant(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	stored := tenant.Settings{Limits: map[tenant.Class]tenant.Limit{
		tenant.Create:    {Rate: tenant.Of(2.0)},
		tenant.Lifecycle: {Rate: tenant.Of(3.0), Burst: tenant.Of(4)},
		tenant.Read:      {Rate: tenant.Of(0.5), Burst: tenant.Of(1)},
		tenant.DataPlane: {Rate: tenant.Of(100.0), Burst: tenant.Of(0)},
	}}
	if !tn.Settings.Equal(stored) {
		t.Fatalf("stored settings: %+v; want %+v", tn.Settings, stored)
	}

	// Only the named flags change; "default" clears one back to NULL.
	ratesSet(t, st, "acme", "--read-rate", "default", "--dataplane-burst", "default", "--lifecycle-burst", "9")
	var list bytes.Buffer
	all, err := st.ListTenants(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := printTenants(&list, all); err != nil {
		t.Fatal(err)
	}
	want["READ_RATE"], want["DATAPLANE_BURST"], want["LIFECYCLE_BURST"] = "-", "-", "9"
	got = ratesColumns(t, list.String(), "acme")
	for k, v := range want {
		if got[k] != v {
			t.Errorf("list after reset: %s = %q, want %q\n%s", k, got[k], v, list.String())
		}
	}
}

func TestTenantsSetClassRatesFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--read-rate", "-1"}, false},
		{[]string{"--read-burst", "x"}, false},
		{[]string{"--lifecycle-burst", "-3"}, false},
		{[]string{"--dataplane-rate", "nope"}, false},
		{[]string{"--dataplane-rate", "default"}, true},
		{[]string{"--lifecycle-rate", "1.5"}, true},
	} {
		var f settingFlags
		fs := flag.NewFlagSet("tenants set", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.register(fs)
		err := fs.Parse(tc.args)
		if (err == nil) != tc.ok {
			t.Errorf("parse %v: %v, want ok=%v", tc.args, err, tc.ok)
		}
		if tc.ok && !f.any() {
			t.Errorf("parse %v: any() = false", tc.args)
		}
	}
}

// TestTenantsCommandClassRates runs `tenants set` and `tenants list` as the
// command line does, on a data dir.
func TestTenantsCommandClassRates(t *testing.T) {
	st, dir := ratesOpenStore(t)
	if err := tenants([]string{"set", "acme", "--data-dir", dir, "--read-rate", "7", "--dataplane-burst", "11"}); err != nil {
		t.Fatal(err)
	}
	if err := tenants([]string{"list", "--data-dir", dir}); err != nil {
		t.Fatal(err)
	}
	tn, err := st.GetTenant(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	want := tenant.Settings{Limits: map[tenant.Class]tenant.Limit{
		tenant.Read:      {Rate: tenant.Of(7.0)},
		tenant.DataPlane: {Burst: tenant.Of(11)},
	}}
	if !tn.Settings.Equal(want) {
		t.Fatalf("stored settings after tenants set: %+v; want %+v", tn.Settings, want)
	}
}

// `tenants set` without a setting names every flag it takes, the volume
// ones too, and changes nothing.
func TestTenantsSetNothing(t *testing.T) {
	st, _ := ratesOpenStore(t)
	err := tenantsSet(t.Context(), st, "a", new(settingFlags), io.Discard)
	if err == nil {
		t.Fatal("tenants set without flags: want an error")
	}
	for _, name := range []string{"--max-volumes", "--max-volumes-mb", "--volume-size-mb", "--min-warm", "--read-rate", "--build-timeout-s"} {
		if !strings.Contains(err.Error()+",", name+",") {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
	if ts, err := st.ListTenants(t.Context()); err != nil || len(ts) != 0 {
		t.Errorf("tenants after a refused set: %v, %v; want none", ts, err)
	}
}
