// Package certs owns sandboxd's serving certificate: either a static pair of
// PEM files, read again when they change on disk (so that an external
// certbot or lego renewal is picked up without a restart), or a wildcard
// certificate for <domain> and *.<domain> obtained and renewed through ACME's
// DNS-01 challenge, the only one a CA accepts for a wildcard.
//
// A Manager always holds a certificate once constructed: its
// GetCertificate is a tls.Config's, and Run does the background work (the
// file watch or the renewals) until its context ends.
package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Manager serves one certificate and replaces it when it is renewed or
// reloaded.
type Manager struct {
	log  *slog.Logger
	cert atomic.Pointer[tls.Certificate] // Leaf set; never nil after construction
	run  func(ctx context.Context)
}

// Run watches the files or renews the certificate until ctx ends.
func (m *Manager) Run(ctx context.Context) { m.run(ctx) }

// GetCertificate returns the current certificate, for tls.Config.
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := m.cert.Load()
	if c == nil {
		return nil, errors.New("certs: no certificate")
	}
	return c, nil
}

// Leaf is the current certificate's leaf.
func (m *Manager) Leaf() *x509.Certificate { return m.cert.Load().Leaf }

// Collector is a gauge of the current certificate's expiry, for the
// server's registry.
func (m *Manager) Collector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sandboxd_tls_cert_expiry_timestamp_seconds",
		Help: "When the certificate sandboxd serves expires (NotAfter), in seconds since the Unix epoch.",
	}, func() float64 { return float64(m.Leaf().NotAfter.Unix()) })
}

// store makes c the certificate served from now on.
func (m *Manager) store(c *tls.Certificate) { m.cert.Store(c) }

// keyPair parses a PEM chain and key and sets the leaf.
func keyPair(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

// renewAt is when a certificate is due for renewal: when a third of its
// lifetime or 30 days remain, whichever is shorter (30 days of Let's
// Encrypt's 90, 2 of a 6-day certificate).
func renewAt(leaf *x509.Certificate) time.Time {
	before := min(leaf.NotAfter.Sub(leaf.NotBefore)/3, 30*24*time.Hour)
	return leaf.NotAfter.Add(-before)
}

// certAttrs are the log attributes that identify a certificate.
func certAttrs(leaf *x509.Certificate) []any {
	return []any{"serial", leaf.SerialNumber.Text(16), "names", leaf.DNSNames,
		"not_after", leaf.NotAfter.UTC().Format(time.RFC3339), "issuer", leaf.Issuer.CommonName}
}
