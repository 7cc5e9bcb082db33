package main

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/sandboxd/sandboxd/incus"
	"github.com/sandboxd/sandboxd/incus/relay"
)

// open makes the HTTPS client of --incus-remote and the cluster options:
// the relays are dialed with the same client certificate, and present the
// same (cluster) certificate as Incus.
func (o *remoteOpts) open() (*incus.Client, *incus.ClusterOptions, error) {
	if o.clientCert == "" || o.clientKey == "" || o.serverCert == "" {
		return nil, nil, fmt.Errorf("--incus-remote needs --incus-client-cert, --incus-client-key and --incus-server-cert")
	}
	if !(o.poolReserve > 0 && o.poolReserve < 1) {
		return nil, nil, fmt.Errorf("--incus-pool-reserve %v: want a share between 0 and 1 (0.1: a tenth of each member's pool)", o.poolReserve)
	}
	rc, err := incus.LoadRemoteConfig(o.url, o.clientCert, o.clientKey, o.serverCert)
	if err != nil {
		return nil, nil, err
	}
	c, err := incus.NewRemoteClient(rc)
	if err != nil {
		return nil, nil, err
	}
	subnet, err := netip.ParsePrefix(o.sandboxSubnet)
	if err != nil || !subnet.Addr().Is4() {
		return nil, nil, fmt.Errorf("--incus-sandbox-subnet %q: want an IPv4 CIDR", o.sandboxSubnet)
	}
	var pems [3][]byte
	for i, f := range []string{o.clientCert, o.clientKey, o.serverCert} {
		if pems[i], err = os.ReadFile(f); err != nil {
			return nil, nil, err
		}
	}
	tc, err := relay.ClientTLS(pems[0], pems[1], pems[2])
	if err != nil {
		return nil, nil, fmt.Errorf("relay TLS: %w", err)
	}
	return c, &incus.ClusterOptions{
		Relay:         &relay.Dialer{TLS: tc},
		RelayPort:     o.relayPort,
		SandboxSubnet: subnet.Masked(),
		MemberEnvd:    o.memberEnvd,
		LostAfter:     o.lostAfter,
		SimpleQuotas:  o.simpleQuotas,
		Replicas:      o.replicas,
		PoolReserve:   o.poolReserve,
		Members:       o.members,
	}, nil
}
