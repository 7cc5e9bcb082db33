// Command fakeinet is the SDK suites' stand-in for the internet: a network
// namespace of its own (sbxfi-<pid>) behind a veth (fih<pid hex> on the
// host, fio<pid hex> in the namespace) on a free /29 of 192.52.193.0/24, a
// block IANA marks globally reachable (AMT relays, RFC 7450) that no host
// here talks to, so sandboxd's egress treats it as the internet. The
// namespace end holds two servers, ONE (.2) and TWO (.3), each with the
// servers of internal/fakeinet on HTTP (80) and HTTPS (443, one
// self-signed certificate for every name below); ONE also answers DNS on
// port 53 (UDP and TCP) for
//
//	allowed.sbx.test, denied.sbx.test, a.wild.sbx.test -> ONE
//	evil.sbx.test                                      -> TWO
//
// and forwards other names to the host's IPv4 resolvers from
// /etc/resolv.conf (loopback ones left out), from the host's namespace, so
// that sandboxd can use ONE as its only --egress-dns and other names (PyPI
// for template builds) still resolve.
//
// compat-tests/run.sh starts it for the sandboxd and incus modes. It
// prints COMPAT_INET_ONE=<addr>, COMPAT_INET_TWO=<addr> and then "ready"
// on stdout, serves until SIGTERM or SIGINT and then removes its veth and
// namespace. At start it removes what earlier runs left behind: namespaces
// sbxfi-<pid> whose process is gone, and their veths. It needs root and
// iproute2. No packet is sent before the route to ONE and TWO is checked
// to go through its own veth.
package main

import (
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/netnsrun"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/fakeinet"
)

const (
	nsPrefix = "sbxfi-" // namespaces: nsPrefix + pid
	hostPfx  = "fih"    // host end of the veth: hostPfx + pid in hex
	nsPfx    = "fio"    // namespace end: nsPfx + pid in hex
	progName = "fakeinet"
)

// tlsNames are the names of the HTTPS servers' certificate.
var tlsNames = []string{"allowed.sbx.test", "denied.sbx.test", "a.wild.sbx.test", "*.wild.sbx.test", "evil.sbx.test"}

func main() {
	log.SetFlags(0)
	log.SetPrefix("fakeinet: ")
	if os.Geteuid() != 0 {
		log.Fatal("needs root (network namespaces, veths)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		log.Fatal("needs ip (iproute2)")
	}
	removeStale()

	pid := os.Getpid()
	ns := nsPrefix + strconv.Itoa(pid)
	hostIf, nsIf := hostPfx+strconv.FormatInt(int64(pid), 16), nsPfx+strconv.FormatInt(int64(pid), 16)
	base, err := freeBlock()
	if err != nil {
		log.Fatal(err)
	}
	host, one, two := base.Next(), base.Next().Next(), base.Next().Next().Next()

	err = setup(ns, hostIf, nsIf, host, one, two)
	if err == nil {
		err = checkRoutes(hostIf, one, two)
	}
	var closers []func() error
	if err == nil {
		closers, err = serve(ns, one, two)
	}
	if err != nil {
		teardown(ns, hostIf)
		log.Fatal(err)
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fmt.Printf("COMPAT_INET_ONE=%s\nCOMPAT_INET_TWO=%s\nready\n", one, two)
	log.Printf("ONE %s, TWO %s in namespace %s (host %s on %s)", one, two, ns, host, hostIf)
	s := <-sig
	log.Printf("%v: removing %s and %s", s, hostIf, ns)
	for _, c := range closers {
		_ = c()
	}
	teardown(ns, hostIf)
}

// removeStale deletes the namespaces sbxfi-<pid> (and their host veths)
// whose process is gone or no longer fakeinet.
func removeStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], nsPrefix) {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(f[0], nsPrefix))
		if err != nil || pid <= 0 || alive(pid) {
			continue
		}
		log.Printf("removing %s, left by an earlier run", f[0])
		teardown(f[0], hostPfx+strconv.FormatInt(int64(pid), 16))
	}
}

// alive reports whether pid is a running fakeinet.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(comm)) == progName
}

// teardown removes the host veth (which takes its peer along) and the
// namespace; both may already be gone.
func teardown(ns, hostIf string) {
	if exec.Command("ip", "link", "show", "dev", hostIf).Run() == nil {
		if out, err := exec.Command("ip", "link", "del", "dev", hostIf).CombinedOutput(); err != nil {
			log.Printf("ip link del %s: %v: %s", hostIf, err, out)
		}
	}
	if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
		log.Printf("ip netns del %s: %v: %s", ns, err, out)
	}
}

// freeBlock picks a /29 of 192.52.193.0/24 that no route of the host but
// the default covers (another fakeinet, the egress tests' fake networks),
// starting at a random one; it returns the block's first address.
func freeBlock() (netip.Addr, error) {
	var rnd [1]byte
	_, _ = rand.Read(rnd[:])
	for i := range 32 {
		b := netip.AddrFrom4([4]byte{192, 52, 193, byte((int(rnd[0])+i)%32) * 8})
		free := true
		for a, j := b, 0; j < 8 && free; a, j = a.Next(), j+1 {
			ok, err := onlyDefaultRoute(a)
			if err != nil {
				return netip.Addr{}, err
			}
			free = ok
		}
		if free {
			return b, nil
		}
	}
	return netip.Addr{}, errors.New("no /29 of 192.52.193.0/24 is free of the host's routes")
}

// onlyDefaultRoute reports whether no route but the default covers a.
func onlyDefaultRoute(a netip.Addr) (bool, error) {
	out, err := exec.Command("ip", "-4", "route", "show", "match", a.String()).Output()
	if err != nil {
		return false, fmt.Errorf("ip -4 route show match %s: %w", a, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" && !strings.HasPrefix(line, "default ") {
			return false, nil
		}
	}
	return true, nil
}

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setup makes namespace ns and the veth hostIf/nsIf: host on the host's
// end, one and two on the namespace's (all in one /29), the namespace's
// default route via host.
func setup(ns, hostIf, nsIf string, host, one, two netip.Addr) error {
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", hostIf, "type", "veth", "peer", "name", nsIf},
		{"link", "set", nsIf, "netns", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "addr", "add", one.String() + "/29", "dev", nsIf},
		{"-n", ns, "addr", "add", two.String() + "/29", "dev", nsIf},
		{"-n", ns, "link", "set", nsIf, "up"},
		{"-n", ns, "route", "add", "default", "via", host.String()},
		{"addr", "add", host.String() + "/29", "dev", hostIf},
		{"link", "set", hostIf, "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return err
		}
	}
	return nil
}

// checkRoutes makes sure the host sends to each server through hostIf.
func checkRoutes(hostIf string, servers ...netip.Addr) error {
	for _, s := range servers {
		out, err := exec.Command("ip", "route", "get", s.String()).CombinedOutput()
		if err != nil || !strings.Contains(string(out)+" ", "dev "+hostIf+" ") {
			return fmt.Errorf("route to %s is not via %s (%s, %v): refusing to serve", s, hostIf, strings.TrimSpace(string(out)), err)
		}
	}
	return nil
}

// upstreams are the host's IPv4 resolvers but loopback ones, on port 53.
func upstreams() []netip.AddrPort {
	data, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		log.Printf("no upstream resolvers: %v", err)
		return nil
	}
	var out []netip.AddrPort
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil || !a.Is4() || a.IsLoopback() {
			continue
		}
		out = append(out, netip.AddrPortFrom(a, 53))
	}
	return out
}

// serve opens the servers' sockets inside ns and serves them from
// goroutines that run in the host's namespace (so that the DNS server's
// forwards leave from the host); it returns what closes them.
func serve(ns string, one, two netip.Addr) ([]func() error, error) {
	cfg, err := fakeinet.TLSConfig(tlsNames...)
	if err != nil {
		return nil, err
	}
	var (
		lns []net.Listener
		pc  net.PacketConn
	)
	err = netnsrun.RunNamed(ns, func() error {
		for _, a := range []netip.Addr{one, two} {
			for _, port := range []uint16{80, 443, 53} {
				if port == 53 && a != one {
					continue
				}
				ln, err := net.Listen("tcp", netip.AddrPortFrom(a, port).String())
				if err != nil {
					return err
				}
				lns = append(lns, ln)
			}
		}
		var err error
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(one, 53).String())
		return err
	})
	closers := []func() error{}
	for _, ln := range lns {
		closers = append(closers, ln.Close)
	}
	if pc != nil {
		closers = append(closers, pc.Close)
	}
	if err != nil {
		for _, c := range closers {
			_ = c()
		}
		return nil, err
	}
	d := &fakeinet.DNS{
		Names: map[string]netip.Addr{
			"allowed.sbx.test": one, "denied.sbx.test": one, "a.wild.sbx.test": one,
			"evil.sbx.test": two,
		},
		Upstream: upstreams(),
	}
	log.Printf("DNS on %s:53 forwards other names to %v", one, d.Upstream)
	go d.ServeUDP(pc)
	for _, ln := range lns {
		port := ln.Addr().(*net.TCPAddr).Port
		switch port {
		case 53:
			go d.ServeTCP(ln)
		case 443:
			go func() { _ = http.Serve(tls.NewListener(ln, cfg), fakeinet.Handler()) }()
		default:
			go func() { _ = http.Serve(ln, fakeinet.Handler()) }()
		}
	}
	return closers, nil
}
