package main

// sandboxd tls init: a local CA and a wildcard certificate for serving the
// API and host-routed sandbox URLs (<port>-<id>.<domain>) over HTTPS in
// development.

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/certs"
)

const (
	tlsCAValidity   = 10 * 365 * 24 * time.Hour
	tlsLeafValidity = 365 * 24 * time.Hour
)

func tlsCmd(args []string) error { return tlsRun(args, os.Stdout) }

func tlsRun(args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "init" {
		return errors.New("usage: sandboxd tls init --domain D [--dir DIR] [--data-dir DIR]")
	}
	fs := flag.NewFlagSet("tls init", flag.ContinueOnError)
	var (
		domain  = fs.String("domain", "", "sandbox domain: the certificate covers D and *.D (and localhost, 127.0.0.1)")
		dir     = fs.String("dir", "", "where to write ca.pem, ca-key.pem, cert.pem, key.pem (default <data-dir>/tls)")
		dataDir = fs.String("data-dir", "./data", "state directory")
	)
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("tls init: unexpected arguments %q", fs.Args())
	}
	d, err := tlsValidDomain(*domain)
	if err != nil {
		return fmt.Errorf("tls init: %w", err)
	}
	if *dir == "" {
		*dir = filepath.Join(*dataDir, "tls")
	}
	return tlsInit(d, *dir, out)
}

// tlsValidDomain normalizes D and refuses what cannot carry a wildcard
// certificate: empty, wildcards, IP addresses, bad hostname syntax. Its
// errors name --domain.
func tlsValidDomain(d string) (string, error) {
	d = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(d)), ".")
	switch {
	case d == "":
		return "", errors.New("--domain is required")
	case strings.Contains(d, "*"):
		return "", fmt.Errorf("--domain %q: give the domain without a wildcard (the certificate covers it and *.D)", d)
	case net.ParseIP(strings.Trim(d, "[]")) != nil:
		return "", fmt.Errorf("--domain %q: an IP address cannot carry a wildcard certificate (tls init adds 127.0.0.1 to every certificate)", d)
	case len(d) > 253:
		return "", fmt.Errorf("--domain %q: longer than 253 characters", d)
	}
	for _, label := range strings.Split(d, ".") {
		ok := len(label) > 0 && len(label) <= 63 && label[0] != '-' && label[len(label)-1] != '-'
		for _, c := range label {
			ok = ok && (c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-')
		}
		if !ok {
			return "", fmt.Errorf("--domain %q: not a hostname (labels of 1-63 letters, digits and inner hyphens)", d)
		}
	}
	return d, nil
}

func tlsInit(domain, dir string, out io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var (
		caPath    = filepath.Join(dir, "ca.pem")
		caKeyPath = filepath.Join(dir, "ca-key.pem")
		certPath  = filepath.Join(dir, "cert.pem")
		keyPath   = filepath.Join(dir, "key.pem")
	)
	ca, caKey, reused, err := tlsLoadOrCreateCA(caPath, caKeyPath)
	if err != nil {
		return err
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := tlsSerial()
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: domain},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(tlsLeafValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{domain, "*." + domain, "localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("tls init: sign certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	// Key first: a cert.pem never sits beside a key.pem it does not match
	// for longer than one rename.
	if err := certs.WritePEM(keyPath, "PRIVATE KEY", keyDER, 0o600); err != nil {
		return err
	}
	if err := certs.WritePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}

	caState := "created"
	if reused {
		caState = "reused"
	}
	fmt.Fprintf(out, `CA (%s):    %s
certificate: %s (key %s)
             for %s, *.%s, localhost, 127.0.0.1, ::1; valid until %s

Serve HTTPS (HTTP/1.1 and HTTP/2) with:
  sandboxd serve --domain %s --tls-cert %s --tls-key %s [--listen 127.0.0.1:3000]

Trust the CA (development only; keep ca-key.pem private):
  Python/Go SDKs:  export SSL_CERT_FILE=%s
  JS SDK (Node):   export NODE_EXTRA_CA_CERTS=%s
  Debian/Ubuntu:   sudo cp %s /usr/local/share/ca-certificates/sandboxd-dev-ca.crt && sudo update-ca-certificates

E2B clients (api.%s and *.%s must resolve to this host: wildcard DNS or /etc/hosts):
  export E2B_DOMAIN=%s
  export E2B_API_URL=https://api.%s:3000/v1/sandboxes/e2b   # or https://127.0.0.1:3000/v1/sandboxes/e2b
  export E2B_SANDBOX_URL=https://127.0.0.1:3000            # without wildcard DNS
`,
		caState, caPath, certPath, keyPath, domain, domain, tmpl.NotAfter.UTC().Format(time.DateOnly),
		domain, certPath, keyPath,
		caPath, caPath, caPath,
		domain, domain, domain, domain)
	return nil
}

// tlsLoadOrCreateCA reuses the CA in caPath/caKeyPath, or creates one when
// neither file exists.
func tlsLoadOrCreateCA(caPath, caKeyPath string) (*x509.Certificate, crypto.Signer, bool, error) {
	certPEM, certErr := os.ReadFile(caPath)
	keyPEM, keyErr := os.ReadFile(caKeyPath)
	switch {
	case certErr == nil && keyErr == nil:
		ca, key, err := tlsParseCA(certPEM, keyPEM)
		if err != nil {
			return nil, nil, false, fmt.Errorf("tls init: existing CA %s: %w", caPath, err)
		}
		return ca, key, true, nil
	case errors.Is(certErr, os.ErrNotExist) && errors.Is(keyErr, os.ErrNotExist):
	case certErr != nil && !errors.Is(certErr, os.ErrNotExist):
		return nil, nil, false, certErr
	case keyErr != nil && !errors.Is(keyErr, os.ErrNotExist):
		return nil, nil, false, keyErr
	default:
		return nil, nil, false, fmt.Errorf("tls init: only one of %s and %s exists; remove it to create a new CA", caPath, caKeyPath)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, false, err
	}
	serial, err := tlsSerial()
	if err != nil {
		return nil, nil, false, err
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "sandboxd development CA " + host, Organization: []string{"sandboxd development"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(tlsCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, false, fmt.Errorf("tls init: create CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, false, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, false, err
	}
	if err := certs.WritePEM(caKeyPath, "PRIVATE KEY", keyDER, 0o600); err != nil {
		return nil, nil, false, err
	}
	if err := certs.WritePEM(caPath, "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, false, err
	}
	return ca, key, false, nil
}

func tlsParseCA(certPEM, keyPEM []byte) (*x509.Certificate, crypto.Signer, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, nil, errors.New("no PEM certificate")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	if !ca.IsCA {
		return nil, nil, errors.New("not a CA certificate")
	}
	signer, err := certs.ParseKey(keyPEM)
	if err != nil {
		return nil, nil, err
	}
	if pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(ca.PublicKey) {
		return nil, nil, errors.New("key does not match the certificate")
	}
	return ca, signer, nil
}

func tlsSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}
