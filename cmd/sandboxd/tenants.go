package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// opt is the flag of one tenant setting: unset leaves it as it is, a number
// sets it, "default" clears it back to the server default.
type opt[T int | float64] struct {
	set bool
	v   tenant.Value[T]
}

func (o *opt[T]) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.v.String()
}

func (o *opt[T]) Set(s string) error {
	o.set = true
	if s == "default" {
		o.v = tenant.Value[T]{}
		return nil
	}
	v, err := parseSetting[T](s)
	if err != nil {
		return err
	}
	o.v = tenant.Of(v)
	return nil
}

// parseSetting parses a count (a whole number) or a rate, neither negative.
func parseSetting[T int | float64](s string) (T, error) {
	var v T
	switch p := any(&v).(type) {
	case *int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return v, errors.New(`want a whole number or "default"`)
		}
		if n < 0 {
			return v, errors.New("must not be negative")
		}
		*p = n
	case *float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f < 0 {
			return v, errors.New(`want a non-negative number or "default"`)
		}
		*p = f
	}
	return v, nil
}

func (o *opt[T]) apply(dst *tenant.Value[T]) {
	if o.set {
		*dst = o.v
	}
}

// limitFlags are the flags of one route class's rate limit.
type limitFlags struct {
	rate  opt[float64]
	burst opt[int]
}

// classHelp is the help of each class's --CLASS-rate and --CLASS-burst.
var classHelp = map[tenant.Class]struct{ rate, burst string }{
	tenant.Create: {`sandbox creates per second (0: no limit; "default": server default)`,
		`creates allowed at once (token bucket size; "default": server default)`},
	tenant.Lifecycle: {`other mutating API calls per second (0: no limit; "default": server default)`,
		`lifecycle token bucket size ("default": server default)`},
	tenant.Read: {`API reads (GET) per second (0: no limit; "default": server default)`,
		`read token bucket size ("default": server default)`},
	tenant.DataPlane: {`data-plane requests per second (0: no limit; "default": server default)`,
		`data-plane token bucket size ("default": server default)`},
}

// settingFlags are the flags of `tenants set`.
type settingFlags struct {
	minWarm, maxSandboxes, maxMemory opt[int]
	buildCPU, buildMemory, buildDisk opt[int]
	buildTimeout                     opt[int]
	maxVolumes, maxVolumesMB         opt[int]
	volumeSize                       opt[int]
	limits                           map[tenant.Class]*limitFlags
}

func (f *settingFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.minWarm, "min-warm", `warm sandboxes kept ready per pool (0: none; "default": server default)`)
	fs.Var(&f.maxSandboxes, "max-sandboxes", `live sandboxes at once, paused included (0: no limit; "default": server default)`)
	fs.Var(&f.maxMemory, "max-memory-mb", `total memory of live sandboxes, MiB (0: no limit; "default": server default)`)
	fs.Var(&f.buildCPU, "build-cpu", `CPUs of a template build's sandbox, at most ("default": server default)`)
	fs.Var(&f.buildMemory, "build-memory-mb", `memory of a template build's sandbox, MiB, at most ("default": server default)`)
	fs.Var(&f.buildDisk, "build-disk-mb", `disk of a template build's sandbox, MiB ("default": server default)`)
	fs.Var(&f.buildTimeout, "build-timeout-s", `longest a template build may run, seconds ("default": server default)`)
	fs.Var(&f.maxVolumes, "max-volumes", `volumes the tenant may have (0: no limit; "default": server default)`)
	fs.Var(&f.maxVolumesMB, "max-volumes-mb", `total size of the tenant's volumes, MiB (0: no limit; "default": server default)`)
	fs.Var(&f.volumeSize, "volume-size-mb", `size of a new volume, MiB ("default": server default)`)
	f.limits = make(map[tenant.Class]*limitFlags, len(tenant.Classes))
	for _, c := range tenant.Classes {
		l := &limitFlags{}
		f.limits[c] = l
		fs.Var(&l.rate, string(c)+"-rate", classHelp[c].rate)
		fs.Var(&l.burst, string(c)+"-burst", classHelp[c].burst)
	}
}

func (f *settingFlags) any() bool {
	for _, l := range f.limits {
		if l.rate.set || l.burst.set {
			return true
		}
	}
	return f.minWarm.set || f.maxSandboxes.set || f.maxMemory.set ||
		f.buildCPU.set || f.buildMemory.set || f.buildDisk.set || f.buildTimeout.set ||
		f.maxVolumes.set || f.maxVolumesMB.set || f.volumeSize.set
}

// settingFlagNames lists the flags register defines, so that an error
// naming them stays complete as settings are added.
func settingFlagNames() []string {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	new(settingFlags).register(fs)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, "--"+f.Name) })
	return names
}

func (f *settingFlags) apply(s *tenant.Settings) {
	f.minWarm.apply(&s.MinWarm)
	f.maxSandboxes.apply(&s.MaxSandboxes)
	f.maxMemory.apply(&s.MaxMemoryMB)
	f.buildCPU.apply(&s.Build.CPU)
	f.buildMemory.apply(&s.Build.MemoryMB)
	f.buildDisk.apply(&s.Build.DiskMB)
	f.buildTimeout.apply(&s.Build.TimeoutS)
	f.maxVolumes.apply(&s.Volumes.Max)
	f.maxVolumesMB.apply(&s.Volumes.MaxMB)
	f.volumeSize.apply(&s.Volumes.SizeMB)
	for c, lf := range f.limits {
		l := s.Limit(c)
		lf.rate.apply(&l.Rate)
		lf.burst.apply(&l.Burst)
		s.SetLimit(c, l)
	}
}

// tenantsSet changes the named settings of tenant name (creating the tenant
// if needed) in one transaction; a running server picks them up within its
// --settings-poll interval.
func tenantsSet(ctx context.Context, st *store.Store, name string, f *settingFlags, out io.Writer) error {
	if !f.any() {
		return fmt.Errorf("tenants set: name at least one of %s", strings.Join(settingFlagNames(), ", "))
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
		"LIFECYCLE_RATE\tLIFECYCLE_BURST\tREAD_RATE\tREAD_BURST\tDATAPLANE_RATE\tDATAPLANE_BURST\t"+
		"BUILD_CPU\tBUILD_MEMORY_MB\tBUILD_DISK_MB\tBUILD_TIMEOUT_S\tMAX_VOLUMES\tMAX_VOLUMES_MB\tVOLUME_SIZE_MB")
	for _, t := range ts {
		s := t.Settings
		create := s.Limit(tenant.Create)
		row := []string{string(t.ID), show(s.MinWarm), show(create.Rate), show(create.Burst),
			show(s.MaxSandboxes), show(s.MaxMemoryMB)}
		for _, c := range []tenant.Class{tenant.Lifecycle, tenant.Read, tenant.DataPlane} {
			l := s.Limit(c)
			row = append(row, show(l.Rate), show(l.Burst))
		}
		row = append(row, show(s.Build.CPU), show(s.Build.MemoryMB), show(s.Build.DiskMB), show(s.Build.TimeoutS),
			show(s.Volumes.Max), show(s.Volumes.MaxMB), show(s.Volumes.SizeMB))
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// show is a setting's cell: "-" is the server default.
func show[T int | float64](v tenant.Value[T]) string {
	if !v.IsSet() {
		return "-"
	}
	return v.String()
}
