package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandboxd/sandboxd/certs"
)

// acmeOpts are serve's --acme-* flags: a certificate for <domain> and
// *.<domain> from an ACME CA by the DNS-01 challenge (a CA issues
// wildcards by no other).
type acmeOpts struct {
	dns       string
	email     string
	directory string
	resolvers resolverFlag
	caRoot    string

	host  string         // --domain without its port; set by validate
	roots *x509.CertPool // the system's and --acme-ca-root's; set by validate
}

func (o *acmeOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.dns, "acme-dns", "", "serve HTTPS with a certificate for <domain> and *.<domain> obtained (before serving starts) and renewed from an ACME CA by the DNS-01 challenge, kept under <data-dir>/acme; the DNS provider that sets the TXT records: exec (env EXEC_PATH: a program run as PROGRAM present|cleanup FQDN VALUE) or rfc2136 (a dynamic update to env RFC2136_NAMESERVER, signed with RFC2136_TSIG_KEY, RFC2136_TSIG_SECRET, RFC2136_TSIG_ALGORITHM); needs --domain, excludes --tls-cert")
	fs.StringVar(&o.email, "acme-email", "", "--acme-dns: contact address of the ACME account (optional)")
	fs.StringVar(&o.directory, "acme-directory", "", "--acme-dns: the CA's ACME directory URL (default Let's Encrypt's production one, "+certs.LetsEncrypt+"); using it agrees to the CA's terms of service")
	fs.Var(&o.resolvers, "acme-dns-resolver", "--acme-dns: DNS resolver host[:port] that must answer the challenge's TXT record before the CA is asked to check it; the zone's authoritative servers are then not asked; repeatable, or comma-separated (default: the resolvers of /etc/resolv.conf, then the authoritative servers)")
	fs.StringVar(&o.caRoot, "acme-ca-root", "", "--acme-dns: PEM file of roots trusted for the ACME server's HTTPS besides the system's (a private or test CA)")
}

// enabled reports whether serve gets its certificate by ACME.
func (o *acmeOpts) enabled() bool { return o.dns != "" }

// validate checks the --acme-* flags against --domain, --tls-cert and
// --tls-key, and reads --acme-ca-root. Every error names a flag.
func (o *acmeOpts) validate(domain, tlsCert, tlsKey string) error {
	if !o.enabled() {
		for _, f := range []struct{ name, value string }{
			{"acme-email", o.email}, {"acme-directory", o.directory},
			{"acme-dns-resolver", o.resolvers.String()}, {"acme-ca-root", o.caRoot},
		} {
			if f.value != "" {
				return fmt.Errorf("--%s: only with --acme-dns", f.name)
			}
		}
		return nil
	}
	if tlsCert != "" || tlsKey != "" {
		return errors.New("--acme-dns excludes --tls-cert and --tls-key: the certificate comes from the ACME CA")
	}
	if domain == "" {
		return errors.New("--acme-dns needs --domain: the certificate is for <domain> and *.<domain>")
	}
	host := domain
	if h, _, err := net.SplitHostPort(domain); err == nil {
		host = h
	}
	host, err := tlsValidDomain(host)
	if err != nil {
		return err
	}
	o.host = host
	if name := o.dns; !certs.KnownDNSProvider(name) {
		return fmt.Errorf("--acme-dns %q: want one of %s", name, strings.Join(certs.DNSProviders, ", "))
	}
	if o.email != "" {
		if a, err := mail.ParseAddress(o.email); err != nil || a.Address != o.email {
			return fmt.Errorf("--acme-email %q: want a bare address, like admin@example.com", o.email)
		}
	}
	if o.directory != "" {
		u, err := url.Parse(o.directory)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("--acme-directory %q: want an https:// URL", o.directory)
		}
	}
	if o.caRoot != "" {
		pemBytes, err := os.ReadFile(o.caRoot)
		if err != nil {
			return fmt.Errorf("--acme-ca-root: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pemBytes) {
			return fmt.Errorf("--acme-ca-root %s: no PEM certificate in it", o.caRoot)
		}
		o.roots = pool
	}
	return nil
}

// manager obtains or loads the certificate (see certs.NewACME); validate
// has run.
func (o *acmeOpts) manager(ctx context.Context, dataDir string, log *slog.Logger) (*certs.Manager, error) {
	p, err := certs.DNSProvider(o.dns)
	if err != nil {
		return nil, fmt.Errorf("--acme-dns %s: %w", o.dns, err)
	}
	return certs.NewACME(ctx, certs.ACMEConfig{
		Domain: o.host, Email: o.email, Directory: o.directory, Provider: p,
		Resolvers: o.resolvers, Roots: o.roots, Dir: filepath.Join(dataDir, "acme"),
		Log: log,
	})
}

// resolverFlag collects repeated --acme-dns-resolver flags (or
// comma-separated lists) as host:port, port 53 unless given.
type resolverFlag []string

func (f *resolverFlag) String() string { return strings.Join(*f, ",") }

func (f *resolverFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			host, port = strings.Trim(s, "[]"), "53"
		}
		if host == "" || strings.ContainsAny(host, " /") {
			return fmt.Errorf("%q: want host[:port]", s)
		}
		*f = append(*f, net.JoinHostPort(host, port))
	}
	return nil
}
