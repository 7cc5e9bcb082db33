package certs

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-acme/lego/v5/acme"
	"github.com/go-acme/lego/v5/certcrypto"
	"github.com/go-acme/lego/v5/certificate"
	"github.com/go-acme/lego/v5/challenge"
	"github.com/go-acme/lego/v5/challenge/dns01"
	"github.com/go-acme/lego/v5/lego"
	legolog "github.com/go-acme/lego/v5/log"
	"github.com/go-acme/lego/v5/providers/dns/dnsupdate"
	"github.com/go-acme/lego/v5/providers/dns/exec"
	"github.com/go-acme/lego/v5/registration"
)

// LetsEncrypt is the ACME directory used when ACMEConfig names none: Let's
// Encrypt's production one.
const LetsEncrypt = lego.DirectoryURLLetsEncrypt

// obtainTimeout bounds one attempt at a certificate: the order, the DNS
// records' propagation, the validations and the download.
const obtainTimeout = 10 * time.Minute

// Files under ACMEConfig.Dir.
const (
	accountKeyFile = "account.key" // the ACME account's key, 0600
	certFile       = "cert.pem"    // the certificate and its chain
	keyFile        = "key.pem"     // its key, 0600
	metaFile       = "cert.json"   // which directory issued it, for what
)

// DNSProviders are the names DNSProvider knows, as help texts list them.
var DNSProviders = []string{"exec", "rfc2136"}

// dnsProviderAliases are other names DNSProvider takes: lego v5 calls
// rfc2136 dnsupdate.
var dnsProviderAliases = map[string]string{"dnsupdate": "rfc2136"}

// KnownDNSProvider reports whether DNSProvider takes name.
func KnownDNSProvider(name string) bool {
	return slices.Contains(DNSProviders, canonicalDNSProvider(name))
}

func canonicalDNSProvider(name string) string {
	if canon, ok := dnsProviderAliases[name]; ok {
		return canon
	}
	return name
}

// DNSProvider makes the lego DNS-01 provider of that name, configured by
// lego's own environment variables:
//
//   - exec: EXEC_PATH names a program run as `PROGRAM present FQDN VALUE`
//     to create the TXT record and `PROGRAM cleanup FQDN VALUE` to remove
//     it (EXEC_MODE=RAW passes the raw domain, token and key authorization
//     instead); EXEC_PROPAGATION_TIMEOUT, EXEC_POLLING_INTERVAL and
//     EXEC_SEQUENCE_INTERVAL are in seconds.
//   - rfc2136 (or dnsupdate, its name in lego v5): a dynamic DNS update
//     (RFC 2136) to RFC2136_NAMESERVER (host or host:port), signed with TSIG
//     when RFC2136_TSIG_KEY, RFC2136_TSIG_SECRET and RFC2136_TSIG_ALGORITHM
//     (or RFC2136_TSIG_FILE, a tsig-keygen file) are set. lego also reads
//     these as DNSUPDATE_*.
//
// Neither pulls in lego's other providers and their cloud SDKs.
func DNSProvider(name string) (challenge.Provider, error) {
	switch canonicalDNSProvider(name) {
	case "exec":
		return exec.NewDNSProvider()
	case "rfc2136":
		return dnsupdate.NewDNSProvider()
	}
	return nil, fmt.Errorf("unknown DNS provider %q: want one of %v", name, DNSProviders)
}

// ACMEConfig configures NewACME.
type ACMEConfig struct {
	// Domain is sandboxd's: the certificate covers Domain and *.Domain.
	Domain string
	// Email is the ACME account's contact; empty: none.
	Email string
	// Directory is the ACME directory URL; empty: LetsEncrypt.
	Directory string
	// Provider creates and removes the DNS-01 TXT records.
	Provider challenge.Provider
	// Resolvers (host:port), when given, are asked for the TXT record
	// until each has it before the CA is asked to validate (the zone's
	// authoritative servers are then not asked), and serve lego's other
	// lookups (CNAMEs, zones). Empty: lego's default, the resolvers of
	// /etc/resolv.conf and the zone's authoritative servers.
	Resolvers []string
	// Roots are trusted for the ACME server's TLS; nil: the system's.
	Roots *x509.CertPool
	// Dir keeps the account key and the certificate (<data-dir>/acme).
	Dir string
	// Log gets this package's lines as component acme, lego's as lego.
	Log *slog.Logger
}

// NewACME serves a certificate for cfg.Domain and *.cfg.Domain from cfg's
// ACME CA, reusing the one stored in cfg.Dir if it is still valid, was
// issued by the same directory and covers both names; otherwise it obtains
// one before it returns, and fails if it cannot. Run renews it when a third
// of its lifetime or 30 days remain, retrying a failed renewal with backoff
// while the current certificate keeps serving.
//
// lego's logger becomes cfg.Log, and with cfg.Resolvers its DNS client
// uses them: both are process-wide in lego, so a process has one ACME
// Manager.
func NewACME(ctx context.Context, cfg ACMEConfig) (*Manager, error) {
	if cfg.Domain == "" || cfg.Provider == nil || cfg.Dir == "" || cfg.Log == nil {
		return nil, errors.New("certs: ACMEConfig needs Domain, Provider, Dir and Log")
	}
	if cfg.Directory == "" {
		cfg.Directory = LetsEncrypt
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	legolog.SetDefault(cfg.Log.With("component", "lego"))
	cfg.Log = cfg.Log.With("component", "acme")
	if len(cfg.Resolvers) > 0 {
		dns01.SetDefaultClient(dns01.NewClient(&dns01.Options{RecursiveNameservers: cfg.Resolvers}))
	}
	a := &acmeIssuer{cfg: cfg, log: cfg.Log}
	m := &Manager{log: cfg.Log}

	c, why := a.stored()
	if c != nil {
		a.log.Info("acme: serving the stored certificate", certAttrs(c.Leaf)...)
	} else {
		a.log.Info("acme: obtaining a certificate", "domains", a.domains(), "directory", cfg.Directory, "why", why)
		var err error
		if c, err = a.obtain(ctx); err != nil {
			return nil, fmt.Errorf("acme: obtain a certificate for %s from %s: %w", a.domains(), cfg.Directory, err)
		}
	}
	m.store(c)
	a.log.Info("acme: certificate renewal scheduled", "renew_at", renewAt(c.Leaf).UTC().Format(time.RFC3339))
	m.run = func(ctx context.Context) { renewLoop(ctx, m, a.obtain) }
	return m, nil
}

// acmeIssuer obtains certificates; it is used by one goroutine at a time
// (NewACME, then Run's).
type acmeIssuer struct {
	cfg    ACMEConfig
	log    *slog.Logger
	client *lego.Client // registered; nil until the first order
}

func (a *acmeIssuer) domains() []string { return []string{a.cfg.Domain, "*." + a.cfg.Domain} }

func (a *acmeIssuer) path(name string) string { return filepath.Join(a.cfg.Dir, name) }

// certMeta is what cert.json records of the stored certificate.
type certMeta struct {
	Directory string    `json:"directory"`
	Domains   []string  `json:"domains"`
	Obtained  time.Time `json:"obtained"`
}

// stored is the stored certificate if it can serve, else nil and why not.
func (a *acmeIssuer) stored() (*tls.Certificate, string) {
	raw, err := os.ReadFile(a.path(metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "none stored"
	}
	var meta certMeta
	if err == nil {
		err = json.Unmarshal(raw, &meta)
	}
	if err != nil {
		return nil, fmt.Sprintf("%s: %v", metaFile, err)
	}
	if meta.Directory != a.cfg.Directory {
		return nil, "the stored one is from " + meta.Directory
	}
	certPEM, err := os.ReadFile(a.path(certFile))
	if err != nil {
		return nil, err.Error()
	}
	keyPEM, err := os.ReadFile(a.path(keyFile))
	if err != nil {
		return nil, err.Error()
	}
	c, err := keyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Sprintf("stored certificate: %v", err)
	}
	for _, d := range a.domains() {
		if !slices.Contains(c.Leaf.DNSNames, d) {
			return nil, "the stored one does not cover " + d
		}
	}
	if !time.Now().Before(c.Leaf.NotAfter) {
		return nil, "the stored one expired at " + c.Leaf.NotAfter.UTC().Format(time.RFC3339)
	}
	return c, ""
}

// obtain orders a new certificate (with a new key) and stores it.
func (a *acmeIssuer) obtain(ctx context.Context) (*tls.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, obtainTimeout)
	defer cancel()
	if a.client == nil {
		client, err := a.register(ctx)
		if err != nil {
			return nil, err
		}
		a.client = client
	}
	res, err := a.client.Certificate.Obtain(ctx, certificate.ObtainRequest{
		Domains: a.domains(), Bundle: true, KeyType: certcrypto.EC256,
	})
	if err != nil {
		return nil, err
	}
	c, err := keyPair(res.Certificate, res.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("the CA's certificate: %w", err)
	}
	// Key first, cert.json last: cert.json names a pair complete on disk.
	if err := WriteFile(a.path(keyFile), res.PrivateKey, 0o600); err != nil {
		return nil, err
	}
	if err := WriteFile(a.path(certFile), res.Certificate, 0o644); err != nil {
		return nil, err
	}
	meta, _ := json.MarshalIndent(certMeta{Directory: a.cfg.Directory, Domains: a.domains(), Obtained: time.Now().UTC()}, "", "  ")
	if err := WriteFile(a.path(metaFile), append(meta, '\n'), 0o644); err != nil {
		return nil, err
	}
	a.log.Info("acme: certificate obtained", certAttrs(c.Leaf)...)
	return c, nil
}

// register makes a lego client for the account of the stored key (made
// on first use), registering it with the CA, which answers with the
// existing account for a known key. Using ACME is agreeing to the CA's
// terms of service.
func (a *acmeIssuer) register(ctx context.Context) (*lego.Client, error) {
	key, err := loadOrCreateKey(a.path(accountKeyFile))
	if err != nil {
		return nil, fmt.Errorf("account key: %w", err)
	}
	user := &acmeUser{email: a.cfg.Email, key: key}
	conf := lego.NewConfig(user)
	conf.CADirURL = a.cfg.Directory
	conf.UserAgent = "sandboxd"
	conf.HTTPClient = &http.Client{
		Timeout: 2 * time.Minute,
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second}).DialContext,
			TLSClientConfig:       &tls.Config{RootCAs: a.cfg.Roots, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout:   30 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second,
		},
	}
	client, err := lego.NewClient(conf)
	if err != nil {
		return nil, fmt.Errorf("directory %s: %w", a.cfg.Directory, err)
	}
	var opts []dns01.ChallengeOption
	if len(a.cfg.Resolvers) > 0 {
		opts = append(opts, dns01.WrapPreCheck(resolversHave(a.cfg.Resolvers)))
	}
	if err := client.Challenge.SetDNS01Provider(a.cfg.Provider, opts...); err != nil {
		return nil, err
	}
	reg, err := client.Registration.Register(ctx, registration.RegisterOptions{TermsOfServiceAgreed: true})
	if err != nil {
		return nil, fmt.Errorf("register the account: %w", err)
	}
	user.reg = reg
	a.log.Info("acme: account ready", "account", reg.Location, "directory", a.cfg.Directory,
		"terms_of_service", client.GetServerMetadata().TermsOfService)
	return client, nil
}

// acmeUser is lego's registration.User.
type acmeUser struct {
	email string
	key   crypto.Signer
	reg   *acme.ExtendedAccount
}

func (u *acmeUser) GetEmail() string                       { return u.email }
func (u *acmeUser) GetRegistration() *acme.ExtendedAccount { return u.reg }
func (u *acmeUser) GetPrivateKey() crypto.Signer           { return u.key }

// loadOrCreateKey reads a PEM key, or makes a P-256 one there.
func loadOrCreateKey(path string) (crypto.Signer, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := WritePEM(path, "PRIVATE KEY", der, 0o600); err != nil {
			return nil, err
		}
		return key, nil
	}
	if err != nil {
		return nil, err
	}
	k, err := ParseKey(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// ParseKey reads a PEM private key: PKCS #8, or SEC 1 (EC PRIVATE KEY).
func ParseKey(keyPEM []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, errors.New("no PEM private key")
	}
	var key any
	var err error
	switch b.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	default:
		err = fmt.Errorf("unsupported key PEM type %q", b.Type)
	}
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("key cannot sign")
	}
	return signer, nil
}

// WritePEM writes one PEM block to path with WriteFile.
func WritePEM(path, typ string, der []byte, mode os.FileMode) error {
	return WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// WriteFile writes atomically (a temporary file, synced, renamed) with
// mode, so that a reader or a crash never sees half a file.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // a no-op after the rename
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// resolversHave is a DNS-01 propagation check: every resolver answers the
// challenge's TXT record with its value. A miss is an error for lego to
// report if the propagation timeout passes, not a stop.
func resolversHave(resolvers []string) dns01.WrapPreCheckFunc {
	return func(ctx context.Context, _, fqdn, value string, _ dns01.PreCheckFunc) (bool, error) {
		for _, addr := range resolvers {
			r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}}
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			txts, err := r.LookupTXT(lctx, fqdn)
			cancel()
			if err != nil {
				return false, fmt.Errorf("resolver %s: %w", addr, err)
			}
			if !slices.Contains(txts, value) {
				return false, fmt.Errorf("resolver %s: TXT %s lacks the challenge value yet", addr, fqdn)
			}
		}
		return true, nil
	}
}

// renewLoop renews m's certificate when renewAt says, until ctx ends. A
// failed attempt is retried after 1 minute, doubling up to 1 hour, and the
// current certificate keeps serving meanwhile. Waits are at most an hour
// long, so a clock that jumped (a suspended host) is seen within one.
func renewLoop(ctx context.Context, m *Manager, obtain func(context.Context) (*tls.Certificate, error)) {
	failures := 0
	for {
		due := renewAt(m.Leaf())
		wait := time.Until(due)
		if failures > 0 {
			wait = retryDelay(failures)
		}
		t := time.NewTimer(min(wait, time.Hour))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if failures == 0 && time.Now().Before(due) {
			continue
		}
		c, err := obtain(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			m.log.Error("acme: renew the certificate; the current one keeps serving", "err", err,
				"failures", failures, "retry_in", retryDelay(failures).String(),
				"not_after", m.Leaf().NotAfter.UTC().Format(time.RFC3339))
			continue
		}
		failures = 0
		m.store(c)
		m.log.Info("acme: certificate renewed", "serial", c.Leaf.SerialNumber.Text(16),
			"renew_at", renewAt(c.Leaf).UTC().Format(time.RFC3339))
	}
}

// retryDelay is the wait after the nth failure in a row: 1, 2, 4 ... 60
// minutes.
func retryDelay(n int) time.Duration {
	if n > 6 {
		return time.Hour
	}
	return min(time.Minute<<(n-1), time.Hour)
}
