package main

// sandboxd relay: what runs on every member of an Incus cluster that
// sandboxd drives. It is the member's byte pipe from sandboxd to its
// sandboxes' addresses (incus/relay), and sets up the member's firewall
// for them (runtime/egress SetupMember) and the resolv.conf the backend
// binds into sandboxes with internet access.

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/incus/relay"
	"github.com/sandboxd/sandboxd/internal/certpin"
	"github.com/sandboxd/sandboxd/runtime/egress"
)

// relayShutdownGrace is how long a stopping relay waits for its pipes
// (envd's streams, the proxy's kept connections) before it cuts them.
const relayShutdownGrace = 10 * time.Second

func relayCmd(args []string) error {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	var (
		listen      = fs.String("listen", ":8444", "address to serve the relay on (TLS 1.3, pinned client certificates)")
		certFile    = fs.String("cert", "/var/lib/incus/cluster.crt", "the relay's certificate, PEM: on an Incus cluster member the cluster certificate, which sandboxd pins already")
		keyFile     = fs.String("key", "/var/lib/incus/cluster.key", "the key of --cert, PEM")
		subnet      = fs.String("sandbox-subnet", "10.135.0.0/16", "IPv4 subnet of the sandboxes' addresses (routed NICs): the only targets the relay dials, and the subnet of the member's firewall")
		resolvConf  = fs.String("resolv-conf", "/var/lib/sandboxd-relay/resolv.conf", "where to write the resolv.conf of sandboxes with internet access, which the backend binds into them")
		noFirewall  = fs.Bool("no-firewall", false, "leave the member's nftables table and ip_forward alone (another table manages them, or a test); the relay still marks its connections to sandboxes (SO_MARK, which needs CAP_NET_ADMIN)")
		logLevel    = fs.String("log-level", "info", "debug (a line per pipe), info, warn or error")
		clientCerts listFlag
		allow       cidrFlag
		dns         addrFlag
	)
	fs.Var(&clientCerts, "client-cert", "PEM certificate of a sandboxd allowed to dial (the client certificate it presents to relays); repeatable, or comma-separated; at least one")
	fs.Var(&allow, "egress-allow-cidr", "IPv4 CIDR that sandboxes with internet access may reach although it is private or special-purpose (as serve's); repeatable, or comma-separated")
	fs.Var(&dns, "egress-dns", "IPv4 address of a resolver for sandboxes with internet access (as serve's); repeatable, or comma-separated (default: the host's resolv.conf, but loopback ones)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("relay: unexpected argument %q", fs.Arg(0))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	sub, err := netip.ParsePrefix(*subnet)
	if err != nil || !sub.Addr().Is4() {
		return fmt.Errorf("--sandbox-subnet %q: want an IPv4 CIDR", *subnet)
	}
	sub = sub.Masked()
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		return fmt.Errorf("relay: --cert/--key: %w", err)
	}
	if len(clientCerts) == 0 {
		return errors.New("relay: --client-cert: give the certificate of at least one sandboxd")
	}
	pins, err := loadPins(clientCerts)
	if err != nil {
		return err
	}

	// The firewall first: no pipe before the replies it needs can pass,
	// and sandboxes the member runs already are fenced from the start.
	var eg *egress.Egress
	if *noFirewall {
		if eg, err = egress.New(sub, allow...); err == nil {
			err = eg.UseResolvers(dns)
		}
	} else {
		eg, err = egress.SetupMember(sub, dns, allow...)
	}
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if err := writeFileAtomic(*resolvConf, eg.ResolvConf()); err != nil {
		return fmt.Errorf("relay: --resolv-conf: %w", err)
	}

	srv, err := relay.NewServer(relay.ServerConfig{
		Certificate: cert,
		ClientCerts: pins,
		Allow:       []netip.Prefix{sub},
		Mark:        egress.RelayMark,
		Log:         log,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	log.Info("relay: listening", "addr", ln.Addr().String(), "sandbox_subnet", sub.String(),
		"client_certs", len(pins), "firewall", !*noFirewall, "resolv_conf", *resolvConf)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		srv.Close()
		return err
	case <-ctx.Done():
	}
	log.Info("relay: shutting down", "grace", relayShutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), relayShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("relay: pipes still open after the grace period: closing them", "err", err)
	}
	srv.Close()
	if err := <-served; !errors.Is(err, relay.ErrServerClosed) {
		return err
	}
	log.Info("relay: stopped")
	return nil
}

// loadPins reads the certificate files of --client-cert, DER.
func loadPins(f listFlag) ([][]byte, error) {
	var ders [][]byte
	for _, name := range f {
		raw, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("--client-cert: %w", err)
		}
		der, err := certpin.DER(raw)
		if err != nil {
			return nil, fmt.Errorf("--client-cert %s: %w", name, err)
		}
		ders = append(ders, der)
	}
	return ders, nil
}

// writeFileAtomic replaces name with data (mode 0644: sandboxes read it),
// making its directory: a sandbox starting meanwhile binds either the old
// file or the new one, never a partial one.
func writeFileAtomic(name string, data []byte) error {
	dir := filepath.Dir(name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // gone already once renamed
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), name)
}
