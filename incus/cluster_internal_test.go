package incus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

// clusterBackend is a Backend in cluster mode with members given as
// name → GiB of memory, none of them probed; Incus is a fake that knows no
// instance (so that deletions end at once).
func clusterBackend(t *testing.T, members map[string]int) *Backend {
	b, _ := clusterBackendAsked(t, members)
	return b
}

// clusterBackendAsked is clusterBackend, with the set of instance names
// Incus was asked about.
func clusterBackendAsked(t *testing.T, members map[string]int) (*Backend, func() []string) {
	t.Helper()
	var mu sync.Mutex
	asked := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := strings.CutPrefix(r.URL.Path, "/1.0/instances/"); ok {
			mu.Lock()
			asked[name] = true
			mu.Unlock()
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"type":"error","error":"Instance not found","error_code":404}`)
	}))
	t.Cleanup(srv.Close)
	cl, err := newCluster(ClusterOptions{Relay: nopRelay{}, LostAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for name, gib := range members {
		cl.members[name] = &clusterMember{name: name, relay: name + ":8444", memory: uint64(gib) << 30, online: true}
	}
	b := &Backend{
		c: NewClientWith(srv.Client(), srv.URL), log: slog.New(slog.DiscardHandler), cluster: cl,
		sbx: map[string]*sandbox{}, ips: map[netip.Addr]string{}, deleting: map[string]chan struct{}{},
	}
	b.closing, b.close = context.WithCancel(context.Background())
	t.Cleanup(b.close)
	return b, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Sorted(maps.Keys(asked))
	}
}

// addSandbox puts a created sandbox of memMiB on member into b.
func addSandbox(b *Backend, id, member string, memMiB int) {
	ready := make(chan struct{})
	close(ready)
	b.sbx[id] = &sandbox{id: id, name: "sbx-" + id, member: member, spec: runtime.Spec{ID: id, MemoryMB: memMiB}, ready: ready, created: true}
}

func TestPlace(t *testing.T) {
	for _, tc := range []struct {
		name      string
		members   map[string]int // GiB
		sandboxes map[string][]int
		down      []string
		lost      []string
		want      []string       // the members that hold the storage
		siblings  map[string]int // the new sandbox's pool siblings per member
		group     map[string]int // sandboxes of its tenant per member
		only      []string
		offline   []string       // as Incus says; their relays answer
		retired   []string       // evacuated in Incus (so offline); their relays answer
		poolFree  map[string]int // GiB free of a 100 GiB pool (reserve: 10)
		memMiB    int
		placed    string
		err       error
	}{
		{name: "least filled share", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m1": {512, 512}, "m2": {512}}, memMiB: 512, placed: "m2"},
		{name: "share, not count", members: map[string]int{"m1": 8, "m2": 2}, sandboxes: map[string][]int{"m1": {512, 512}, "m2": {512}}, memMiB: 512, placed: "m1"},
		{name: "tie: fewer sandboxes", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m1": {0, 0}, "m2": {0}}, memMiB: 512, placed: "m2"},
		{name: "tie: name", members: map[string]int{"m2": 4, "m1": 4}, memMiB: 512, placed: "m1"},
		{name: "full member skipped", members: map[string]int{"m1": 1, "m2": 4}, sandboxes: map[string][]int{"m1": {512}, "m2": {512, 512, 1024}}, memMiB: 768, placed: "m2"},
		{name: "all full", members: map[string]int{"m1": 1}, sandboxes: map[string][]int{"m1": {1024}}, memMiB: 1, err: ErrNoCapacity},
		{name: "down member skipped", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m2": {512}}, down: []string{"m1"}, memMiB: 512, placed: "m2"},
		{name: "lost member skipped", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m2": {512}}, lost: []string{"m1"}, memMiB: 512, placed: "m2"},
		{name: "none usable", members: map[string]int{"m1": 4}, down: []string{"m1"}, memMiB: 512, err: ErrNoCapacity},
		{name: "storage member, busier", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m1": {512}}, want: []string{"m1"}, memMiB: 512, placed: "m1"},
		{name: "offline in Incus avoided", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m2": {512}}, offline: []string{"m1"}, memMiB: 512, placed: "m2"},
		{name: "all offline in Incus, relays answer", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m1": {512}}, offline: []string{"m1", "m2"}, memMiB: 512, placed: "m2"},
		{name: "all offline in Incus, the emptier one evacuated", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m1": {512}}, offline: []string{"m1"}, retired: []string{"m2"}, memMiB: 512, placed: "m1"},
		{name: "the only member evacuated", members: map[string]int{"m1": 4}, retired: []string{"m1"}, memMiB: 512, err: ErrNoCapacity},
		{name: "only the members given", members: map[string]int{"m1": 4, "m2": 4, "m3": 4}, sandboxes: map[string][]int{"m3": {512}}, only: []string{"m3"}, memMiB: 512, placed: "m3"},
		{name: "storage member not given", members: map[string]int{"m1": 4, "m2": 4}, only: []string{"m2"}, want: []string{"m1"}, memMiB: 512, err: ErrNoCapacity},
		{name: "replica holders: the emptier", members: map[string]int{"m1": 4, "m2": 4, "m3": 4}, sandboxes: map[string][]int{"m1": {512, 512}, "m3": {512}}, want: []string{"m1", "m3"}, memMiB: 512, placed: "m3"},
		{name: "replica holders: one down", members: map[string]int{"m1": 4, "m2": 4, "m3": 4}, sandboxes: map[string][]int{"m1": {512, 512}}, down: []string{"m3"}, want: []string{"m1", "m3"}, memMiB: 512, placed: "m1"},
		{name: "pool siblings: the member with fewest, though fuller", members: map[string]int{"m1": 4, "m2": 4, "m3": 4}, sandboxes: map[string][]int{"m1": {512, 512}, "m2": {512}}, siblings: map[string]int{"m2": 1, "m3": 1}, memMiB: 512, placed: "m1"},
		{name: "pool siblings even: by share", members: map[string]int{"m1": 4, "m2": 4, "m3": 4}, sandboxes: map[string][]int{"m1": {512, 512}, "m3": {512}}, siblings: map[string]int{"m1": 1, "m2": 1, "m3": 1}, memMiB: 512, placed: "m2"},
		{name: "a tenant's sandboxes spread, though fuller", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m1": {512, 512}}, group: map[string]int{"m2": 2}, memMiB: 512, placed: "m1"},
		{name: "storage member down", members: map[string]int{"m1": 4, "m2": 4}, down: []string{"m1"}, want: []string{"m1"}, memMiB: 512, err: ErrNoCapacity},
		{name: "pool short of its reserve skipped", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m2": {512}}, poolFree: map[string]int{"m1": 9, "m2": 50}, memMiB: 512, placed: "m2"},
		{name: "pool at its reserve used", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m2": {512}}, poolFree: map[string]int{"m1": 10, "m2": 50}, memMiB: 512, placed: "m1"},
		{name: "pool space unknown: not guarded", members: map[string]int{"m1": 4, "m2": 4}, sandboxes: map[string][]int{"m2": {512}}, poolFree: map[string]int{"m2": 50}, memMiB: 512, placed: "m1"},
		{name: "storage member's pool short", members: map[string]int{"m1": 4, "m2": 4}, want: []string{"m1"}, poolFree: map[string]int{"m1": 1, "m2": 50}, memMiB: 512, err: ErrNoCapacity},
		{name: "every pool short", members: map[string]int{"m1": 4, "m2": 4}, poolFree: map[string]int{"m1": 1, "m2": 0}, memMiB: 512, err: ErrNoCapacity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := clusterBackend(t, tc.members)
			b.cluster.opts.Members = tc.only
			for m, mems := range tc.sandboxes {
				for i, mem := range mems {
					addSandbox(b, m+"-"+string(rune('a'+i)), m, mem)
				}
			}
			for _, m := range tc.down {
				b.cluster.members[m].failures = 2
			}
			for _, m := range tc.lost {
				b.cluster.members[m].lost = true
			}
			for _, m := range tc.offline {
				b.cluster.members[m].online = false
			}
			for _, m := range tc.retired {
				b.cluster.members[m].online, b.cluster.members[m].retired = false, true
			}
			for m, gib := range tc.poolFree {
				b.cluster.members[m].poolTotal, b.cluster.members[m].poolFree = 100<<30, uint64(gib)<<30
			}
			var spread []string
			for m, n := range tc.siblings {
				for i := range n {
					id := fmt.Sprintf("sib-%s-%d", m, i)
					addSandbox(b, id, m, 0)
					spread = append(spread, id)
				}
			}
			for m, n := range tc.group {
				for i := range n {
					id := fmt.Sprintf("ten-%s-%d", m, i)
					addSandbox(b, id, m, 0)
					b.sbx[id].spec.Group = "acme"
				}
			}
			got, err := b.place(runtime.Spec{MemoryMB: tc.memMiB, Group: "acme"}, tc.want, spread)
			if !errors.Is(err, tc.err) || got != tc.placed {
				t.Fatalf("place = %q, %v; want %q, %v", got, err, tc.placed, tc.err)
			}
			if tc.err != nil && !errors.Is(err, runtime.ErrUnavailable) {
				t.Errorf("%v is not ErrUnavailable", err)
			}
		})
	}
}

// TestMemberLostAndBack: a member unusable for LostAfter loses its created
// sandboxes (reported once each, forgotten, Destroy a no-op, its instances
// never adopted); others stay; back again, their instances are deleted.
func TestMemberLostAndBack(t *testing.T) {
	b, asked := clusterBackendAsked(t, map[string]int{"m1": 4, "m2": 4})
	addSandbox(b, "a", "m1", 512)
	addSandbox(b, "b", "m1", 512)
	addSandbox(b, "c", "m2", 512)
	creating := &sandbox{id: "d", name: "sbx-d", member: "m1", ready: make(chan struct{})}
	b.sbx["d"] = creating // a create in flight fails on its own
	var mu sync.Mutex
	var lost []string
	b.OnLost(func(id string) { mu.Lock(); lost = append(lost, id); mu.Unlock() })

	// Incus calls a member offline (its database lost its leader) while
	// its relay answers: nothing is lost, however long.
	b.cluster.members["m2"].online = false
	b.settleMembers(t.Context(), time.Now())
	b.settleMembers(t.Context(), time.Now().Add(time.Hour))
	if b.sbx["c"] == nil || b.cluster.members["m2"].lost {
		t.Fatal("a member offline in Incus but reachable lost its sandboxes")
	}
	b.cluster.members["m2"].online = true
	if !b.Reachable("c") {
		t.Fatal("a sandbox on a member offline in Incus but reachable is reported unreachable")
	}

	t0 := time.Now()
	b.cluster.members["m1"].failures = 2
	b.settleMembers(t.Context(), t0)
	if len(lost) != 0 || b.sbx["a"] == nil {
		t.Fatalf("lost at once: %v", lost)
	}
	// Down by the probes: the pools skip its members from now.
	if b.Reachable("a") || !b.Reachable("c") || !b.Reachable("unknown") {
		t.Fatalf("Reachable: a %v c %v unknown %v, want false true true", b.Reachable("a"), b.Reachable("c"), b.Reachable("unknown"))
	}
	if _, err := b.place(runtime.Spec{MemoryMB: 1}, nil, nil); err != nil {
		t.Fatal(err)
	}
	b.settleMembers(t.Context(), t0.Add(999*time.Millisecond))
	if len(lost) != 0 {
		t.Fatalf("lost before LostAfter: %v", lost)
	}
	b.settleMembers(t.Context(), t0.Add(time.Second))
	slices.Sort(lost)
	if !slices.Equal(lost, []string{"a", "b"}) {
		t.Fatalf("lost = %v; want [a b]", lost)
	}
	if b.sbx["a"] != nil || b.sbx["b"] != nil || b.sbx["c"] == nil || b.sbx["d"] == nil {
		t.Fatalf("sandboxes left: %v", slices.Sorted(maps.Keys(b.sbx)))
	}
	b.settleMembers(t.Context(), t0.Add(2*time.Second))
	if len(lost) != 2 {
		t.Fatalf("reported twice: %v", lost)
	}
	if !b.lostSandbox("a") || b.lostSandbox("c") {
		t.Fatal("lostSandbox")
	}
	if err := b.Destroy(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if b.deleting["a"] != nil {
		t.Fatal("Destroy of a lost sandbox started a deletion while its member is down")
	}
	in := &Instance{Name: "sbx-a", Status: "Running", Location: "m1", Config: map[string]string{keyID: "a"}}
	if s := b.adopt(in); s != nil {
		t.Fatal("a lost sandbox's instance was adopted")
	}
	other := &Instance{Name: "sbx-e", Status: "Running", Location: "m1", Config: map[string]string{keyID: "e"}}
	if s := b.adopt(other); s != nil {
		t.Fatal("an instance on a lost member was adopted")
	}
	// What Incus lists for an instance on an offline member: no config.
	stub := &Instance{Name: "sbx-f", Status: "Error", Location: "m1"}
	if s := b.adopt(stub); s != nil || !b.lostSandbox("f") {
		t.Fatal("a stub on a lost member was not remembered as lost")
	}
	if s := b.adopt(&Instance{Name: "sbl-layer", Status: "Error", Location: "m1"}); s != nil || len(b.cluster.lost) != 4 {
		t.Fatalf("lost: %v; want a, b, e and the stub sbx-f only", b.cluster.lost)
	}

	b.cluster.members["m1"].failures = 0
	b.settleMembers(t.Context(), t0.Add(3*time.Second))
	if b.lostSandbox("a") || b.lostSandbox("e") {
		t.Fatal("still lost after the member came back")
	}
	if err := b.WaitDeletes(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Deleted: a, b and e (each asked about by removeInstance); the stub
	// f asked about to learn whose it is (404 here: not ours, left).
	if got, want := asked(), []string{"sbx-a", "sbx-b", "sbx-e", "sbx-f"}; !slices.Equal(got, want) {
		t.Fatalf("Incus asked about %v; want %v", got, want)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.deleting) != 0 {
		t.Fatalf("deletions left: %v", b.deleting)
	}
}

type nopRelay struct{}

func (nopRelay) Dial(context.Context, string, netip.AddrPort) (net.Conn, error) {
	return nil, errors.New("no relay in this test")
}

// A member Incus calls offline (its heartbeats lag on a busy host, or the
// database elects a leader) still has its memory and its pool read when it
// answers, so that a sandboxd started in such a gap can place on a member
// whose relay answers, within its pool's reserve; an evacuated member is
// not asked, one that does not answer stays unknown until a later
// refresh, and one whose relay is down is not asked at all. The members
// are asked at once.
func TestRefreshMembersOffline(t *testing.T) {
	var srvURL string
	var mu sync.Mutex
	asked := map[string]int{} // target → questions about its resources or pool
	// m1 and m4 answer only once both are asked: a refresh that asked one
	// member after the other would run out of its bound on the first.
	var both sync.WaitGroup
	both.Add(2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		target := r.URL.Query().Get("target")
		if r.URL.Path != "/1.0/cluster/members" {
			mu.Lock()
			asked[target]++
			first := asked[target] == 1 && r.URL.Path == "/1.0/resources"
			mu.Unlock()
			if first && (target == "m1" || target == "m4") {
				both.Done()
				both.Wait()
			}
		}
		switch {
		case r.URL.Path == "/1.0/cluster/members":
			var ms []string
			for name, status := range map[string]string{"m1": "Offline", "m2": "Offline", "m3": "Evacuated", "m4": "Offline"} {
				ms = append(ms, fmt.Sprintf(`{"server_name":%q,"url":%q,"status":%q}`, name, srvURL, status))
			}
			fmt.Fprintf(w, `{"type":"sync","status_code":200,"metadata":[%s]}`, strings.Join(ms, ","))
		case target == "m2": // down: Incus cannot reach it
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"type":"error","error":"Member unreachable","error_code":503}`)
		case r.URL.Path == "/1.0/resources":
			_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{"memory":{"total":4294967296}}}`)
		case r.URL.Path == "/1.0/storage-pools/sbx/resources":
			_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{"space":{"used":1073741824,"total":10737418240}}}`)
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"type":"error","error":"not found","error_code":404}`)
		}
	}))
	t.Cleanup(srv.Close)
	srvURL = srv.URL
	cl, err := newCluster(ClusterOptions{Relay: nopRelay{}, LostAfter: time.Second, PoolReserve: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	b := &Backend{
		c: NewClientWith(srv.Client(), srv.URL), log: slog.New(slog.DiscardHandler), cluster: cl, opts: Options{Pool: "sbx"},
		sbx: map[string]*sandbox{}, ips: map[netip.Addr]string{}, deleting: map[string]chan struct{}{},
	}
	if err := b.refreshMembers(t.Context()); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint64{"m1": 4 << 30, "m2": 0, "m3": 0, "m4": 4 << 30} {
		m := cl.members[name]
		if m == nil || m.online || m.memory != want || m.retired != (name == "m3") {
			t.Errorf("%s: %+v; want offline with %d bytes of memory", name, m, want)
			continue
		}
		// The pool is known where the memory is: a member placed on
		// while offline keeps its pool's reserve.
		wantPool := uint64(0)
		if want > 0 {
			wantPool = 10 << 30
		}
		if m.poolTotal != wantPool {
			t.Errorf("%s: a pool of %d bytes known; want %d", name, m.poolTotal, wantPool)
		}
	}
	b.mu.Lock()
	placed, err := b.place(runtime.Spec{MemoryMB: 512}, nil, nil)
	b.mu.Unlock()
	if err != nil || (placed != "m1" && placed != "m4") {
		t.Fatalf("place = %q, %v; want m1 or m4, an offline member whose relay answers and whose memory is known", placed, err)
	}

	// Once its relay stops answering, a member Incus calls offline is
	// not asked again (each question would wait for its bound), and one
	// whose memory is known is asked only for its pool.
	cl.mu.Lock()
	cl.members["m2"].probed(false)
	cl.members["m2"].probed(false)
	cl.mu.Unlock()
	mu.Lock()
	before := maps.Clone(asked)
	mu.Unlock()
	if err := b.refreshMembers(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for target, want := range map[string]int{"m1": 1, "m2": 0, "m3": 0, "m4": 1} {
		if got := asked[target] - before[target]; got != want {
			t.Errorf("second refresh asked %s %d times; want %d", target, got, want)
		}
	}
}
