package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
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

// acmeTool finds a program of Let's Encrypt's ACME test servers:
// scripts/deps.sh installs them in bin/tools, or PATH has them. Missing,
// the test skips, but fails in CI, whose deps.sh run installs them.
func acmeTool(t *testing.T, name string) string {
	t.Helper()
	if p, err := filepath.Abs(filepath.Join("..", "..", "bin", "tools", name)); err == nil && e2eExists(p) {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	msg := name + " not found in bin/tools or PATH (scripts/deps.sh installs it)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// acmeStart runs a program until the test ends, its output in a log the
// test prints when it fails.
func acmeStart(t *testing.T, logDir, name string, env []string, args ...string) {
	t.Helper()
	logPath := filepath.Join(logDir, filepath.Base(name)+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s log:\n%s", filepath.Base(name), e2eTail(b, 30))
		}
	})
}

// acmeWait polls fn until it succeeds or limit passes.
func acmeWait(t *testing.T, what string, limit time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func acmeFreePort(t *testing.T) string {
	t.Helper()
	p, err := e2eFreePort()
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(p)
}

// acmeExecScript is lego's exec provider contract (PROGRAM present|cleanup
// FQDN VALUE) over pebble-challtestsrv's management API, in bash alone
// (/dev/tcp): it sets or clears the TXT record and logs each call.
const acmeExecScript = `#!/usr/bin/env bash
set -euo pipefail
case $1 in
present) path=/set-txt body="{\"host\":\"$2\",\"value\":\"$3\"}" ;;
cleanup) path=/clear-txt body="{\"host\":\"$2\"}" ;;
*) echo "unknown action $1" >&2; exit 2 ;;
esac
echo "$1 $2" >>"$ACME_TEST_CALLS"
exec 3<>"/dev/tcp/127.0.0.1/$ACME_TEST_MGMT_PORT"
printf 'POST %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' "$path" "${#body}" "$body" >&3
read -r status <&3
[[ $status == *" 200 "* ]] || { echo "challtestsrv $path: $status" >&2; exit 1; }
`

// TestACMEServe obtains a wildcard certificate from pebble (Let's
// Encrypt's ACME test server) by DNS-01, the TXT records set through
// lego's exec provider in pebble-challtestsrv, pebble's resolver; checks
// that it serves api.<domain> and <port>-<id>.<domain> to a client that
// trusts only pebble's root; that a restart serves the stored one
// without a new order; and that it is renewed in the background.
func TestACMEServe(t *testing.T) {
	e := newE2EEnv(t) // skips when the host cannot run sandboxd
	challtestsrv := acmeTool(t, "pebble-challtestsrv")
	pebble := acmeTool(t, "pebble")
	work := t.TempDir()

	// pebble's own HTTPS certificate, for 127.0.0.1, from a CA of ours.
	tlsDir := filepath.Join(work, "pebble-tls")
	tlsTestInit(t, tlsDir, "localhost")
	caPath := filepath.Join(tlsDir, "ca.pem")

	dnsAddr := net.JoinHostPort("127.0.0.1", acmeFreePort(t))
	mgmtPort := acmeFreePort(t)
	acmeStart(t, e.logDir, challtestsrv, nil, "-dnsserver", dnsAddr, "-management", "127.0.0.1:"+mgmtPort,
		"-http01", "", "-https01", "", "-doh", "", "-tlsalpn01", "")

	pebbleAddr := net.JoinHostPort("127.0.0.1", acmeFreePort(t))
	pebbleMgmt := net.JoinHostPort("127.0.0.1", acmeFreePort(t))
	var cfg struct {
		Pebble map[string]any `json:"pebble"`
	}
	cfg.Pebble = map[string]any{
		"listenAddress": pebbleAddr, "managementListenAddress": pebbleMgmt,
		"certificate": filepath.Join(tlsDir, "cert.pem"), "privateKey": filepath.Join(tlsDir, "key.pem"),
		"httpPort": 5002, "tlsPort": 5001, "keyAlgorithm": "ecdsa",
		"retryAfter": map[string]int{"authz": 1, "order": 1},
		// Due for renewal 40 s after issuance: the test sees one.
		"profiles": map[string]any{"default": map[string]any{"description": "one minute", "validityPeriod": 60}},
	}
	cfgJSON, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(work, "pebble.json")
	if err := os.WriteFile(cfgPath, cfgJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	// No authorization reuse: every order, the renewal too, solves DNS-01.
	acmeStart(t, e.logDir, pebble, []string{"PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0"},
		"-config", cfgPath, "-dnsserver", dnsAddr)

	caPool := x509.NewCertPool()
	caPEM, err := os.ReadFile(caPath)
	if err != nil || !caPool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("%s: %v", caPath, err)
	}
	pebbleClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: caPool}}}
	t.Cleanup(pebbleClient.CloseIdleConnections)
	get := func(c *http.Client, url string) ([]byte, error) {
		resp, err := c.Get(url)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return b, err
	}
	acmeWait(t, "challtestsrv", 30*time.Second, func() error {
		resp, err := http.Get("http://127.0.0.1:" + mgmtPort + "/dns-request-history?host=x")
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
	acmeWait(t, "pebble", 30*time.Second, func() error { _, err := get(pebbleClient, "https://"+pebbleAddr+"/dir"); return err })
	var rootPEM []byte
	acmeWait(t, "pebble's root", 10*time.Second, func() (err error) {
		rootPEM, err = get(pebbleClient, "https://"+pebbleMgmt+"/roots/0")
		return err
	})
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootPEM) {
		t.Fatalf("pebble's /roots/0 is no PEM certificate:\n%s", rootPEM)
	}

	script := filepath.Join(work, "dns-exec.sh")
	if err := os.WriteFile(script, []byte(acmeExecScript), 0o755); err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(work, "exec-calls.log")
	port := acmeFreePort(t)
	addr := net.JoinHostPort("127.0.0.1", port)
	const domain = "sbx.test"
	env := []string{"EXEC_PATH=" + script, "EXEC_POLLING_INTERVAL=1", "EXEC_PROPAGATION_TIMEOUT=30",
		"EXEC_SEQUENCE_INTERVAL=1", "ACME_TEST_CALLS=" + calls, "ACME_TEST_MGMT_PORT=" + mgmtPort}
	args := []string{"--domain", domain + ":" + port, "--acme-dns", "exec", "--acme-email", "admin@" + domain,
		"--acme-directory", "https://" + pebbleAddr + "/dir", "--acme-ca-root", caPath, "--acme-dns-resolver", dnsAddr}

	// Every name dials the server: no DNS for sbx.test is needed.
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	}
	tr := &http.Transport{DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: roots}}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	// handshake verifies the certificate served for name against
	// pebble's root alone.
	handshake := func(name string) (*x509.Certificate, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
			&tls.Config{ServerName: name, RootCAs: roots})
		if err != nil {
			return nil, fmt.Errorf("TLS to %s as %s: %w", addr, name, err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0], nil
	}
	// served checks the handshake for the API's, a sandbox's and the
	// domain's names, and returns the leaf.
	served := func() *x509.Certificate {
		t.Helper()
		var leaf *x509.Certificate
		for _, name := range []string{"api." + domain, "49983-x." + domain, domain} {
			var err error
			if leaf, err = handshake(name); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{domain, "*." + domain} {
			if !strings.Contains(strings.Join(leaf.DNSNames, " "), name) {
				t.Errorf("certificate names %v; want %s among them", leaf.DNSNames, name)
			}
		}
		if _, err := get(client, "https://api."+domain+":"+port+"/health"); err != nil {
			t.Error(err)
		}
		return leaf
	}

	stop := acmeSandboxd(t, e, "sandboxd-acme-1.log", addr, env, args, client, "https://api."+domain+":"+port+"/health")
	leaf1 := served()
	presents := acmeCount(t, calls, "present _acme-challenge."+domain+".")
	if presents < 1 {
		t.Errorf("exec provider called present %d times; want at least 1", presents)
	}
	if n := acmeCount(t, calls, "cleanup "); n != presents {
		t.Errorf("exec provider: %d cleanups for %d presents", n, presents)
	}
	for name, want := range map[string]os.FileMode{"account.key": 0o600, "key.pem": 0o600, "cert.pem": 0o644} {
		fi, err := os.Stat(filepath.Join(e.dataDir, "acme", name))
		if err != nil {
			t.Error(err)
		} else if fi.Mode().Perm() != want {
			t.Errorf("acme/%s: mode %v; want %v", name, fi.Mode().Perm(), want)
		}
	}
	metrics, err := get(client, "https://api."+domain+":"+port+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	gauge := fmt.Sprintf("sandboxd_tls_cert_expiry_timestamp_seconds %g", float64(leaf1.NotAfter.Unix()))
	if !strings.Contains(string(metrics), gauge) {
		t.Errorf("/metrics lacks %q", gauge)
	}
	stop()

	// A restart serves the stored certificate: no new order, no DNS call.
	stop = acmeSandboxd(t, e, "sandboxd-acme-2.log", addr, env, args, client, "https://api."+domain+":"+port+"/health")
	defer stop()
	leaf2 := served()
	if leaf1.SerialNumber.Cmp(leaf2.SerialNumber) != 0 {
		t.Errorf("after a restart: serial %x; want the stored %x", leaf2.SerialNumber, leaf1.SerialNumber)
	}
	if n := acmeCount(t, calls, "present "); n != presents {
		t.Errorf("after a restart: %d presents; want still %d", n, presents)
	}

	// The renewal in the background, due at two thirds of the minute.
	var leaf3 *x509.Certificate
	acmeWait(t, "a renewed certificate", time.Until(leaf1.NotAfter)+10*time.Second, func() (err error) {
		if leaf3, err = handshake("api." + domain); err == nil && leaf3.SerialNumber.Cmp(leaf1.SerialNumber) == 0 {
			err = fmt.Errorf("still serial %x", leaf1.SerialNumber)
		}
		return err
	})
	if leaf := served(); leaf.SerialNumber.Cmp(leaf3.SerialNumber) != 0 {
		t.Errorf("serial %x after the renewal; want %x for every name", leaf.SerialNumber, leaf3.SerialNumber)
	}
	if n := acmeCount(t, calls, "present "); n <= presents {
		t.Errorf("renewal: %d presents; want more than %d", n, presents)
	}
	stored, err := tls.LoadX509KeyPair(filepath.Join(e.dataDir, "acme", "cert.pem"), filepath.Join(e.dataDir, "acme", "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if stored.Leaf.SerialNumber.Cmp(leaf3.SerialNumber) != 0 {
		t.Errorf("stored serial %x after the renewal; want the served %x", stored.Leaf.SerialNumber, leaf3.SerialNumber)
	}
}

// acmeCount counts the lines of the exec script's log that start with
// prefix.
func acmeCount(t *testing.T, path, prefix string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("exec provider log: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// acmeSandboxd starts sandboxd serve on listen with args and env added and
// waits until healthURL answers 200 through client; stop sends SIGTERM and
// waits.
func acmeSandboxd(t *testing.T, e *e2eEnv, logName, listen string, env, args []string, client *http.Client, healthURL string) (stop func()) {
	t.Helper()
	logPath := filepath.Join(e.logDir, logName)
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(e2eBinDir, "sandboxd"), append([]string{"serve",
		"--listen", listen, "--data-dir", e.dataDir, "--run-dir", e.runDir,
		"--envd", agentbin.Path(e2eBinDir)}, args...)...)
	cmd.Env = append(e2eSandboxdEnviron(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
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
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s:\n%s", logName, e2eTail(b, 40))
		}
	}
	// Registered after newE2EEnv's cleanup, so it runs before it.
	t.Cleanup(stop)
	deadline := time.Now().Add(120 * time.Second)
	for {
		select {
		case err := <-done:
			done <- err
			b, _ := os.ReadFile(logPath)
			t.Fatalf("sandboxd exited: %v\n%s", err, e2eTail(b, 40))
		default:
		}
		resp, err := client.Get(healthURL)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return stop
			}
			err = fmt.Errorf("GET %s: %s", healthURL, resp.Status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxd with ACME: no 200 from %s within 120s: %v", healthURL, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
