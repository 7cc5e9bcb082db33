// Package certpin checks TLS peers against pinned certificates instead of a
// CA: Incus servers and cluster members present self-signed certificates,
// which their clients pin (as the incus CLI does in its remote
// configuration), and the sandboxd relay pins its clients the same way.
package certpin

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// ErrMismatch: the peer's certificate is not the pinned one.
var ErrMismatch = errors.New("certificate does not match the pinned one")

// DER is the certificate of the first PEM CERTIFICATE block of certPEM,
// parsed to make sure it is one.
func DER(certPEM []byte) ([]byte, error) {
	blk, _ := pem.Decode(certPEM)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return blk.Bytes, nil
}

// Verifier is a tls.Config.VerifyPeerCertificate (with InsecureSkipVerify,
// which it replaces) that accepts exactly a peer whose leaf certificate is
// certPEM's.
func Verifier(certPEM []byte) (func(rawCerts [][]byte, _ [][]*x509.Certificate) error, error) {
	want, err := DER(certPEM)
	if err != nil {
		return nil, err
	}
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if !Match(raw, want) {
			return ErrMismatch
		}
		return nil
	}, nil
}

// Match reports whether the leaf of a peer's chain (raw, leaf first) is
// one of pins (DER). Certificates are public: no constant-time compare.
func Match(raw [][]byte, pins ...[]byte) bool {
	if len(raw) == 0 {
		return false
	}
	for _, p := range pins {
		if bytes.Equal(raw[0], p) {
			return true
		}
	}
	return false
}
