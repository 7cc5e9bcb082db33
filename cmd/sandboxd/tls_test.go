package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/agentbin"
)

func tlsTestInit(t *testing.T, dir, domain string) string {
	t.Helper()
	var out bytes.Buffer
	if err := tlsRun([]string{"init", "--domain", domain, "--dir", dir}, &out); err != nil {
		t.Fatalf("tls init --domain %s: %v", domain, err)
	}
	return out.String()
}

func tlsTestCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(raw)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("%s: no PEM certificate", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func tlsTestVerify(ca, leaf *x509.Certificate, name string) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots})
	return err
}

func TestTLSInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	const domain = "sbx.example.test"
	out := tlsTestInit(t, dir, domain)
	for _, want := range []string{
		"--tls-cert " + filepath.Join(dir, "cert.pem"), "--tls-key " + filepath.Join(dir, "key.pem"),
		"SSL_CERT_FILE=" + filepath.Join(dir, "ca.pem"), "NODE_EXTRA_CA_CERTS=" + filepath.Join(dir, "ca.pem"),
		"update-ca-certificates", "E2B_DOMAIN=" + domain, "E2B_API_URL=https://api." + domain + ":3000/v1/sandboxes/e2b",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	ca := tlsTestCert(t, filepath.Join(dir, "ca.pem"))
	leaf := tlsTestCert(t, filepath.Join(dir, "cert.pem"))
	if !ca.IsCA {
		t.Error("ca.pem is not a CA")
	}
	for _, name := range []string{domain, "x." + domain, "49983-abc." + domain, "api." + domain, "localhost", "127.0.0.1"} {
		if err := tlsTestVerify(ca, leaf, name); err != nil {
			t.Errorf("verify %s: %v", name, err)
		}
	}
	for _, name := range []string{"other.example", "a.b." + domain, "10.0.0.1"} {
		if err := tlsTestVerify(ca, leaf, name); err == nil {
			t.Errorf("verify %s: want an error", name)
		}
	}
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got < 364*24*time.Hour || got > 367*24*time.Hour {
		t.Errorf("leaf valid for %v, want about a year", got)
	}
	if ca.SerialNumber.Cmp(leaf.SerialNumber) == 0 || leaf.SerialNumber.Sign() <= 0 {
		t.Errorf("serials: ca %v leaf %v", ca.SerialNumber, leaf.SerialNumber)
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")); err != nil {
		t.Errorf("cert.pem/key.pem: %v", err)
	}
	for name, want := range map[string]os.FileMode{"ca.pem": 0o644, "ca-key.pem": 0o600, "cert.pem": 0o644, "key.pem": 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode().Perm(), want)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 4 {
		t.Errorf("dir holds %d files, want 4 (no temp files left)", len(ents))
	}

	// A second init (another domain) reuses the CA: what it signed before
	// still verifies, and so does the new leaf.
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	caKeyPEM, _ := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	out = tlsTestInit(t, dir, "Other.Test.")
	if !strings.Contains(out, "reused") {
		t.Errorf("second init does not report the CA as reused:\n%s", out)
	}
	caPEM2, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	caKeyPEM2, _ := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	if !bytes.Equal(caPEM, caPEM2) || !bytes.Equal(caKeyPEM, caKeyPEM2) {
		t.Error("second init replaced the CA")
	}
	leaf2 := tlsTestCert(t, filepath.Join(dir, "cert.pem"))
	if err := tlsTestVerify(ca, leaf2, "49983-abc.other.test"); err != nil {
		t.Errorf("second leaf: %v", err)
	}
	if err := tlsTestVerify(ca, leaf, "x."+domain); err != nil {
		t.Errorf("first leaf after the second init: %v", err)
	}

	// Half a CA is refused rather than silently replaced.
	if err := os.Remove(filepath.Join(dir, "ca-key.pem")); err != nil {
		t.Fatal(err)
	}
	if err := tlsRun([]string{"init", "--domain", domain, "--dir", dir}, io.Discard); err == nil {
		t.Error("init with ca.pem but no ca-key.pem: want an error")
	}
}

func TestTLSInitDefaultDir(t *testing.T) {
	dataDir := t.TempDir()
	if err := tlsRun([]string{"init", "--domain", "localhost", "--data-dir", dataDir}, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ca.pem", "ca-key.pem", "cert.pem", "key.pem"} {
		if _, err := os.Stat(filepath.Join(dataDir, "tls", name)); err != nil {
			t.Error(err)
		}
	}
}

func TestTLSInitBadDomains(t *testing.T) {
	for _, d := range []string{"", " ", "*.example.com", "a.*.com", "127.0.0.1", "::1", "[::1]", "-a.com", "a-.com",
		"a..com", ".", "exa mple.com", "ex_ample.com", "é.com", "a/b", strings.Repeat("a", 64) + ".com",
		strings.Repeat("abcdefghi.", 26) + "com"} {
		dir := t.TempDir()
		if err := tlsRun([]string{"init", "--domain", d, "--dir", dir}, io.Discard); err == nil {
			t.Errorf("--domain %q: want an error", d)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("--domain %q: wrote files", d)
		}
	}
	for _, args := range [][]string{nil, {"create"}, {"init", "--domain", "a.test", "extra"}} {
		if err := tlsRun(args, io.Discard); err == nil {
			t.Errorf("tls %q: want an error", args)
		}
	}
}

// TestTLSServe starts the built sandboxd with --tls-cert/--tls-key and asks
// /health over h2 and HTTP/1.1 with a client that trusts only ca.pem.
func TestTLSServe(t *testing.T) {
	e := newE2EEnv(t) // skips when the host cannot run sandboxd; cleans the run dir up
	const domain = "sbx.test"
	dir := filepath.Join(e.dataDir, "tls")
	tlsTestInit(t, dir, domain)

	port, err := e2eFreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	logPath := filepath.Join(e.logDir, "sandboxd-tls.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(e2eBinDir, "sandboxd"), "serve",
		"--listen", addr, "--data-dir", e.dataDir, "--run-dir", e.runDir,
		"--envd", agentbin.Path(e2eBinDir), "--domain", domain,
		"--tls-cert", filepath.Join(dir, "cert.pem"), "--tls-key", filepath.Join(dir, "key.pem"))
	cmd.Env = e2eSandboxdEnviron()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Registered after newE2EEnv's cleanup, so it runs before it.
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sandboxd exit after SIGTERM: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Error("sandboxd did not exit within 30s of SIGTERM")
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("sandboxd log:\n%s", e2eTail(b, 40))
		}
	})

	roots := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil || !roots.AppendCertsFromPEM(caPEM) {
		t.Fatalf("ca.pem: %v", err)
	}
	// Every name dials the server: api.sbx.test needs no DNS.
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	}
	client := func(h2 bool) *http.Client {
		var p http.Protocols
		p.SetHTTP1(!h2)
		p.SetHTTP2(h2)
		tr := &http.Transport{DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: roots}, Protocols: &p}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	get := func(c *http.Client, url string) (*http.Response, error) {
		resp, err := c.Get(url)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return resp, fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return resp, nil
	}

	h2, h1 := client(true), client(false)
	healthURL := "https://" + addr + "/health"
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case err := <-done:
			done <- err
			b, _ := os.ReadFile(logPath)
			t.Fatalf("sandboxd exited: %v\n%s", err, e2eTail(b, 40))
		default:
		}
		_, err := get(h2, healthURL)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /health over TLS did not answer 200 within 90s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	for _, tc := range []struct {
		c     *http.Client
		url   string
		major int
	}{
		{h2, healthURL, 2},
		{h1, healthURL, 1},
		{h2, "https://api." + domain + ":" + strconv.Itoa(port) + "/health", 2},
		{h1, "https://api." + domain + ":" + strconv.Itoa(port) + "/health", 1},
	} {
		resp, err := get(tc.c, tc.url)
		if err != nil {
			t.Errorf("HTTP/%d: %v", tc.major, err)
			continue
		}
		if resp.ProtoMajor != tc.major || resp.TLS == nil {
			t.Errorf("GET %s: protocol %s (TLS %v), want HTTP/%d over TLS", tc.url, resp.Proto, resp.TLS != nil, tc.major)
		}
	}

	// Plain HTTP on the TLS port is not served, and a client that does not
	// trust the CA is refused.
	if resp, err := http.Get("http://" + addr + "/health"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP on the TLS listener answered 200")
		}
	}
	untrusted := &http.Client{Timeout: 10 * time.Second}
	var uerr *tls.CertificateVerificationError
	if _, err := untrusted.Get(healthURL); !errors.As(err, &uerr) {
		t.Errorf("client without ca.pem: %v, want a certificate verification error", err)
	}
}
