package local

import (
	"context"
	"fmt"
	"net/netip"
	"os"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/egress/policy"

	egresspkg "github.com/sandboxd/sandboxd/runtime/egress"
)

// Egress (see runtime/egress, shared with the Incus backend): a sandbox
// created with AllowInternet gets a veth pair once its init runs, the peer
// made right in its network namespace as eth0. The veth names derive from
// the sandbox id.

// netInfo is what meta.json records of a sandbox's egress.
type netInfo = egresspkg.Info

func linkNames(id string) (host, peer string) { return egresspkg.LinkNames(id) }

// egress holds the state shared by all sandboxes with internet access.
type egress struct{ *egresspkg.Egress }

func newEgress(subnet netip.Prefix, allow []netip.Prefix, dns []netip.Addr) (*egress, error) {
	e, err := egresspkg.New(subnet, allow...)
	if err != nil {
		return nil, err
	}
	if err := e.UseResolvers(dns); err != nil {
		return nil, err
	}
	return &egress{e}, nil
}

func (e *egress) setup() error { return e.Setup() }

func (e *egress) allocate(used map[netip.Addr]bool) (netip.Addr, error) {
	return e.Allocate(func(a netip.Addr) bool { return used[a] })
}

func (e *egress) createVethIn(id string, ip netip.Addr, pid int) (netInfo, error) {
	return e.CreateVethIn(id, ip, pid)
}

func deleteLinks(id string) { egresspkg.DeleteLinks(id) }

func linkExists(name string) bool {
	_, err := os.Lstat("/sys/class/net/" + name)
	return err == nil
}

// SetEgressPolicy implements runtime.EgressPolicer.
func (b *Backend) SetEgressPolicy(ctx context.Context, id string, p *policy.Policy) error {
	s, err := b.get(ctx, id)
	if err != nil {
		return err
	}
	if s.meta.Net == nil {
		if p.Empty() {
			return nil
		}
		return fmt.Errorf("egress policy of sandbox %s: %w: it has no internet access", id, runtime.ErrInvalidSpec)
	}
	return b.egress.SetPolicy(ctx, id, s.meta.Net.IP, p)
}
