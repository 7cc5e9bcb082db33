package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// testSpares: base and py are the backend's own; ci is a public build
// resolved from the reference "code-interpreter-v1"; priv is a tenant's
// build (neither).
func testSpares(min map[string]int) *spares {
	return &spares{
		min: min,
		resolve: func(_ context.Context, ref string) (string, bool) {
			switch ref {
			case "code-interpreter-v1":
				return "ci", true
			case "base", "py":
				return ref, true
			}
			return "", false // not built yet
		},
		builtin: func(t string) bool { return t == "base" || t == "py" },
		key:     func(t string) pool.Key { return pool.Key{Template: t, CPUCount: 1, MemoryMB: 512, AllowInternet: true} },
	}
}

func TestSpareKeyAndFloors(t *testing.T) {
	a := &Admitter{spare: testSpares(map[string]int{"base": 2, "code-interpreter-v1": 1, "later": 3})}
	a.spare.refresh(context.Background())
	def := func(tmpl string) pool.Key { return a.spare.key(tmpl) }
	small := def("base")
	small.AllowInternet = false
	for _, c := range []struct {
		name      string
		key       pool.Key
		spare     bool // a spare pool serves it
		spareMin  int  // MinWarm of that spare pool
		withSeeds bool // among Seeds
	}{
		{"the backend's template, default shape", withTenant(def("base"), "a"), true, 2, true},
		{"the backend's template, another shape: served, no floor", withTenant(small, "a"), true, 0, false},
		{"a backend template without a floor", withTenant(def("py"), "a"), true, 0, false},
		{"a public build named in --spare-min", withTenant(def("ci"), "a"), true, 1, true},
		{"a tenant's private build", withTenant(def("priv"), "a"), false, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			sk, ok := a.SpareKey(c.key)
			if ok != c.spare {
				t.Fatalf("SpareKey(%+v) ok = %v, want %v", c.key, ok, c.spare)
			}
			if !ok {
				return
			}
			if !sk.IsSpare() || withTenant(sk, string(c.key.Tenant)) != c.key {
				t.Fatalf("spare key %+v of %+v: want the key without its tenant", sk, c.key)
			}
			if got := a.MinWarm(sk); got != c.spareMin {
				t.Errorf("MinWarm(spare) = %d, want %d", got, c.spareMin)
			}
			seeded := false
			for _, k := range a.Seeds() {
				seeded = seeded || k == sk
			}
			if seeded != c.withSeeds {
				t.Errorf("seeded = %v, want %v", seeded, c.withSeeds)
			}
			if _, again := a.SpareKey(sk); again {
				t.Error("a spare key has a spare pool of its own")
			}
		})
	}
}

func withTenant(k pool.Key, t string) pool.Key {
	k.Tenant = tenant.ID(t)
	return k
}

// A spare member counts in the host's budget only: no tenant's quota
// holds it back, the host guard does.
func TestAdmitSpareMember(t *testing.T) {
	key := pool.Key{Template: "base", MemoryMB: 512}
	for _, c := range []struct {
		name      string
		available int
		refused   bool
	}{
		{"memory to spare", 4096, false},
		{"host short of memory", 600, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &Admitter{
				hostReserveMB: 512,
				memAvailable:  func() (int, error) { return c.available, nil },
			}
			err := a.AdmitMember(context.Background(), key, 10, 5120)
			if c.refused != (err != nil) {
				t.Fatalf("AdmitMember: %v, refused want %v", err, c.refused)
			}
			if err != nil && !errors.Is(err, errdefs.ErrUnavailable) {
				t.Errorf("refusal %v is not ErrUnavailable", err)
			}
		})
	}
}

// claimRecorder is a Pool that records each claim's background flag and
// always misses.
type claimRecorder struct {
	mu         sync.Mutex
	background []bool
}

func (r *claimRecorder) Claim(_ pool.Key, background bool) (*pool.Member, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.background = append(r.background, background)
	return nil, false
}
func (r *claimRecorder) Ready() <-chan struct{}                   { return make(chan struct{}) }
func (r *claimRecorder) Take(pool.Key, bool) (*pool.Member, bool) { return nil, false }
func (r *claimRecorder) ReservedMB() int                          { return 0 }
func (r *claimRecorder) Refill()                                  {}

func (r *claimRecorder) last() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.background[len(r.background)-1]
}

// A create claims in the background while its tenant has another in
// progress, or had two at once within concurrentMemory; another tenant's
// create, and a sequential user's, claim alone (and may take a spare
// pool's reserve).
func TestClaimBackgroundOfATenantsFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newTestEnv(t, nil)
		rec := &claimRecorder{}
		e.m.UsePool(rec)
		admit := func(name string) *Ticket {
			t.Helper()
			tk, err := e.m.adm.Admit(as(name), AdmitRequest{
				Sandbox: &store.Sandbox{ID: NewID(), Tenant: tenant.ID(name), Template: "base", MemoryMB: 512, State: store.StateCreating,
					StartedAt: time.Now(), EndAt: time.Now().Add(time.Minute)},
				Key: pool.Key{Tenant: tenant.ID(name), Template: "base", MemoryMB: 512},
			})
			if err != nil {
				t.Fatal(err)
			}
			return tk
		}
		steps := []struct {
			name       string
			sleep      time.Duration
			tenant     string
			release    bool // release the ticket at once
			background bool
		}{
			{"a's first create", 0, "a", false, false},
			{"a's second while the first runs", 0, "a", false, true},
			{"b's create beside a's two", 0, "b", true, false},
			{"b's next, sequential", 0, "b", true, false},
		}
		var open []*Ticket
		for _, st := range steps {
			time.Sleep(st.sleep)
			tk := admit(st.tenant)
			if got := rec.last(); got != st.background {
				t.Errorf("%s: background = %v, want %v", st.name, got, st.background)
			}
			if st.release {
				tk.Release()
			} else {
				open = append(open, tk)
			}
		}
		for _, tk := range open {
			tk.Release()
		}
		// a's clients pause between creates: within concurrentMemory its
		// next create is still the flood's; after it, a lone one.
		for _, c := range []struct {
			sleep      time.Duration
			background bool
		}{{concurrentMemory / 2, true}, {concurrentMemory, false}} {
			time.Sleep(c.sleep)
			admit("a").Release()
			if got := rec.last(); got != c.background {
				t.Errorf("a's create %v later: background = %v, want %v", c.sleep, got, c.background)
			}
		}
	})
}
