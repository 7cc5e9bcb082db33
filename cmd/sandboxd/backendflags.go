package main

import (
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/incus"
	"github.com/sandboxd/sandboxd/runtime/local"
)

// backendOpts are serve's flags that configure a backend beyond its name.
type backendOpts struct {
	volumeDir    string // local: where volumes live (<data-dir>/volumes)
	egressSubnet string
	egressAllow  cidrFlag
	egressDNS    addrFlag
	incusImages  imageFlag
	userNS       userNSFlag
	pauseReserve int
	favorDynMods bool
	ownCPUGroup  bool
	trackWriters bool
	initPath     string
	spawnPath    string
	baseRootfs   string
	registerer   prometheus.Registerer // the server's, for the egress name filter's metrics
	incusRemote  remoteOpts
}

// remoteOpts are the flags of --backend incus on a remote server or a
// cluster (incus/cluster.go).
type remoteOpts struct {
	url, clientCert, clientKey, serverCert string
	relayPort                              int
	sandboxSubnet                          string
	memberEnvd                             string
	lostAfter                              time.Duration
	simpleQuotas                           bool
	replicas                               bool
	poolReserve                            float64
	members                                listFlag
}

func (o *remoteOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.url, "incus-remote", "", "--backend incus: https://HOST:8443 of a remote Incus server or a member of an Incus cluster, instead of the local socket. Sandboxes then get a routed address of --incus-sandbox-subnet and are reached through `sandboxd relay` on each member (incus/README.md, Cluster)")
	fs.StringVar(&o.clientCert, "incus-client-cert", "", "--incus-remote: PEM client certificate, trusted by Incus (incus config trust add-certificate) and pinned by every member's relay")
	fs.StringVar(&o.clientKey, "incus-client-key", "", "--incus-remote: PEM key of --incus-client-cert")
	fs.StringVar(&o.serverCert, "incus-server-cert", "", "--incus-remote: PEM certificate the server (a cluster: its cluster certificate) and the relays present, pinned")
	fs.IntVar(&o.relayPort, "incus-relay-port", 8444, "--incus-remote: port of `sandboxd relay` on each member's address")
	fs.StringVar(&o.sandboxSubnet, "incus-sandbox-subnet", "10.135.0.0/16", "--incus-remote: IPv4 subnet of the sandboxes' routed addresses (the relays' --sandbox-subnet)")
	fs.StringVar(&o.memberEnvd, "incus-member-envd", "/usr/local/lib/sandboxd/envd", "--incus-remote: path of the static envd binary on every member")
	fs.BoolVar(&o.replicas, "incus-replicate-templates", true, "--incus-remote on a cluster: copy the top layer of every template sandboxd builds to every member whose pool keeps --incus-pool-reserve free after the copy, so that its sandboxes spread over the members (a copy is a whole root on a member's pool, 30-100 s each on the test bed, one at a time; a sandboxd stopped during one cancels it); =false: they all go to the member the template was built on")
	fs.Float64Var(&o.poolReserve, "incus-pool-reserve", 0.1, "--incus-remote: share of each member's storage pool kept free (at least 1 GiB, a quarter of a pool under 4 GiB): no sandbox is placed on a member with less free, no template replica made that would leave less, and a member short of it gives up its replicas")
	fs.BoolVar(&o.simpleQuotas, "incus-simple-quotas", false, "--incus-remote: the members' pools keep btrfs simple quotas (scripts/incus-setup.sh and incus-cluster.sh turn them on), so a root's size limits what the sandbox writes; without it the sizes allow for full quota groups, which count the blocks shared with the image too (sandboxd cannot read the mode of a remote pool)")
	fs.Var(&o.members, "incus-member", "--incus-remote: a cluster member sandboxes may be placed on; repeatable, or comma-separated (default: every member)")
	fs.DurationVar(&o.lostAfter, "incus-member-lost-after", 10*time.Second, "--incus-remote: how long a member stays unreachable before its sandboxes are given up (reported killed; deleted when it is back)")
}

func (o *backendOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.egressSubnet, "egress-subnet", "", "IPv4 subnet (/28 or larger) for sandboxes with internet access; its first address is their gateway (default 10.133.0.0/16 local, 10.134.0.0/16 incus; one per sandboxd on a host)")
	fs.Var(&o.egressAllow, "egress-allow-cidr", "IPv4 CIDR that sandboxes with internet access may reach although it is private or special-purpose (RFC 1918, CGNAT 100.64.0.0/10, link-local, ...: denied by default, see runtime/egress); repeatable, or comma-separated. The rules are the host's: give every sandboxd on a host the same list")
	fs.Var(&o.egressDNS, "egress-dns", "IPv4 address of a resolver for sandboxes with internet access (their resolv.conf, reachable on port 53 whatever its range, and the upstream of the DNS filter of domain rules); repeatable, or comma-separated (default: the host's resolv.conf, but loopback ones; 8.8.8.8 and 1.1.1.1 if none is left)")
	fs.Var(&o.userNS, "local-userns", "--backend local: user namespaces for sandboxes (root inside is uid 1000000000 on the host): auto (default: where the host can, probed at start; a --template directory that cannot be idmapped runs without), on (required: start fails without them; a bare --local-userns means on) or off. Give the mode with =, e.g. --local-userns=off")
	fs.StringVar(&o.spawnPath, "local-spawn", "", "--backend local: host path of sandboxd-spawn, the small C program that starts a sandbox in place of libcontainer's start chain, with about half the CPU of a create (default: sandboxd-spawn beside this binary; none: libcontainer starts every sandbox, through --local-init)")
	fs.StringVar(&o.initPath, "local-init", "", "--backend local: host path of sandboxd-init, the small helper that starts sandboxes so that the init libcontainer re-executes is not this 30 MB binary (default: sandboxd-init beside this binary; none: start them from this process, 1-2 ms slower per create)")
	fs.BoolVar(&o.favorDynMods, "local-cgroup-favordynmods", true, "--backend local: turn on the cgroup2 mount option favordynmods (Linux 6.0+; it stays on), so that moving a new sandbox's init into its cgroup does not wait for an RCU grace period (about 6-12 ms of a create that comes alone); false leaves the host's cgroup mount as it is")
	fs.BoolVar(&o.ownCPUGroup, "local-cpu-group", true, "--backend local: when sandboxd runs in the root of the cpu cgroup hierarchy (not placed by systemd or a container), it moves into a cpu cgroup of its own beside its sandboxes' (/sandboxd.daemon for the default run dir), weighted as one process a CPU, and leaves it at a clean stop. In a cpu cgroup, its own or another's, it runs 4 Go processors a CPU unless GOMAXPROCS is set: another tenant's claim from the spare pool while one floods took 3.1-4.4 ms at p50 instead of 13-18 (BENCHMARKS.md); false: it stays where it is with Go's default")
	fs.BoolVar(&o.trackWriters, "local-track-writers", false, "--backend local: record which process wrote each file a sandbox changes (the writer of its changes, with fanotify on Linux 5.17+); off by default: a shell loop writing small files runs 1.45-1.56x as long on a 2-core host; one large file, no slower (BENCHMARKS.md)")
	fs.StringVar(&o.baseRootfs, "base-rootfs", defaultBaseRootfs, "--backend local: root filesystem directory of the template base (Debian with Python, Node and npm, git, curl, sudo …; `make base` or scripts/base-rootfs.sh builds it, once); empty: base is the host view, as the template host")
	fs.IntVar(&o.pauseReserve, "pause-reserve-mb", 0, "--backend local: what a pause to disk must leave free on --pause-dir's filesystem (0: 5% of it, at least 256 MiB, and 5% of its inodes; negative: nothing); without room the sandbox is paused in memory")
	o.incusRemote.register(fs)
	o.incusImages = imageFlag{}
	fs.Var(o.incusImages, "incus-image", "template NAME=ALIAS for --backend incus: sandboxes of template NAME start from the Incus image ALIAS (or fingerprint); repeatable; base is sandboxd-base unless given")
}

// defaultBaseRootfs is where scripts/base-rootfs.sh links its newest build.
const defaultBaseRootfs = "/var/cache/sandboxd/base/rootfs"

// localBase returns --base-rootfs for local.Options.BaseRootfs, or an
// error that names the command building it when it is missing.
func (o *backendOpts) localBase() (string, error) {
	if o.baseRootfs == "" {
		return "", nil
	}
	if _, err := os.Stat(o.baseRootfs); err != nil {
		return "", fmt.Errorf("--base-rootfs %s: %w: build it with `make base` (scripts/base-rootfs.sh, as root, 8-15 min once), or give --base-rootfs= for the host view as base", o.baseRootfs, err)
	}
	return o.baseRootfs, nil
}

// subnet parses --egress-subnet; the zero Prefix means the backend's default.
func (o *backendOpts) subnet() (netip.Prefix, error) {
	if o.egressSubnet == "" {
		return netip.Prefix{}, nil
	}
	p, err := netip.ParsePrefix(o.egressSubnet)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("--egress-subnet: %w", err)
	}
	return p, nil
}

// cidrFlag collects repeated --egress-allow-cidr flags. One may list
// several, comma-separated: the form SANDBOXD_EGRESS_ALLOW_CIDR and a
// --config file can give.
type cidrFlag []netip.Prefix

func (f *cidrFlag) String() string { return fmt.Sprint([]netip.Prefix(*f)) }

func (f *cidrFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		if !p.Addr().Is4() {
			return fmt.Errorf("%s: want IPv4 (sandboxes have no IPv6)", s)
		}
		*f = append(*f, p.Masked())
	}
	return nil
}

// addrFlag collects repeated --egress-dns flags (or comma-separated
// lists): IPv4 addresses.
type addrFlag []netip.Addr

func (f *addrFlag) String() string { return fmt.Sprint([]netip.Addr(*f)) }

func (f *addrFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		if !a.Is4() {
			return fmt.Errorf("%s: want IPv4 (sandboxes have no IPv6)", s)
		}
		*f = append(*f, a)
	}
	return nil
}

// images is the Incus backend's template → image map: base → sandboxd-base
// (scripts/incus-setup.sh) plus --incus-image.
func (o *backendOpts) images() map[string]string {
	m := map[string]string{incus.DefaultTemplate: "sandboxd-base"}
	maps.Copy(m, o.incusImages)
	return m
}

// imageFlag collects repeated --incus-image NAME=ALIAS flags.
type imageFlag map[string]string

func (f imageFlag) String() string { return fmt.Sprint(map[string]string(f)) }

func (f imageFlag) Set(v string) error {
	name, alias, ok := strings.Cut(v, "=")
	if !ok || name == "" || alias == "" {
		return fmt.Errorf("want NAME=ALIAS, got %q", v)
	}
	if _, dup := f[name]; dup {
		return fmt.Errorf("template %q given twice", name)
	}
	f[name] = alias
	return nil
}

// userNSFlag is --local-userns: auto, on or off. It is a boolean flag to
// the flag package, so that a bare --local-userns (what it was before it
// had modes) still means on; a mode then needs the =.
type userNSFlag struct{ mode local.UserNSMode }

func (f *userNSFlag) String() string {
	if f == nil {
		return local.UserNSAuto.String()
	}
	return f.mode.String()
}

func (f *userNSFlag) Set(v string) error {
	m, err := local.ParseUserNSMode(v)
	if err != nil {
		return err
	}
	f.mode = m
	return nil
}

func (f *userNSFlag) IsBoolFlag() bool { return true }

// localInit resolves --local-init: a path as given, "none" for none, and by
// default sandboxd-init beside exe when it is there.
func (o *backendOpts) localInit(exe string) string { return besideOr(o.initPath, exe, "sandboxd-init") }

// localSpawn resolves --local-spawn as localInit does --local-init.
func (o *backendOpts) localSpawn(exe string) string {
	return besideOr(o.spawnPath, exe, "sandboxd-spawn")
}

// besideOr resolves a helper binary's flag: a path as given, "none" for
// none, and by default the binary name beside exe when it is there.
func besideOr(flag, exe, name string) string {
	switch flag {
	case "none":
		return ""
	case "":
		p := filepath.Join(filepath.Dir(exe), name)
		if _, err := os.Stat(p); err != nil {
			return ""
		}
		return p
	}
	return flag
}
