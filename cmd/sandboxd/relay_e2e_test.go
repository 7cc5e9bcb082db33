package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/incus/relay"
	"github.com/sandboxd/sandboxd/internal/testcert"
)

// TestRelayE2E: `sandboxd relay`, the real binary on a random loopback
// port with --no-firewall and --sandbox-subnet 127.0.0.0/8: a pinned
// client's bytes round-trip (with half-close) to an echo listener in the
// subnet, a target outside the subnet and a port nobody listens on are
// refused (RefusedError, forbidden and refused), an unpinned client gets
// no pipe, the resolv.conf is written, and SIGTERM ends it cleanly.
func TestRelayE2E(t *testing.T) {
	if e2eSkipReason != "" {
		t.Skip(e2eSkipReason)
	}
	dir := t.TempDir()
	srvCert, srvKey := writeTestCertPair(t, dir, "relay")
	cliCert, cliKey := writeTestCertPair(t, dir, "sandboxd")
	otherCert, otherKey := writeTestCertPair(t, dir, "stranger")
	resolv := filepath.Join(dir, "relay-state", "resolv.conf")

	echoLn, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echoLn.Close() })
	go func() {
		for {
			c, err := echoLn.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := io.Copy(c, c); err == nil {
					_ = c.(*net.TCPConn).CloseWrite()
				}
			}()
		}
	}()
	echoAddr := netip.MustParseAddrPort(echoLn.Addr().String())

	logPath := filepath.Join(dir, "relay.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(e2eBinDir, "sandboxd"), "relay",
		"--listen", "127.0.0.1:0",
		"--cert", srvCert, "--key", srvKey,
		"--client-cert", cliCert,
		"--sandbox-subnet", "127.0.0.0/8",
		"--egress-dns", "192.0.2.53",
		"--resolv-conf", resolv,
		"--no-firewall",
		"--log-level", "debug")
	cmd.Env = e2eSandboxdEnviron()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	addr := waitRelayListening(t, logPath, exited)

	if got, err := os.ReadFile(resolv); err != nil || string(got) != "nameserver 192.0.2.53\n" {
		t.Errorf("--resolv-conf = %q, %v; want the --egress-dns resolver", got, err)
	}

	d := relayDialer(t, cliCert, cliKey, srvCert)
	t.Run("round trip", func(t *testing.T) {
		c, err := d.Dial(t.Context(), addr, echoAddr)
		if err != nil {
			t.Fatalf("Dial(%s) = %v", echoAddr, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := strings.Repeat("through the relay ", 1000)
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if got, err := io.ReadAll(c); err != nil || string(got) != msg {
			t.Errorf("echo through the relay: %d bytes, %v; want the %d sent", len(got), err, len(msg))
		}
	})
	t.Run("refused targets", func(t *testing.T) {
		closed, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closedAddr := netip.MustParseAddrPort(closed.Addr().String())
		closed.Close()
		for _, tc := range []struct {
			target netip.AddrPort
			code   string
		}{
			{netip.MustParseAddrPort("10.135.0.7:49983"), relay.CodeForbidden},
			{netip.MustParseAddrPort("192.0.2.1:80"), relay.CodeForbidden},
			{closedAddr, relay.CodeRefused},
		} {
			c, err := d.Dial(t.Context(), addr, tc.target)
			var re *relay.RefusedError
			if !errors.As(err, &re) || re.Code != tc.code {
				if c != nil {
					c.Close()
				}
				t.Errorf("Dial(%s) = %v; want a RefusedError %s", tc.target, err, tc.code)
			}
		}
	})
	t.Run("unpinned client", func(t *testing.T) {
		c, err := relayDialer(t, otherCert, otherKey, srvCert).Dial(t.Context(), addr, echoAddr)
		if err == nil {
			c.Close()
			t.Fatal("an unpinned client got a pipe")
		}
		if errors.Is(err, relay.ErrRefused) {
			t.Errorf("Dial = %v; want a TLS failure, not ErrRefused", err)
		}
	})

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("relay after SIGTERM: %v\n%s", err, e2eTail(relayReadFile(logPath), 40))
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("relay still running 20 s after SIGTERM\n%s", e2eTail(relayReadFile(logPath), 40))
	}
	logs := string(relayReadFile(logPath))
	for _, want := range []string{`"msg":"relay: pipe"`, `"reason":"forbidden: `, `"msg":"relay: stopped"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("relay log lacks %s:\n%s", want, e2eTail([]byte(logs), 40))
		}
	}
}

// waitRelayListening waits for the relay's "listening" log line and
// returns its address.
func waitRelayListening(t *testing.T, logPath string, exited <-chan error) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			t.Fatalf("relay exited: %v\n%s", err, e2eTail(relayReadFile(logPath), 40))
		default:
		}
		sc := bufio.NewScanner(strings.NewReader(string(relayReadFile(logPath))))
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "relay: listening" {
				return line.Addr
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("relay did not log that it listens within 30 s\n%s", e2eTail(relayReadFile(logPath), 40))
	return ""
}

func relayReadFile(name string) []byte {
	b, _ := os.ReadFile(name)
	return b
}

func relayDialer(t *testing.T, certFile, keyFile, serverCertFile string) *relay.Dialer {
	t.Helper()
	cfg, err := relay.ClientTLS(relayReadFile(certFile), relayReadFile(keyFile), relayReadFile(serverCertFile))
	if err != nil {
		t.Fatal(err)
	}
	return &relay.Dialer{TLS: cfg, Timeout: 10 * time.Second}
}

// writeTestCertPair writes a self-signed certificate (testcert: what
// Incus makes for clusters and clients) and its key to dir as name.crt
// and name.key, and returns their paths.
func writeTestCertPair(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	return testcert.New(t, name).Write(t, dir, name)
}
