package certs

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const day = 24 * time.Hour

// testPair makes a self-signed certificate and its key, PEM.
func testPair(t *testing.T, serial int64, notBefore time.Time, life time.Duration, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    notBefore,
		NotAfter:     notBefore.Add(life),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func testCert(t *testing.T, serial int64, notBefore time.Time, life time.Duration) *tls.Certificate {
	t.Helper()
	certPEM, keyPEM := testPair(t, serial, notBefore, life, "sbx.test", "*.sbx.test")
	c, err := keyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// logBuffer collects log lines, safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testLog() (*slog.Logger, *logBuffer) {
	var buf logBuffer
	return slog.New(slog.NewJSONHandler(&buf, nil)), &buf
}

func serial(t *testing.T, m *Manager) int64 {
	t.Helper()
	c, err := m.GetCertificate(&tls.ClientHelloInfo{ServerName: "api.sbx.test"})
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf.SerialNumber.Int64()
}

func writePair(t *testing.T, certPath, keyPath string, certPEM, keyPEM []byte) {
	t.Helper()
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStaticReload: the files are polled; a changed pair replaces the
// served one, a broken one is logged and the previous one keeps serving.
func TestStaticReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
		c1, k1 := testPair(t, 1, time.Now(), 90*day, "sbx.test")
		writePair(t, certPath, keyPath, c1, k1)
		log, logs := testLog()
		m, err := NewStatic(certPath, keyPath, log)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); m.Run(ctx) }()
		defer func() { cancel(); <-done }()

		tick := func() {
			time.Sleep(StaticPoll)
			synctest.Wait()
		}
		tick()
		if got := serial(t, m); got != 1 {
			t.Fatalf("serial before any change = %d; want 1", got)
		}

		// A renewal: other names, so that the size changes too.
		c2, k2 := testPair(t, 2, time.Now(), 90*day, "sbx.test", "*.sbx.test")
		writePair(t, certPath, keyPath, c2, k2)
		tick()
		if got := serial(t, m); got != 2 {
			t.Fatalf("serial after a renewal = %d; want 2", got)
		}

		// A key that does not match: logged once, the old pair serves.
		_, k3 := testPair(t, 3, time.Now(), 90*day, "sbx.test", "*.sbx.test", "x.test")
		if err := os.WriteFile(keyPath, k3, 0o600); err != nil {
			t.Fatal(err)
		}
		tick()
		tick()
		if got := serial(t, m); got != 2 {
			t.Errorf("serial after a broken pair = %d; want 2", got)
		}
		if n := strings.Count(logs.String(), "previous certificate keeps serving"); n != 1 {
			t.Errorf("broken pair logged %d times; want 1:\n%s", n, logs)
		}

		// Fixed: loaded at the next tick.
		c4, k4 := testPair(t, 4, time.Now(), 90*day, "sbx.test", "*.sbx.test", "y.test")
		writePair(t, certPath, keyPath, c4, k4)
		tick()
		if got := serial(t, m); got != 4 {
			t.Errorf("serial after the fix = %d; want 4", got)
		}
		if !strings.Contains(logs.String(), `"msg":"tls: certificate reloaded"`) {
			t.Errorf("no reload logged:\n%s", logs)
		}
	})
}

func TestStaticErrors(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	log, _ := testLog()
	if _, err := NewStatic(certPath, keyPath, log); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("NewStatic(missing files) = %v; want a not-exist error", err)
	}
	c, _ := testPair(t, 1, time.Now(), day, "a.test")
	_, k := testPair(t, 2, time.Now(), day, "a.test")
	writePair(t, certPath, keyPath, c, k)
	if _, err := NewStatic(certPath, keyPath, log); err == nil || !strings.Contains(err.Error(), certPath) {
		t.Errorf("NewStatic(mismatched pair) = %v; want an error naming %s", err, certPath)
	}
}

func TestRenewAt(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		life, want time.Duration // want: after NotBefore
	}{
		{90 * day, 60 * day},
		{6 * day, 4 * day},
		{365 * day, 335 * day},
		{3 * time.Hour, 2 * time.Hour},
	} {
		leaf := &x509.Certificate{NotBefore: start, NotAfter: start.Add(tc.life)}
		if got := renewAt(leaf).Sub(start); got != tc.want {
			t.Errorf("renewAt(%v certificate) = NotBefore+%v; want +%v", tc.life, got, tc.want)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 16 * time.Minute,
		32 * time.Minute, time.Hour, time.Hour}
	for i, w := range want {
		if got := retryDelay(i + 1); got != w {
			t.Errorf("retryDelay(%d) = %v; want %v", i+1, got, w)
		}
	}
	if got := retryDelay(1000); got != time.Hour {
		t.Errorf("retryDelay(1000) = %v; want 1h", got)
	}
}

// TestRenewLoop: no renewal before a third of the lifetime is left; a
// failed one is retried after 1, 2, 4 minutes while the old certificate
// serves; a success serves the new one and schedules the next.
func TestRenewLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log, logs := testLog()
		m := &Manager{log: log}
		start := time.Now()
		m.store(testCert(t, 1, start, 90*day))

		var (
			mu    sync.Mutex
			calls []time.Duration // since start
		)
		attempts := func() []time.Duration {
			mu.Lock()
			defer mu.Unlock()
			return append([]time.Duration(nil), calls...)
		}
		failuresLeft := 3
		next := int64(2)
		obtain := func(context.Context) (*tls.Certificate, error) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, time.Since(start))
			if failuresLeft > 0 {
				failuresLeft--
				return nil, errors.New("the CA is down")
			}
			c := testCert(t, next, time.Now(), 90*day)
			next++
			return c, nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); renewLoop(ctx, m, obtain) }()

		time.Sleep(60*day - time.Second)
		synctest.Wait()
		if got := attempts(); len(got) != 0 {
			t.Fatalf("renewals before 60 of 90 days: %v", got)
		}
		time.Sleep(time.Second + 7*time.Minute + time.Second)
		synctest.Wait()
		got := attempts()
		want := []time.Duration{60 * day, 60*day + time.Minute, 60*day + 3*time.Minute, 60*day + 7*time.Minute}
		if len(got) != len(want) {
			t.Fatalf("attempts at %v; want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("attempt %d at %v; want %v", i, got[i], want[i])
			}
		}
		if got := serial(t, m); got != 2 {
			t.Errorf("serial after the renewal = %d; want 2", got)
		}
		if n := strings.Count(logs.String(), "the current one keeps serving"); n != 3 {
			t.Errorf("%d failures logged; want 3:\n%s", n, logs)
		}

		// The next renewal is 60 days after the new certificate's start.
		time.Sleep(60 * day)
		synctest.Wait()
		if got := attempts(); len(got) != 5 || got[4] != 120*day+7*time.Minute {
			t.Errorf("attempts at %v; want a fifth at %v", got, 120*day+7*time.Minute)
		}
		cancel()
		<-done
	})
}

func TestCollector(t *testing.T) {
	m := &Manager{}
	c := testCert(t, 1, time.Unix(1_900_000_000, 0), day)
	m.store(c)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "sandboxd_tls_cert_expiry_timestamp_seconds" {
		t.Fatalf("gathered %v", mfs)
	}
	if got, want := mfs[0].GetMetric()[0].GetGauge().GetValue(), float64(1_900_000_000+86400); got != want {
		t.Errorf("expiry gauge = %v; want %v", got, want)
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "account.key")
	k1, err := loadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("account key mode %v; want 0600", fi.Mode().Perm())
	}
	k2, err := loadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if !k1.Public().(*ecdsa.PublicKey).Equal(k2.Public()) {
		t.Error("second load made another key")
	}
	if err := os.WriteFile(path, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateKey(path); err == nil {
		t.Error("junk key: want an error")
	}
}

// TestStored: the stored certificate serves only if it is complete, from
// the same directory, for both names and unexpired.
func TestStored(t *testing.T) {
	const directory = "https://ca.test/dir"
	now := time.Now()
	for _, tc := range []struct {
		name      string
		directory string
		names     []string
		notBefore time.Time
		noMeta    bool
		want      string // "" reused, else a part of why not
	}{
		{"reused", directory, []string{"sbx.test", "*.sbx.test"}, now.Add(-80 * day), false, ""},
		{"none", directory, []string{"sbx.test", "*.sbx.test"}, now, true, "none stored"},
		{"other directory", "https://other.test/dir", []string{"sbx.test", "*.sbx.test"}, now, false, "from https://other.test/dir"},
		{"no wildcard", directory, []string{"sbx.test"}, now, false, "does not cover *.sbx.test"},
		{"other domain", directory, []string{"other.test", "*.other.test"}, now, false, "does not cover sbx.test"},
		{"expired", directory, []string{"sbx.test", "*.sbx.test"}, now.Add(-91 * day), false, "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			log, _ := testLog()
			a := &acmeIssuer{cfg: ACMEConfig{Domain: "sbx.test", Directory: directory, Dir: dir}, log: log}
			certPEM, keyPEM := testPair(t, 7, tc.notBefore, 90*day, tc.names...)
			writePair(t, a.path(certFile), a.path(keyFile), certPEM, keyPEM)
			if !tc.noMeta {
				meta, _ := json.Marshal(certMeta{Directory: tc.directory, Domains: tc.names})
				if err := os.WriteFile(a.path(metaFile), meta, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			c, why := a.stored()
			switch {
			case tc.want == "" && c == nil:
				t.Errorf("stored() = nil, %q; want the certificate", why)
			case tc.want == "" && c.Leaf.SerialNumber.Int64() != 7:
				t.Errorf("stored() serial %v; want 7", c.Leaf.SerialNumber)
			case tc.want != "" && (c != nil || !strings.Contains(why, tc.want)):
				t.Errorf("stored() = %v, %q; want nil, %q", c != nil, why, tc.want)
			}
		})
	}
}

func TestDNSProvider(t *testing.T) {
	t.Setenv("EXEC_PATH", "/bin/true")
	t.Setenv("RFC2136_NAMESERVER", "127.0.0.1:53")
	for _, name := range []string{"exec", "rfc2136", "dnsupdate"} {
		if p, err := DNSProvider(name); err != nil || p == nil {
			t.Errorf("DNSProvider(%q) = %v, %v; want a provider", name, p, err)
		}
		if !KnownDNSProvider(name) {
			t.Errorf("KnownDNSProvider(%q) = false", name)
		}
	}
	if _, err := DNSProvider("route53"); err == nil || KnownDNSProvider("route53") {
		t.Error("route53: want an error, and not known")
	}
	t.Setenv("EXEC_PATH", "")
	if _, err := DNSProvider("exec"); err == nil || !strings.Contains(err.Error(), "EXEC_PATH") {
		t.Errorf("DNSProvider(exec) without EXEC_PATH = %v; want an error naming it", err)
	}
}
