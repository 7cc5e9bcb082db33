package sandbox

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/tenant"
)

// A create no host could ever admit is a 400 naming the limit, not a 429
// or 503 that a client retries forever; a create above a per-sandbox cap
// is a 400 too.
func TestCreateBounds(t *testing.T) {
	hostTotal := func() (int, error) { return 24 * 1024, nil } // a 24 GiB host
	tests := []struct {
		name  string
		cfg   func(*Config)
		quota int // tenant a's memory quota, MiB; 0: none
		req   CreateRequest
		want  string // substring of the 400's message; "" means admitted
	}{
		{name: "memory above the host's RAM", req: CreateRequest{MemoryMB: 100000}, want: "the host's memory"},
		{name: "memory within the host", req: CreateRequest{MemoryMB: 4096}},
		{name: "memory above the host budget", cfg: func(c *Config) { c.HostMemoryMB = 8192 },
			req: CreateRequest{MemoryMB: 9000}, want: "memory budget of 8192 MiB"},
		{name: "memory above the tenant's whole quota", quota: 1024,
			req: CreateRequest{MemoryMB: 2048}, want: "memory quota of 1024 MiB"},
		{name: "cpu above the cap", cfg: func(c *Config) { c.MaxCPU = 2 },
			req: CreateRequest{CPUCount: 511}, want: "CPU count 511 exceeds the limit of 2"},
		{name: "cpu at the cap", cfg: func(c *Config) { c.MaxCPU = 2 }, req: CreateRequest{CPUCount: 2}},
		{name: "disk above the cap", req: CreateRequest{DiskMB: 200000}, want: "disk size 200000 MiB exceeds the limit of 10240"},
		{name: "disk at a configured cap", cfg: func(c *Config) { c.MaxDiskMB = 300000 }, req: CreateRequest{DiskMB: 300000},
			want: ""}, // not in RAM: the host's memory does not bound it
		{name: "disk in RAM above the host", cfg: func(c *Config) { c.MaxDiskMB = 300000; c.DiskInMemory = true },
			req: CreateRequest{DiskMB: 200000}, want: "disk lives in RAM"},
		{name: "disk in RAM over the tenant's whole quota", cfg: func(c *Config) { c.DiskInMemory = true }, quota: 2048,
			req: CreateRequest{MemoryMB: 1024, DiskMB: 2048}, want: "memory quota of 2048 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, func(c *Config) {
				c.HostReserveMB = 512
				c.MemAvailable = hostTotal
				c.MemTotal = hostTotal
				if tt.cfg != nil {
					tt.cfg(c)
				}
			})
			if tt.quota > 0 {
				e.set(t, "a", func(s *tenant.Settings) { s.MaxMemoryMB = tenant.Of(tt.quota) })
			}
			sb, err := e.m.Create(as("a"), tt.req)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("create: %v, want admitted", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("create = %v, %v; want ErrInvalidArgument naming %q", sb, err, tt.want)
			}
			if n := len(e.be.IDs()); n != 0 {
				t.Fatalf("refused create left %d backend sandboxes", n)
			}
		})
	}
}

// A default (configured or a template's) above a per-sandbox cap is
// clamped, and the row, which the API reports, says what is in force.
func TestDefaultsClampedToCaps(t *testing.T) {
	e := newTestEnv(t, func(c *Config) {
		c.DefaultCPU, c.MaxCPU = 8, 3
		c.DefaultDiskMB, c.MaxDiskMB = 4096, 2048
	})
	sb, err := e.m.Create(as("a"), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sb.CPUCount != 3 || sb.DiskMB != 2048 {
		t.Fatalf("row has %d CPUs, %d MiB disk; want the caps 3 and 2048", sb.CPUCount, sb.DiskMB)
	}
	if spec := e.be.Get(sb.ID).Spec; spec.CPUCount != 3 || spec.DiskSizeMB != 2048 {
		t.Fatalf("backend got %d CPUs, %d MiB disk; want 3 and 2048", spec.CPUCount, spec.DiskSizeMB)
	}
	// The template list (GET /templates) reports the same.
	if r := e.m.TemplateResources(DefaultTemplate); r.CPUCount != 3 || r.DiskSizeMB != 2048 {
		t.Fatalf("template resources %+v; want 3 CPUs, 2048 MiB disk", r)
	}
}

// With the disk in RAM, its size counts in the tenant's memory quota and
// the host budget, as the memory it is.
func TestDiskInMemoryCounts(t *testing.T) {
	tests := []struct {
		name  string
		cfg   func(*Config)
		quota int
		want  error
	}{
		{name: "tenant quota", quota: 3000, want: errdefs.ErrResourceExhausted},
		{name: "host budget", cfg: func(c *Config) { c.HostMemoryMB = 3000 }, want: errdefs.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, func(c *Config) {
				c.DiskInMemory = true
				if tt.cfg != nil {
					tt.cfg(c)
				}
			})
			if tt.quota > 0 {
				e.set(t, "a", func(s *tenant.Settings) { s.MaxMemoryMB = tenant.Of(tt.quota) })
			}
			// 512 MiB + 1024 MiB disk each: one fits in 3000, two do not
			// (with memory alone, they would).
			req := CreateRequest{MemoryMB: 512, DiskMB: 1024}
			if _, err := e.m.Create(as("a"), req); err != nil {
				t.Fatal(err)
			}
			if _, err := e.m.Create(as("a"), req); !errors.Is(err, tt.want) {
				t.Fatalf("second create: %v, want %v", err, tt.want)
			}
		})
	}
}

// Warm members' disks count too: with 512 MiB + 1024 MiB of disk each, a
// quota of 3000 MiB holds one member, not the five memory alone would fit.
func TestPoolCountsDiskInMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newTestEnv(t, func(c *Config) { c.DiskInMemory = true })
		e.set(t, "a", func(s *tenant.Settings) { s.MinWarm = tenant.Of(5); s.MaxMemoryMB = tenant.Of(3000) })
		p := e.startPools(t)
		waitFor(t, "a member", func() bool { return ready(p, "a") == 1 })
		time.Sleep(time.Second) // many ticks: still one
		synctest.Wait()
		if got := ready(p, "a"); got != 1 {
			t.Fatalf("%d members, want 1 (memory and disk within the quota)", got)
		}
		if got, want := p.ReservedMB(), 512+1024; got != want {
			t.Fatalf("reserved %d MiB, want %d", got, want)
		}
	})
}
