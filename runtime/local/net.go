package local

import (
	"net/netip"

	egresspkg "github.com/sandboxd/sandboxd/runtime/egress"
)

// Egress (see runtime/egress, shared with the Incus backend): a sandbox
// created with AllowInternet gets a veth pair made here; libcontainer moves
// the peer in as eth0 with its address, and the default route is added once
// init runs. The veth names derive from the sandbox id.

// netInfo is what meta.json records of a sandbox's egress.
type netInfo = egresspkg.Info

func linkNames(id string) (host, peer string) { return egresspkg.LinkNames(id) }

// egress holds the state shared by all sandboxes with internet access.
type egress struct{ *egresspkg.Egress }

func newEgress(subnet netip.Prefix) (*egress, error) {
	e, err := egresspkg.New(subnet)
	if err != nil {
		return nil, err
	}
	return &egress{e}, nil
}

func (e *egress) setup() error { return e.Setup() }

func (e *egress) allocate(used map[netip.Addr]bool) (netip.Addr, error) {
	return e.Allocate(func(a netip.Addr) bool { return used[a] })
}

func (e *egress) createVeth(id string, ip netip.Addr) (netInfo, error) { return e.CreateVeth(id, ip) }

// addDefaultRoute adds the default route in the network namespace of pid,
// once libcontainer has moved the peer in as eth0 (with its address, up).
func addDefaultRoute(pid int, gw netip.Addr) error {
	return egresspkg.ConfigureSandbox(pid, netip.Addr{}, gw)
}

func deleteLinks(id string) { egresspkg.DeleteLinks(id) }

func resolvConf() []byte { return egresspkg.ResolvConf() }

func haveNft() error { return egresspkg.HaveNft() }
