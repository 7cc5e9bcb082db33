package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/egress/policy"
	"github.com/sandboxd/sandboxd/store"
)

// AllTraffic is E2B's ALL_TRAFFIC, the denyOut entry that denies what no
// allowOut entry allows.
const AllTraffic = policy.AllTraffic

// NetworkUpdate is E2B's network update: the sandbox's whole egress
// configuration, replacing the previous one.
type NetworkUpdate struct {
	AllowInternet     *bool
	AllowOut, DenyOut []string
	DNSServers        []string
}

// egressPolicy parses the egress rules of n; nil n or no rules: an empty
// policy. A bad rule is the client's mistake, named in the error.
// dnsServers are resolvers the sandbox may query directly when its
// allowOut names domains (E2B's reading): allowed on port 53.
func egressPolicy(n *NetworkConfig) (*policy.Policy, error) {
	if n == nil {
		return nil, nil
	}
	allow := n.AllowOut
	for i, s := range n.DNSServers {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() || a.IsUnspecified() {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("network.dnsServers[%d] %q: want an IPv4 address", i, s))
		}
		allow = append(slices.Clip(allow), a.String()+":53")
	}
	p, err := policy.Parse(allow, n.DenyOut)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, strings.TrimPrefix(err.Error(), policy.ErrInvalid.Error()+": "))
	}
	return p, nil
}

// checkPolicy refuses a policy this sandboxd cannot enforce, before
// anything is made: a backend without egress policies, or rules for a
// sandbox without internet access (nothing to allow, and nothing left to
// deny).
func (m *Manager) checkPolicy(p *policy.Policy, allowInternet bool) error {
	if p.Empty() {
		return nil
	}
	if _, ok := m.backend.(runtime.EgressPolicer); !ok {
		return errdefs.New(errdefs.ErrNotImplemented, "network.allowOut and network.denyOut: the "+m.cfg.BackendName+" backend does not enforce egress rules")
	}
	if !allowInternet {
		return errdefs.New(errdefs.ErrNotImplemented, "network.allowOut and network.denyOut: the sandbox was created with allow_internet_access false, so it has no network device to apply them to; create it with network.denyOut [\"0.0.0.0/0\"] instead, which updateNetwork can open")
	}
	return nil
}

// applyPolicy puts sb's stored policy in force in the backend; a sandbox
// without one needs nothing (its address carries no rules: the backend
// clears an address's rules when it frees it and when it hands it out).
func (m *Manager) applyPolicy(ctx context.Context, sb *store.Sandbox) error {
	n := Network(sb)
	p, err := egressPolicy(&n)
	if err != nil || p.Empty() {
		return err
	}
	ep, ok := m.backend.(runtime.EgressPolicer)
	if !ok {
		return m.checkPolicy(p, sb.AllowInternetAccess)
	}
	if err := ep.SetEgressPolicy(ctx, sb.ID, p); err != nil {
		return fmt.Errorf("egress policy: %w", backendErr(err))
	}
	return nil
}

// reapplyPolicies puts the policies of the live sandboxes in force again
// at start: a new process's name filter listens on new ports, and its
// memory of which address has which policy starts empty.
func (m *Manager) reapplyPolicies(ctx context.Context, rows map[string]*store.Sandbox, inBackend map[string]runtime.State) {
	for id, row := range rows {
		if _, ok := inBackend[id]; !ok || row.State == store.StateKilled || len(row.Network) == 0 {
			continue
		}
		if err := m.applyPolicy(ctx, row); err != nil {
			// Its rules from before the restart stay in the kernel;
			// only the name filter's view of it is missing, which
			// fails closed.
			m.log.Error("reconcile: egress policy", "sandbox_id", id, "tenant", row.Tenant, "err", err)
		}
	}
}

// UpdateNetwork replaces a live sandbox's egress policy (E2B's PUT
// /sandboxes/{id}/network: the whole configuration; empty clears it).
// allowInternet, when set, must match what the sandbox was created with:
// a sandbox without a veth cannot be given one while it runs.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, u NetworkUpdate) error {
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	err = m.updateNetwork(ctx, sb, u)
	m.audit(ctx, "update_network", sb, err, "allow_out", len(u.AllowOut), "deny_out", len(u.DenyOut))
	return err
}

func (m *Manager) updateNetwork(ctx context.Context, sb *store.Sandbox, u NetworkUpdate) error {
	if !sb.State.Live() {
		return errdefs.ErrNotFound
	}
	allowInternet, allowOut, denyOut := u.AllowInternet, u.AllowOut, u.DenyOut
	if allowInternet != nil && !*allowInternet && sb.AllowInternetAccess {
		// E2B's own reading of allow_internet_access=false.
		denyOut = append(slices.Clip(denyOut), policy.AllTraffic)
	}
	if allowInternet != nil && *allowInternet != sb.AllowInternetAccess {
		if !sb.AllowInternetAccess {
			return errdefs.New(errdefs.ErrNotImplemented, "allow_internet_access: a sandbox created without internet access cannot be given it while it runs; create it with allow_internet_access and a denyOut of 0.0.0.0/0 instead")
		}
	}
	n := Network(sb)
	n.AllowOut, n.DenyOut, n.DNSServers = allowOut, denyOut, u.DNSServers
	p, err := egressPolicy(&n)
	if err != nil {
		return err
	}
	if err := m.checkPolicy(p, sb.AllowInternetAccess); err != nil {
		return err
	}
	if ep, ok := m.backend.(runtime.EgressPolicer); ok && sb.AllowInternetAccess {
		if err := ep.SetEgressPolicy(ctx, sb.ID, p); err != nil {
			if errors.Is(err, runtime.ErrNotFound) {
				return errdefs.ErrNotFound
			}
			return fmt.Errorf("egress policy: %w", backendErr(err))
		}
	}
	raw, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode network config: %w", err)
	}
	sb.Network = raw
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return fmt.Errorf("record the network config: %w", err)
	}
	return nil
}
