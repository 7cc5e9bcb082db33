package incus

import (
	"crypto/x509"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/certpin"
)

// pinnedVerifier accepts exactly the server certificate in certPEM: Incus
// servers usually present a self-signed certificate, which the client pins
// as the incus CLI does in its remote configuration.
func pinnedVerifier(certPEM []byte) (func([][]byte, [][]*x509.Certificate) error, error) {
	verify, err := certpin.Verifier(certPEM)
	if err != nil {
		return nil, fmt.Errorf("incus: server certificate: %w", err)
	}
	return func(raw [][]byte, chains [][]*x509.Certificate) error {
		if err := verify(raw, chains); err != nil {
			return fmt.Errorf("incus: server %w", err)
		}
		return nil
	}, nil
}
