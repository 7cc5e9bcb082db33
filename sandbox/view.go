package sandbox

import (
	"context"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// The lifecycle's vocabulary, as the API surfaces name it: the store's
// states, timeout actions and list filter are re-exported so that the
// surfaces depend on this package alone, not on how sandboxes are stored.
type (
	// State is where a sandbox is in its lifecycle.
	State = store.State
	// OnTimeout is what happens to a sandbox when its timeout fires.
	OnTimeout = store.OnTimeout
	// Lifecycle is a sandbox's timeout action and auto-resume.
	Lifecycle = store.Lifecycle
	// ListFilter selects and pages the sandboxes List returns.
	ListFilter = store.ListFilter
	// Order is the order of a list by start time.
	Order = store.Order
)

const (
	StateRunning  = store.StateRunning
	StatePaused   = store.StatePaused
	StatePausing  = store.StatePausing
	StateResuming = store.StateResuming

	OnTimeoutKill      = store.OnTimeoutKill
	OnTimeoutPause     = store.OnTimeoutPause
	OnTimeoutPauseDisk = store.OnTimeoutPauseDisk

	OrderAsc  = store.OrderAsc
	OrderDesc = store.OrderDesc
)

// ErrInvalidFilter is what ListViews fails with when the filter is malformed
// (a bad cursor, an unknown state).
var ErrInvalidFilter = store.ErrInvalid

// View is a sandbox as the API surfaces see it: what they may render, and
// none of the store's bookkeeping (backend handle, generation). It is a
// copy; changing it changes nothing.
type View struct {
	ID                  string
	Tenant              tenant.ID
	Template            string
	Alias               string // template alias the sandbox was created from, if any
	State               State
	StartedAt           time.Time
	EndAt               time.Time // when the timeout fires
	CPUCount            int
	MemoryMB            int
	DiskMB              int
	Metadata            map[string]string
	EnvdAccessToken     string // "" unless the sandbox is secure
	AllowInternetAccess bool
	// Network is the network configuration given at create, if any.
	Network   *NetworkConfig
	Lifecycle Lifecycle
	// IdleTTL is the idle TTL (0: none); LastActiveAt the last data-plane
	// activity the store has seen (zero: none yet).
	IdleTTL      time.Duration
	LastActiveAt time.Time
	// VolumeMounts are the volumes it mounts (GetView only).
	VolumeMounts []store.SandboxVolume
}

// viewOf renders a stored row for the surfaces.
func viewOf(sb *store.Sandbox) View {
	v := View{
		ID: sb.ID, Tenant: sb.Tenant, Template: sb.Template, Alias: sb.Alias, State: sb.State,
		StartedAt: sb.StartedAt, EndAt: sb.EndAt,
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB,
		Metadata: sb.Metadata, EnvdAccessToken: sb.EnvdAccessToken, AllowInternetAccess: sb.AllowInternetAccess,
		Lifecycle: sb.Lifecycle, IdleTTL: sb.IdleTTL, LastActiveAt: sb.LastActiveAt,
	}
	if len(sb.Network) > 0 {
		n := Network(sb)
		v.Network = &n
	}
	return v
}

// TrafficAccessToken is the token requests to ports other than envd's must
// carry, or "" when the sandbox's traffic is public.
func (v View) TrafficAccessToken() string {
	if v.Network == nil {
		return ""
	}
	return v.Network.TrafficAccessToken
}

// The accessors below are the lifecycle's methods as the API surfaces call
// them: each does what its namesake does and returns views.

// GetView is Get.
func (m *Manager) GetView(ctx context.Context, id string) (View, error) {
	v, err := view(m.Get(ctx, id))
	if err != nil {
		return v, err
	}
	if v.VolumeMounts, err = m.store.SandboxVolumes(ctx, id); err != nil {
		return View{}, err
	}
	return v, nil
}

// ListViews is List.
func (m *Manager) ListViews(ctx context.Context, f ListFilter) ([]View, string, error) {
	rows, next, err := m.List(ctx, f)
	if err != nil {
		return nil, "", err
	}
	out := make([]View, len(rows))
	for i := range rows {
		out[i] = viewOf(&rows[i])
	}
	return out, next, nil
}

// CreateView is Create.
func (m *Manager) CreateView(ctx context.Context, req CreateRequest) (View, error) {
	return view(m.Create(ctx, req))
}

// ResumeView is Resume.
func (m *Manager) ResumeView(ctx context.Context, id string, timeout time.Duration) (View, error) {
	return view(m.Resume(ctx, id, timeout))
}

// ConnectView is Connect.
func (m *Manager) ConnectView(ctx context.Context, id string, timeout time.Duration) (View, bool, error) {
	sb, resumed, err := m.Connect(ctx, id, timeout)
	v, err := view(sb, err)
	return v, resumed, err
}

// StatsView is Stats.
func (m *Manager) StatsView(ctx context.Context, id string) (View, runtime.Stats, error) {
	sb, st, err := m.Stats(ctx, id)
	v, err := view(sb, err)
	return v, st, err
}

func view(sb *store.Sandbox, err error) (View, error) {
	if err != nil {
		return View{}, err
	}
	return viewOf(sb), nil
}

// LiveCounts counts the live sandboxes by tenant and state, for metrics.
func (m *Manager) LiveCounts(ctx context.Context) (map[tenant.ID]map[State]int, error) {
	live, err := m.store.ListLive(ctx)
	if err != nil {
		return nil, err
	}
	out := map[tenant.ID]map[State]int{}
	for _, sb := range live {
		if out[sb.Tenant] == nil {
			out[sb.Tenant] = map[State]int{}
		}
		out[sb.Tenant][sb.State]++
	}
	return out, nil
}
