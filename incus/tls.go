package incus

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// pinnedVerifier accepts exactly the server certificate in certPEM: Incus
// servers usually present a self-signed certificate, which the client pins
// as the incus CLI does in its remote configuration.
func pinnedVerifier(certPEM []byte) (func([][]byte, [][]*x509.Certificate) error, error) {
	blk, _ := pem.Decode(certPEM)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("incus: server certificate: no PEM CERTIFICATE block")
	}
	if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
		return nil, fmt.Errorf("incus: server certificate: %w", err)
	}
	want := blk.Bytes
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 || !bytes.Equal(raw[0], want) {
			return errors.New("incus: server certificate does not match the pinned one")
		}
		return nil
	}, nil
}
