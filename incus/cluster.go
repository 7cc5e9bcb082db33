package incus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/egress"
)

// Cluster mode (Options.Cluster): sandboxd drives an Incus cluster from
// anywhere, over HTTPS, and reaches sandboxes through a relay on each member.
//
// The single-host data plane (a host directory with envd's socket, setns
// for loopback and the veth) needs sandboxd on the Incus host. In a cluster
// every sandbox instead gets an Incus "routed" NIC: a /32 of the sandbox
// subnet, which sandboxd allocates cluster-wide and Incus configures on
// both ends, with the host end named sbx<hash> (internet access) or
// sbn<hash> (none). envd listens on that address. The subnet is routed
// nowhere: only the member host reaches its sandboxes, and sandboxd reaches
// them through the member's relay (incus/relay: mutual TLS, pinned
// certificates both ways, dials only into the sandbox subnet, then a byte
// pipe). The relay also installs the member's firewall (runtime/egress):
// sandboxes reach neither each other nor the member, sbn* ones nothing at
// all, sbx* ones the internet only.
//
// Placement is sandboxd's: of the members that Incus reports online and
// whose relay answers, the one whose sandboxes' memory limits fill the
// smallest share of its budget, then the one with fewer sandboxes; a member
// whose budget the new sandbox would exceed is not eligible. A sandbox that
// must share a member's storage (a fork, a template built from layers,
// a volume) goes where that storage is.
//
// A member whose relay does not answer (or that Incus reports offline) gets
// no new sandboxes at once. Once it has been unreachable for LostAfter, its
// sandboxes are lost: the backend forgets them and tells the control plane
// (OnLost), which reports them killed. Their instances, when the member
// comes back, are deleted: a sandbox is never both reported gone and alive.
// A sandboxd that starts while a member is down treats that member's
// sandboxes the same way.

// ClusterOptions configure cluster mode. Zero fields take the defaults given.
type ClusterOptions struct {
	// Relay dials a member's relay (incus/relay.Dialer). Required.
	Relay RelayDialer
	// RelayPort is the relays' port, on the host of each member's API
	// address. Default 8444.
	RelayPort int
	// SandboxSubnet holds every sandbox's address. Default 10.135.0.0/16.
	SandboxSubnet netip.Prefix
	// MemberEnvd is envd's path on every member. Default
	// /usr/local/lib/sandboxd/envd.
	MemberEnvd string
	// MemberResolvConf is the resolv.conf the relay writes on every member
	// for sandboxes with internet access. Default
	// /var/lib/sandboxd-relay/resolv.conf.
	MemberResolvConf string
	// Members, when set, are the only members sandboxes are placed on (a
	// cluster shared with other workloads; or one member, to compare).
	Members []string
	// SimpleQuotas says that the members' pools keep btrfs simple quotas
	// (squota, as scripts/incus-setup.sh and incus-cluster.sh turn on): a
	// root's size then limits what the sandbox writes. Otherwise the sizes
	// allow for full quota groups, which also count the blocks a root
	// shares with its image (the safe side: a sandbox may then write up to
	// the image's size more than its disk size). sandboxd cannot read the
	// mode of a pool it is not beside.
	SimpleQuotas bool
	// Replicas copies the top layer of every template sandboxd built to
	// every member (replicas.go), so that its sandboxes spread. Each copy
	// is a whole root on a member's pool, made only where it leaves the
	// pool's reserve free. On the test bed a copy takes 30-100 s, one at
	// a time; a backend closed during one cancels it or, where Incus
	// cannot, waits for its end (abandonOperation).
	// Replicas that exist are used either way.
	Replicas bool
	// PoolReserve is the share of each member's storage pool kept free: no
	// sandbox is placed on a member whose pool has less free space, no
	// replica is made that would leave less, and a member short of it
	// gives up its replicas. At least 1 GiB is kept (a quarter of a pool
	// under 4 GiB). A pool that fills up takes its incusd down when it
	// shares incusd's disk ("database or disk is full": two members of
	// the test bed so, and with them the cluster's quorum). Default 0.1.
	PoolReserve float64
	// MemoryShare is the share of a member's memory that its sandboxes'
	// memory limits may add up to. Default 1.
	MemoryShare float64
	// ProbeInterval is how often each member's relay is probed. Default
	// 500 ms; two failed probes in a row make a member unreachable.
	ProbeInterval time.Duration
	// LostAfter is how long a member stays unreachable before its sandboxes
	// are lost. Default 10 s.
	LostAfter time.Duration
	// RefreshInterval is how often the member list is read from Incus.
	// Default 5 s.
	RefreshInterval time.Duration
}

// RelayDialer connects to target (a sandbox's address and port) through
// the relay at relayAddr.
type RelayDialer interface {
	Dial(ctx context.Context, relayAddr string, target netip.AddrPort) (net.Conn, error)
}

// singleMember is the location Incus gives instances on a server that is
// not clustered.
const singleMember = "none"

// ErrNoCapacity is a create for which no cluster member has room: every
// online member's budget is taken, or none is online.
var ErrNoCapacity = fmt.Errorf("%w: no cluster member has room", runtime.ErrUnavailable)

// clusterMember is sandboxd's view of one member.
type clusterMember struct {
	name   string
	api    string // its Incus API URL
	relay  string // host:port of its relay
	memory uint64 // bytes
	online bool   // per Incus
	// failures counts failed probes in a row; reachable means fewer than two.
	failures int
	// down is closed when the member becomes unreachable, which ends the
	// dials to it in flight (dialCluster); a new one is made when it
	// answers again. nil: closed, or not made yet.
	down chan struct{}
	// downSince is when the member stopped being usable (zero: it is).
	downSince time.Time
	// lost: its sandboxes were given up; they are deleted when it is back.
	lost bool
	// retired: Incus says Evacuated or Blocked, its operator took it out
	// of service: no new sandbox goes there, even while Incus calls every
	// other member offline.
	retired bool
	// poolFree and poolTotal are the space of its storage pool, as read
	// at the last refresh (less the replicas made since); 0 total:
	// unknown, not guarded.
	poolFree, poolTotal uint64
}

// reachable: its relay answers (fewer than two failed probes in a row).
// Only this decides that a member is down and its sandboxes lost: Incus
// marks every member offline while its database has no leader (the
// leader sends the heartbeats), so "offline" there can be a living member.
func (m *clusterMember) reachable() bool { return m.failures < 2 }

// probed counts a probe's result; the caller holds the cluster's lock.
func (m *clusterMember) probed(ok bool) {
	if ok {
		m.failures = 0
		if m.down == nil {
			m.down = make(chan struct{})
		}
		return
	}
	m.failures++
	if !m.reachable() && m.down != nil {
		close(m.down)
		m.down = nil
	}
}

// usable: reachable and online in Incus, where creates go first.
func (m *clusterMember) usable() bool { return m.online && m.reachable() }

// poolReserve is how much of m's pool to keep free (PoolReserve); 0 when
// its size is unknown.
func (c *cluster) poolReserve(m *clusterMember) uint64 {
	if m.poolTotal == 0 {
		return 0
	}
	return max(uint64(float64(m.poolTotal)*c.opts.PoolReserve), min(1<<30, m.poolTotal/4))
}

// poolLow: m's pool has less free space than its reserve.
func (c *cluster) poolLow(m *clusterMember) bool {
	return m.poolTotal > 0 && m.poolFree < c.poolReserve(m)
}

// poolRoom: m's pool is known to keep its reserve free after size bytes
// more.
func (c *cluster) poolRoom(m *clusterMember, size uint64) bool {
	return m.poolTotal > 0 && m.poolFree >= size+c.poolReserve(m)
}

// cluster is the backend's cluster state; nil on a single host.
type cluster struct {
	opts ClusterOptions

	mu      sync.Mutex
	members map[string]*clusterMember
	// lost are the instances of lost sandboxes (name → sandbox id), to be
	// deleted once their member answers again.
	lost map[string]lostInstance
	// layers is the member of each layer instance (layerMember).
	layers map[string]string
	// replicas are the layers' replicas (replicas.go): layer instance →
	// member → replica instance.
	replicas map[string]map[string]string
	// layerSizes are what the layers' replicas were measured to take
	// (replicaSize), noRoom the layer and member pairs logged as lacking room for a
	// replica.
	layerSizes map[string]uint64
	noRoom     map[[2]string]bool
	// single is the server's URL when it is not clustered (then its one
	// member is singleMember).
	single string

	onLost []func(id string)
}

type lostInstance struct{ id, member string }

func newCluster(o ClusterOptions) (*cluster, error) {
	if o.Relay == nil {
		return nil, fmt.Errorf("incus cluster: %w: no relay dialer", runtime.ErrInvalidSpec)
	}
	if o.RelayPort <= 0 {
		o.RelayPort = 8444
	}
	if !o.SandboxSubnet.IsValid() {
		o.SandboxSubnet = netip.MustParsePrefix("10.135.0.0/16")
	}
	if o.MemberEnvd == "" {
		o.MemberEnvd = "/usr/local/lib/sandboxd/envd"
	}
	if o.MemberResolvConf == "" {
		o.MemberResolvConf = "/var/lib/sandboxd-relay/resolv.conf"
	}
	if o.MemoryShare <= 0 {
		o.MemoryShare = 1
	}
	if o.PoolReserve <= 0 {
		o.PoolReserve = 0.1
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 500 * time.Millisecond
	}
	if o.LostAfter <= 0 {
		o.LostAfter = 10 * time.Second
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = 5 * time.Second
	}
	return &cluster{opts: o, members: map[string]*clusterMember{}, lost: map[string]lostInstance{}, layers: map[string]string{},
		replicas: map[string]map[string]string{}, layerSizes: map[string]uint64{}, noRoom: map[[2]string]bool{}}, nil
}

// OnLost registers fn to be called with the id of every sandbox the backend
// gives up because its cluster member is gone. Only in cluster mode.
func (b *Backend) OnLost(fn func(id string)) {
	if b.cluster == nil {
		return
	}
	b.cluster.mu.Lock()
	b.cluster.onLost = append(b.cluster.onLost, fn)
	b.cluster.mu.Unlock()
}

// offlineAsk bounds a question to a member Incus calls offline: one really
// down makes Incus wait for its heartbeat timeout, and the refresh must not.
const offlineAsk = 2 * time.Second

// memberRead is what a refresh learned of one member: its memory (0: not
// read) and its storage pool's space (nil: not read).
type memberRead struct {
	mem  uint64
	pool *PoolResources
}

// refreshMembers reads the member list, each new member's memory and each
// member's storage pool, the members at once: a refresh costs the slowest
// member's answer, not their sum.
func (b *Backend) refreshMembers(ctx context.Context) error {
	c := b.cluster
	var ms []ClusterMember
	if c.single != "" {
		// A server that is not clustered: one member, whose instances'
		// location is "none", and no ?target=.
		ms = []ClusterMember{{Name: singleMember, URL: c.single, Status: "Online"}}
	} else {
		var err error
		if ms, err = b.c.ClusterMembers(ctx); err != nil {
			return fmt.Errorf("incus cluster members: %w", err)
		}
	}
	if c.single == "" {
		urls := make([]string, 0, len(ms))
		for _, m := range ms {
			urls = append(urls, m.URL)
		}
		b.c.SetEndpoints(urls)
	}
	hosts := make(map[string]string, len(ms))
	reads := make([]memberRead, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		u, err := url.Parse(m.URL)
		if err != nil || u.Hostname() == "" {
			b.log.Warn("incus cluster: member without a usable address", "member", m.Name, "url", m.URL)
			continue
		}
		hosts[m.Name] = u.Hostname()
		c.mu.Lock()
		cm := c.members[m.Name]
		knownMem := cm != nil && cm.memory > 0
		// Incus calls a member offline when its heartbeats lag (a busy
		// host, the database's election), and place then tries the
		// members whose relay answers: one whose memory is not known
		// would take nothing, and one whose pool is not known would take
		// sandboxes past its reserve. So such a member is asked too, if
		// its relay answers (a new one has not been probed yet).
		ask := m.Status == "Online" || m.Status == "Offline" && (cm == nil || cm.reachable())
		c.mu.Unlock()
		if !ask {
			continue
		}
		wg.Go(func() { reads[i] = b.readMember(ctx, m, !knownMem) })
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, m := range ms {
		seen[m.Name] = true
		host, ok := hosts[m.Name]
		if !ok {
			continue
		}
		c.mu.Lock()
		cm := c.members[m.Name]
		if cm == nil {
			cm = &clusterMember{name: m.Name, down: make(chan struct{})}
			c.members[m.Name] = cm
		}
		cm.api = m.URL
		cm.relay = net.JoinHostPort(host, strconv.Itoa(c.opts.RelayPort))
		if r := reads[i]; r.mem > 0 {
			cm.memory = r.mem
		}
		if pool := reads[i].pool; pool != nil && pool.Space.Total > 0 {
			wasLow := c.poolLow(cm)
			cm.poolTotal, cm.poolFree = pool.Space.Total, pool.Space.Total-min(pool.Space.Used, pool.Space.Total)
			if low := c.poolLow(cm); low != wasLow {
				level := slog.LevelInfo
				if low {
					level = slog.LevelWarn // no creates there, and its replicas go
				}
				b.log.Log(ctx, level, "incus cluster: member's storage pool", "member", m.Name, "short_of_space", low,
					"free_bytes", cm.poolFree, "total_bytes", cm.poolTotal, "reserve_bytes", c.poolReserve(cm))
			}
		}
		cm.online = m.Status == "Online"
		cm.retired = m.Status == "Evacuated" || m.Status == "Blocked"
		c.mu.Unlock()
	}
	c.mu.Lock()
	for name := range c.members {
		if !seen[name] {
			delete(c.members, name)
		}
	}
	c.mu.Unlock()
	return nil
}

// readMember asks m for its memory (when mem) and its storage pool's
// space. An online member's failure is a warning; an offline one's is
// expected (it may be down) and logged at debug.
func (b *Backend) readMember(ctx context.Context, m ClusterMember, mem bool) memberRead {
	level := slog.LevelWarn
	if m.Status != "Online" {
		level = slog.LevelDebug
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, offlineAsk)
		defer cancel()
	}
	var r memberRead
	if mem {
		if res, err := b.c.Resources(ctx, targetOf(m.Name)); err == nil {
			r.mem = res.Memory.Total
		} else {
			b.log.Log(ctx, level, "incus cluster: member resources", "member", m.Name, "status", m.Status, "err", err)
		}
	}
	pool, err := b.c.StoragePoolResources(ctx, b.opts.Pool, targetOf(m.Name))
	if err != nil {
		b.log.Log(ctx, level, "incus cluster: member's storage pool", "member", m.Name, "status", m.Status, "pool", b.opts.Pool, "err", err)
	}
	r.pool = pool
	return r
}

// probe dials every member's relay once (TCP only: a relay that accepts
// is up; TLS is checked on real use) and updates what is usable.
func (b *Backend) probe(ctx context.Context) {
	c := b.cluster
	c.mu.Lock()
	targets := map[string]string{}
	for name, m := range c.members {
		targets[name] = m.relay
	}
	c.mu.Unlock()
	timeout := min(c.opts.ProbeInterval*3/4, time.Second)
	var wg sync.WaitGroup
	results := make(map[string]bool, len(targets))
	var rmu sync.Mutex
	for name, addr := range targets {
		wg.Go(func() {
			d := net.Dialer{Timeout: timeout}
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				conn.Close()
			}
			rmu.Lock()
			results[name] = err == nil
			rmu.Unlock()
		})
	}
	wg.Wait()
	now := time.Now()
	c.mu.Lock()
	for name, ok := range results {
		if m := c.members[name]; m != nil {
			m.probed(ok)
		}
	}
	c.mu.Unlock()
	b.settleMembers(ctx, now)
}

// settleMembers acts on the members' state: a member unusable for
// LostAfter loses its sandboxes; a lost member that is usable again gets
// its lost instances deleted.
func (b *Backend) settleMembers(ctx context.Context, now time.Time) {
	c := b.cluster
	var lose, back, avoid []string
	c.mu.Lock()
	for name, m := range c.members {
		switch {
		case m.reachable():
			if !m.downSince.IsZero() {
				b.log.Info("incus cluster: member usable again", "member", name, "down_for", now.Sub(m.downSince))
			}
			m.downSince = time.Time{}
			if m.lost {
				m.lost = false
				back = append(back, name)
			}
		case m.downSince.IsZero():
			m.downSince = now
			b.log.Warn("incus cluster: member unreachable; no new sandboxes there", "member", name,
				"online", m.online, "failed_probes", m.failures)
			avoid = append(avoid, m.api) // the client's next request goes elsewhere
		case !m.lost && now.Sub(m.downSince) >= c.opts.LostAfter:
			m.lost = true
			lose = append(lose, name)
		}
	}
	c.mu.Unlock()
	for _, u := range avoid {
		b.c.Avoid(u)
	}
	for _, name := range lose {
		b.loseMember(name)
	}
	for _, name := range back {
		b.deleteLost(name)
	}
}

// loseMember gives up the sandboxes on member name.
func (b *Backend) loseMember(name string) {
	c := b.cluster
	var ids []string
	b.mu.Lock()
	for id, s := range b.sbx {
		if s.member != name || !isReady(s) || !s.created {
			continue
		}
		delete(b.sbx, id)
		c.mu.Lock()
		c.lost[s.name] = lostInstance{id: id, member: name}
		c.mu.Unlock()
		ids = append(ids, id)
	}
	b.mu.Unlock()
	b.log.Error("incus cluster: member lost; its sandboxes are gone", "member", name, "sandboxes", len(ids))
	c.mu.Lock()
	hooks := slices.Clone(c.onLost)
	c.mu.Unlock()
	for _, id := range ids {
		b.log.Warn("sandbox lost with its cluster member", "audit", true, "sandbox_id", id, "member", name)
		for _, fn := range hooks {
			fn(id)
		}
	}
}

// deleteLost deletes the instances of the sandboxes lost on member name,
// which answers again.
func (b *Backend) deleteLost(name string) {
	c := b.cluster
	c.mu.Lock()
	var todo map[string]string // instance → id
	for inst, l := range c.lost {
		if l.member == name {
			if todo == nil {
				todo = map[string]string{}
			}
			todo[inst] = l.id
			delete(c.lost, inst)
		}
	}
	c.mu.Unlock()
	for inst, id := range todo {
		if id == "" {
			// Seen as a stub: its config tells now whose it is.
			ctx, cancel := context.WithTimeout(b.closing, 30*time.Second)
			in, err := b.c.Instance(ctx, inst)
			cancel()
			if err != nil || !b.ours(in) {
				continue
			}
			id = in.Config[keyID]
		}
		b.mu.Lock()
		if b.sbx[id] == nil {
			b.startDelete(id, inst, "", "")
		}
		b.mu.Unlock()
	}
	if len(todo) > 0 {
		b.log.Info("incus cluster: deleting the instances of lost sandboxes", "member", name, "instances", len(todo))
	}
}

// isLostInstance reports whether instance in belongs to a lost sandbox or
// sits on a lost member; such an instance is remembered for deletion and
// never adopted.
//
// Incus lists an instance on an offline member as a stub: status Error,
// no config (so neither id nor namespace). A stub named like a sandbox's
// instance is remembered too, without its id: whether it is ours is
// checked once its member answers (deleteLost).
func (b *Backend) isLostInstance(in *Instance) bool {
	c := b.cluster
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.lost[in.Name]; ok {
		return true
	}
	if m := c.members[in.Location]; m != nil && m.lost && sandboxInstanceName(in.Name) {
		c.lost[in.Name] = lostInstance{id: in.Config[keyID], member: in.Location}
		return true
	}
	return false
}

// sandboxInstanceName reports whether name is one InstanceName makes.
func sandboxInstanceName(name string) bool {
	return strings.HasPrefix(name, "sbx-") || strings.HasPrefix(name, "sbh-")
}

// watchCluster keeps the member list, the probes and the layers' replicas
// going until the backend closes, each on its own: a member list read
// while a member dies can block for Incus' heartbeat timeout (≈ 20 s), and
// the probes must not wait for it, nor for a replica's copy.
func (b *Backend) watchCluster() {
	c := b.cluster
	var wg sync.WaitGroup
	wg.Go(func() {
		every(b.closing, c.opts.RefreshInterval, func(ctx context.Context) {
			if err := b.refreshMembers(ctx); err != nil {
				b.log.Warn("incus cluster: refresh members", "err", err)
			}
		})
	})
	wg.Go(b.replicateLoop) // without Replicas too: it keeps the existing ones in bounds
	every(b.closing, c.opts.ProbeInterval, b.probe)
	wg.Wait()
}

// every runs fn each interval, with a context bounded by it, until ctx
// ends.
func every(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fctx, cancel := context.WithTimeout(ctx, interval)
			fn(fctx)
			cancel()
		}
	}
}

// startCluster reads the members and probes them once, so that a member
// down at start is known before the first List: its sandboxes are lost
// (they may have been down for any time; see the type's comment).
func (b *Backend) startCluster(ctx context.Context, srv *Server) error {
	if !srv.Environment.ServerClustered {
		b.cluster.single = b.c.base
	}
	if err := b.refreshMembers(ctx); err != nil {
		return err
	}
	b.probe(ctx)
	b.probe(ctx) // two failures make a member unreachable
	if _, err := b.learnReplicas(ctx); err != nil {
		b.log.Warn("incus cluster: layer replicas", "err", err)
	}
	c := b.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, m := range c.members {
		if !m.reachable() {
			m.lost = true
			b.log.Warn("incus cluster: member down at start; its sandboxes are lost", "member", name)
		}
	}
	return nil
}

// place picks the member for a new sandbox of spec, among the members that
// hold its storage when want names them (non-empty), first those with the
// fewest of its siblings: the sandboxes spread names (a pool's other
// members) and those of its group (its tenant's). The caller holds b.mu
// (the sandboxes' memory is counted from b.sbx, creates in flight
// included).
func (b *Backend) place(spec runtime.Spec, want, spread []string) (string, error) {
	c := b.cluster
	l := load{used: map[string]uint64{}, count: map[string]int{}, siblings: map[string]int{}}
	for _, s := range b.sbx {
		l.used[s.member] += uint64(s.spec.MemoryMB) << 20
		l.count[s.member]++
		if spec.Group != "" && s.spec.Group == spec.Group {
			l.siblings[s.member]++
		}
	}
	for _, id := range spread {
		if s := b.sbx[id]; s != nil {
			l.siblings[s.member]++
		}
	}
	need := uint64(spec.MemoryMB) << 20
	c.mu.Lock()
	defer c.mu.Unlock()
	best := c.pick(want, l, need, (*clusterMember).usable)
	if best == "" {
		// None that Incus calls online: while the cluster's database
		// elects a new leader it calls them all offline. Members whose
		// relay answers are tried then.
		best = c.pick(want, l, need, func(m *clusterMember) bool { return m.reachable() && !m.retired })
	}
	if best == "" {
		if len(want) > 0 {
			return "", fmt.Errorf("%w: the members that hold the sandbox's storage (%s) are down or full", ErrNoCapacity, strings.Join(want, ", "))
		}
		return "", ErrNoCapacity
	}
	return best, nil
}

// load is what place weighs per member: the memory limits and the number
// of its sandboxes, and how many of the new one's siblings it has.
type load struct {
	used     map[string]uint64
	count    map[string]int
	siblings map[string]int
}

// pick is place's choice among the members ok accepts; "" if none has
// room. The caller holds c.mu.
func (c *cluster) pick(want []string, l load, need uint64, ok func(*clusterMember) bool) string {
	used, count := l.used, l.count
	best, bestShare := "", 0.0
	for name, m := range c.members {
		if len(want) > 0 && !slices.Contains(want, name) || len(c.opts.Members) > 0 && !slices.Contains(c.opts.Members, name) {
			continue
		}
		if !ok(m) || m.lost || m.memory == 0 || c.poolLow(m) {
			continue
		}
		budget := float64(m.memory) * c.opts.MemoryShare
		if float64(used[name]+need) > budget {
			continue
		}
		share := float64(used[name]) / budget
		sib, bestSib := l.siblings[name], l.siblings[best]
		if best == "" || sib < bestSib || sib == bestSib && (share < bestShare ||
			share == bestShare && (count[name] < count[best] || count[name] == count[best] && name < best)) {
			best, bestShare = name, share
		}
	}
	return best
}

// allocate returns a free address of the sandbox subnet; the caller holds
// b.mu.
func (b *Backend) allocateSandboxIP() (netip.Addr, error) {
	p := b.cluster.opts.SandboxSubnet.Masked()
	// The first address is the subnet's own; leave it, as a gateway-less
	// subnet has no use for it either.
	for a := p.Addr().Next(); p.Contains(a); a = a.Next() {
		if _, used := b.ips[a]; !used && a.Next().IsValid() && p.Contains(a.Next()) {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w: sandbox subnet %s is full", runtime.ErrUnavailable, p)
}

// relayOf returns the relay address of member name.
func (c *cluster) relayOf(name string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[name]
	if m == nil {
		return "", fmt.Errorf("%w: cluster member %q unknown", runtime.ErrUnavailable, name)
	}
	return m.relay, nil
}

// clusterDevices are the devices of sandbox s in cluster mode: its routed
// NIC and, with internet access, the member's resolv.conf.
func (b *Backend) clusterDevices(s *sandbox) map[string]map[string]string {
	c := b.cluster
	host := clusterLinkName(s.name, s.spec.AllowInternet)
	d := map[string]map[string]string{
		"eth0": {"type": "nic", "nictype": "routed", "name": "eth0", "host_name": host, "ipv4.address": s.ip.String()},
	}
	if s.spec.AllowInternet {
		d["resolv"] = map[string]string{"type": "disk", "source": c.opts.MemberResolvConf, "path": "/etc/resolv.conf", "readonly": "true"}
	}
	return d
}

// errMemberDown is a dial to a sandbox on a member that is not usable.
var errMemberDown = errors.New("cluster member down")

// dialCluster connects to port on sandbox s through its member's relay.
func (b *Backend) dialCluster(ctx context.Context, s *sandbox, port int) (net.Conn, error) {
	c := b.cluster
	c.mu.Lock()
	m := c.members[s.member]
	down := m == nil || !m.reachable()
	addr := ""
	var downCh chan struct{}
	if m != nil {
		addr, downCh = m.relay, m.down
	}
	c.mu.Unlock()
	if down {
		return nil, fmt.Errorf("sandbox %s on member %s: %w: %w", s.id, s.member, runtime.ErrUnavailable, errMemberDown)
	}
	// A dial to a member that dies meanwhile ends when the probes find it
	// down (≈ 1 s), not at the dial's timeout: a claim of a spare there
	// moves on to one elsewhere that much sooner.
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if downCh != nil {
		go func() {
			select {
			case <-downCh:
				cancel(errMemberDown)
			case <-dctx.Done():
			}
		}()
	}
	conn, err := c.opts.Relay.Dial(dctx, addr, netip.AddrPortFrom(s.ip, uint16(port)))
	if cause := context.Cause(dctx); err != nil && errors.Is(cause, errMemberDown) {
		err = cause
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s via relay %s: %w: %w", s.id, addr, runtime.ErrUnavailable, err)
	}
	return conn, nil
}

func isReady(s *sandbox) bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

// storageMembers are the members a new sandbox may be on because its root
// or a volume is stored there (local pools are per member): a fork's
// source's, a mounted volume's, and those that hold the top layer of a
// template built by sandboxd or a replica of it (replicas.go). nil when
// any member will do. Places that have no member in common are
// ErrInvalidSpec.
func (b *Backend) storageMembers(ctx context.Context, spec runtime.Spec, im *rootSource, forkOf string) ([]string, error) {
	var sets [][]string
	if forkOf != "" {
		b.mu.Lock()
		if s := b.sbx[forkOf]; s != nil {
			sets = append(sets, []string{s.member})
		}
		b.mu.Unlock()
	}
	if im.layer != "" {
		loc, err := b.layerMember(ctx, im.layer)
		if err != nil {
			return nil, err
		}
		sets = append(sets, append([]string{loc}, b.cluster.replicaMembers(im.layer)...))
	}
	for _, m := range spec.Mounts {
		v, err := b.c.StorageVolume(ctx, b.opts.Pool, b.volumeName(m.Volume))
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", m.Volume, err)
		}
		sets = append(sets, []string{v.Location})
	}
	if len(sets) == 0 {
		return nil, nil
	}
	common := slices.Sorted(slices.Values(sets[0]))
	for _, set := range sets[1:] {
		common = slices.DeleteFunc(common, func(m string) bool { return !slices.Contains(set, m) })
	}
	if len(common) == 0 {
		return nil, fmt.Errorf("%w: its source and volumes are on different cluster members (%v)", runtime.ErrInvalidSpec, sets)
	}
	return common, nil
}

// forgetLayerMember drops what layerMember keeps of layer instance name,
// which is being made or removed.
func (b *Backend) forgetLayerMember(name string) {
	if c := b.cluster; c != nil {
		c.mu.Lock()
		delete(c.layers, name)
		c.mu.Unlock()
	}
}

// layerMember is the member of layer instance name; a layer never moves,
// so the answer is kept until the layer is removed or made again (the
// same key may then land on another member).
func (b *Backend) layerMember(ctx context.Context, name string) (string, error) {
	c := b.cluster
	c.mu.Lock()
	loc, ok := c.layers[name]
	c.mu.Unlock()
	if ok {
		return loc, nil
	}
	in, err := b.c.Instance(ctx, name)
	if err != nil {
		return "", fmt.Errorf("layer %s: %w", name, err)
	}
	c.mu.Lock()
	c.layers[name] = in.Location
	c.mu.Unlock()
	return in.Location, nil
}

// clusterLinkName is the host end of sandbox instance name's routed NIC:
// egress.HostPrefix (sbx) with internet access, egress.NoNetPrefix (sbn)
// without; the members' firewall matches the prefixes.
func clusterLinkName(name string, internet bool) string {
	host, _ := egress.LinkNames(name)
	if internet {
		return host
	}
	return egress.NoNetPrefix + strings.TrimPrefix(host, egress.HostPrefix)
}

// lostSandbox reports whether sandbox id was lost with its member.
func (b *Backend) lostSandbox(id string) bool {
	c := b.cluster
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.lost[b.instanceName(id)]
	return ok
}

// memberUsable reports whether member name takes requests (always true off
// cluster mode).
// Reachable reports whether sandbox id can be reached now: false while
// the member it is on is down by the probes (its dials fail at once). Off
// a cluster, and for an id it does not hold, true: the caller finds out
// the usual way. The pools skip members it says false of, so a claim is
// served elsewhere without waiting for Incus, whose writes may be stuck
// for half a minute while its database elects a new leader.
func (b *Backend) Reachable(id string) bool {
	c := b.cluster
	if c == nil {
		return true
	}
	b.mu.Lock()
	s := b.sbx[id]
	b.mu.Unlock()
	if s == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[s.member]
	return m != nil && m.reachable()
}

func (b *Backend) memberUsable(name string) bool {
	c := b.cluster
	if c == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[name]
	return m != nil && m.usable()
}

// targetOf is the ?target= of an instance on member ("" off a cluster).
func targetOf(member string) string {
	if member == singleMember {
		return ""
	}
	return member
}
