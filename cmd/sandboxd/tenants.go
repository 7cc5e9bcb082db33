package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// optInt and optFloat are flags for one tenant setting: unset leaves it as
// it is, a number sets it, "default" clears it back to the server default.
type optInt struct {
	set, clear bool
	v          int
}

func (o *optInt) String() string {
	if o == nil || !o.set {
		return ""
	}
	if o.clear {
		return "default"
	}
	return strconv.Itoa(o.v)
}

func (o *optInt) Set(s string) error {
	o.set = true
	if s == "default" {
		o.clear = true
		return nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return errors.New(`want a whole number or "default"`)
	}
	if v < 0 {
		return errors.New("must not be negative")
	}
	o.v, o.clear = v, false
	return nil
}

func (o *optInt) apply(p **int) {
	switch {
	case !o.set:
	case o.clear:
		*p = nil
	default:
		v := o.v
		*p = &v
	}
}

type optFloat struct {
	set, clear bool
	v          float64
}

func (o *optFloat) String() string {
	if o == nil || !o.set {
		return ""
	}
	if o.clear {
		return "default"
	}
	return strconv.FormatFloat(o.v, 'g', -1, 64)
}

func (o *optFloat) Set(s string) error {
	o.set = true
	if s == "default" {
		o.clear = true
		return nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 {
		return errors.New(`want a non-negative number or "default"`)
	}
	o.v, o.clear = v, false
	return nil
}

func (o *optFloat) apply(p **float64) {
	switch {
	case !o.set:
	case o.clear:
		*p = nil
	default:
		v := o.v
		*p = &v
	}
}

// settingFlags are the flags of `tenants set`.
type settingFlags struct {
	minWarm, burst, maxSandboxes, maxMemory optInt
	rate                                    optFloat

	lifecycleBurst, readBurst, dataplaneBurst optInt
	lifecycleRate, readRate, dataplaneRate    optFloat
}

func (f *settingFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.minWarm, "min-warm", `warm sandboxes kept ready per pool (0: none; "default": server default)`)
	fs.Var(&f.rate, "create-rate", `sandbox creates per second (0: no limit; "default": server default)`)
	fs.Var(&f.burst, "create-burst", `creates allowed at once (token bucket size; "default": server default)`)
	fs.Var(&f.maxSandboxes, "max-sandboxes", `live sandboxes at once, paused included (0: no limit; "default": server default)`)
	fs.Var(&f.maxMemory, "max-memory-mb", `total memory of live sandboxes, MiB (0: no limit; "default": server default)`)
	fs.Var(&f.lifecycleRate, "lifecycle-rate", `other mutating API calls per second (0: no limit; "default": server default)`)
	fs.Var(&f.lifecycleBurst, "lifecycle-burst", `lifecycle token bucket size ("default": server default)`)
	fs.Var(&f.readRate, "read-rate", `API reads (GET) per second (0: no limit; "default": server default)`)
	fs.Var(&f.readBurst, "read-burst", `read token bucket size ("default": server default)`)
	fs.Var(&f.dataplaneRate, "dataplane-rate", `data-plane requests per second (0: no limit; "default": server default)`)
	fs.Var(&f.dataplaneBurst, "dataplane-burst", `data-plane token bucket size ("default": server default)`)
}

func (f *settingFlags) any() bool {
	return f.minWarm.set || f.rate.set || f.burst.set || f.maxSandboxes.set || f.maxMemory.set ||
		f.lifecycleRate.set || f.lifecycleBurst.set || f.readRate.set || f.readBurst.set ||
		f.dataplaneRate.set || f.dataplaneBurst.set
}

func (f *settingFlags) apply(s *store.Settings) {
	f.minWarm.apply(&s.MinWarm)
	f.rate.apply(&s.CreateRate)
	f.burst.apply(&s.CreateBurst)
	f.maxSandboxes.apply(&s.MaxSandboxes)
	f.maxMemory.apply(&s.MaxMemoryMB)
	f.lifecycleRate.apply(&s.LifecycleRate)
	f.lifecycleBurst.apply(&s.LifecycleBurst)
	f.readRate.apply(&s.ReadRate)
	f.readBurst.apply(&s.ReadBurst)
	f.dataplaneRate.apply(&s.DataPlaneRate)
	f.dataplaneBurst.apply(&s.DataPlaneBurst)
}

// tenantsSet changes the named settings of tenant name (creating the tenant
// if needed) in one transaction; a running server picks them up within its
// --settings-poll interval.
func tenantsSet(ctx context.Context, st *store.Store, name string, f *settingFlags, out io.Writer) error {
	if !f.any() {
		return errors.New("tenants set: name at least one of --min-warm, --create-rate, --create-burst, --max-sandboxes, --max-memory-mb, " +
			"--lifecycle-rate, --lifecycle-burst, --read-rate, --read-burst, --dataplane-rate, --dataplane-burst")
	}
	if _, err := st.EnsureTenant(ctx, name); err != nil {
		return err
	}
	t, err := st.UpdateTenantSettings(ctx, tenant.ID(name), f.apply)
	if err != nil {
		return err
	}
	return printTenants(out, []store.Tenant{t})
}

// printTenants writes a table of tenants and their settings; "-" is the
// server default.
func printTenants(out io.Writer, ts []store.Tenant) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tMIN_WARM\tCREATE_RATE\tCREATE_BURST\tMAX_SANDBOXES\tMAX_MEMORY_MB\t"+
		"LIFECYCLE_RATE\tLIFECYCLE_BURST\tREAD_RATE\tREAD_BURST\tDATAPLANE_RATE\tDATAPLANE_BURST")
	for _, t := range ts {
		s := t.Settings
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, showInt(s.MinWarm), showFloat(s.CreateRate),
			showInt(s.CreateBurst), showInt(s.MaxSandboxes), showInt(s.MaxMemoryMB),
			showFloat(s.LifecycleRate), showInt(s.LifecycleBurst), showFloat(s.ReadRate), showInt(s.ReadBurst),
			showFloat(s.DataPlaneRate), showInt(s.DataPlaneBurst))
	}
	return tw.Flush()
}

func showInt(p *int) string {
	if p == nil {
		return "-"
	}
	return strconv.Itoa(*p)
}

func showFloat(p *float64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatFloat(*p, 'g', -1, 64)
}
