package sandbox

import (
	"context"
	"log/slog"
	"testing"

	"github.com/sandboxd/sandboxd/store/storetest"
	"github.com/sandboxd/sandboxd/tenant"
)

// TestSettingsGet: what admission and the pools read is the stored settings
// over the server defaults, value by value, as re-read from the store.
func TestSettingsGet(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.Open(t)
	def := Defaults{MinWarm: 1, MaxSandboxes: 10, MaxMemoryMB: 2048,
		Limits: map[tenant.Class]tenant.Bucket{tenant.Create: {Rate: 5, Burst: 20}}}
	tests := []struct {
		name string
		set  tenant.Settings
		want Effective
	}{
		{"defaults", tenant.Settings{}, Effective{MinWarm: 1, CreateRate: 5, CreateBurst: 20, MaxSandboxes: 10, MaxMemoryMB: 2048}},
		{"zero is no limit, not the default", tenant.Settings{MaxSandboxes: tenant.Of(0), MinWarm: tenant.Of(0)},
			Effective{MinWarm: 0, CreateRate: 5, CreateBurst: 20, MaxSandboxes: 0, MaxMemoryMB: 2048}},
		{"create burst only", tenant.Settings{Limits: map[tenant.Class]tenant.Limit{tenant.Create: {Burst: tenant.Of(3)}}},
			Effective{MinWarm: 1, CreateRate: 5, CreateBurst: 3, MaxSandboxes: 10, MaxMemoryMB: 2048}},
		{"other classes leave create", tenant.Settings{Limits: map[tenant.Class]tenant.Limit{tenant.Read: {Rate: tenant.Of(1.0)}}},
			Effective{MinWarm: 1, CreateRate: 5, CreateBurst: 20, MaxSandboxes: 10, MaxMemoryMB: 2048}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := st.EnsureTenant(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			if _, err := st.SetTenantSettings(ctx, "a", tt.set); err != nil {
				t.Fatal(err)
			}
			s := NewSettings(st, def, slog.New(slog.DiscardHandler))
			if err := s.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			if got := s.Get("a"); got != tt.want {
				t.Errorf("Get(a) = %+v, want %+v", got, tt.want)
			}
			if got := s.Get("unknown"); got != (Effective{MinWarm: 1, CreateRate: 5, CreateBurst: 20, MaxSandboxes: 10, MaxMemoryMB: 2048}) {
				t.Errorf("Get(unknown) = %+v, want the defaults", got)
			}
		})
	}
	var none *Settings
	if got := none.Get("a"); got != (Effective{}) {
		t.Errorf("nil cache: Get = %+v, want zero", got)
	}
}
