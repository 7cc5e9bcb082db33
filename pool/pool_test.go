package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox/sandboxtest"
	"github.com/sandboxd/sandboxd/tenant"
)

var keyA = Key{Tenant: "a", Template: "base", CPUCount: 2, MemoryMB: 512, DiskMB: 1024, AllowInternet: true}

type env struct {
	be      *sandboxtest.Backend
	p       *Pools
	cancel  context.CancelFunc
	done    chan struct{}
	minWarm atomic.Int64
	seeds   []Key
	told    sync.Map // member id -> struct{}: Config.Destroyed was called
}

// wasTold reports whether Config.Destroyed was told of member id.
func (e *env) wasTold(id string) bool {
	_, ok := e.told.Load(id)
	return ok
}

// start runs Pools over a fake backend inside the current synctest bubble.
// cfg's Backend, Health, NewID, NewToken and Admission (an *admission whose
// nil parts are filled in) are filled in unless set.
func start(t *testing.T, cfg Config, minWarm int) *env {
	t.Helper()
	e := &env{be: sandboxtest.New(), done: make(chan struct{}), seeds: []Key{keyA}}
	e.be.CreateDelay = 100 * time.Millisecond
	e.minWarm.Store(int64(minWarm))
	var n atomic.Int64
	if c, ok := cfg.Backend.(*cutOff); ok {
		c.Backend = e.be
	} else {
		cfg.Backend = e.be
	}
	if cfg.Health == nil {
		cfg.Health = func(context.Context, string) error { return nil }
	}
	cfg.Destroyed = func(id string) { e.told.Store(id, struct{}{}) }
	if cfg.NewID == nil {
		cfg.NewID = func() string { return fmt.Sprintf("m%d", n.Add(1)) }
	}
	cfg.NewToken = func() string { return "tok" }
	adm, _ := cfg.Admission.(*admission)
	if adm == nil {
		adm = &admission{}
	}
	if adm.minWarm == nil {
		adm.minWarm = func() int { return int(e.minWarm.Load()) }
	}
	if adm.seeds == nil {
		adm.seeds = func() []Key { return e.seeds }
	}
	cfg.Admission = adm
	if cfg.Tick == 0 {
		cfg.Tick = time.Hour // refills must not depend on the tick
	}
	cfg.Log = slog.New(slog.DiscardHandler)
	e.p = New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { defer close(e.done); e.p.Run(ctx) }()
	t.Cleanup(func() {
		e.stop()
		e.be.Close()
	})
	return e
}

// admission is the pools' Admission in tests: min_warm and seeds from the
// env unless set, and admit (nil admits every member).
type admission struct {
	minWarm func() int
	// minWarmOf, when set, is the min_warm of each key (minWarm is not
	// asked).
	minWarmOf func(Key) int
	seeds     func() []Key
	admit     func(ctx context.Context, k Key, members, memMB int) error
}

func (a *admission) Seeds() []Key { return a.seeds() }
func (a *admission) MinWarm(k Key) int {
	if a.minWarmOf != nil {
		return a.minWarmOf(k)
	}
	return a.minWarm()
}
func (a *admission) AdmitMember(ctx context.Context, k Key, members, memMB int) error {
	if a.admit == nil {
		return nil
	}
	return a.admit(ctx, k, members, memMB)
}

func (e *env) stop() {
	e.cancel()
	<-e.done
}

func (e *env) stat(k Key) Stat {
	for _, s := range e.p.Stats() {
		if s.Key == k {
			return s
		}
	}
	return Stat{Key: k}
}

// Each member is created with its pool's other members, ready or being
// made, as the hint to place it away from them.
func TestCreateSpreadsFromSiblings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{Parallel: 1}, 3)
		time.Sleep(time.Second)
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 3 {
			t.Fatalf("after fill: %+v, want 3 ready", s)
		}
		// One at a time: each names those made before it.
		for id, want := range map[string][]string{"m1": nil, "m2": {"m1"}, "m3": {"m1", "m2"}} {
			if got := slices.Sorted(slices.Values(e.be.Get(id).Spec.SpreadFrom)); !slices.Equal(got, want) {
				t.Errorf("member %s spread from %v; want %v", id, got, want)
			}
		}
	})
}

// cutOff is the fake backend with a say on which sandboxes can be reached,
// as the Incus backend has on a cluster.
type cutOff struct {
	*sandboxtest.Backend
	down sync.Map // id → struct{}
}

func (c *cutOff) Reachable(id string) bool {
	_, down := c.down.Load(id)
	return !down
}

// Claims skip members the backend cannot reach, and take them again once
// it can.
func TestClaimSkipsUnreachable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &cutOff{}
		e := start(t, Config{Backend: be, Parallel: 1}, 3)
		time.Sleep(time.Second)
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 3 {
			t.Fatalf("after fill: %+v, want 3 ready", s)
		}
		be.down.Store("m1", struct{}{})
		be.down.Store("m2", struct{}{})
		if m, ok := e.p.Claim(keyA, false); !ok || m.ID != "m3" {
			t.Fatalf("claim with m1 and m2 cut off: %+v %v, want m3", m, ok)
		}
		if m, ok := e.p.Claim(keyA, false); ok {
			t.Fatalf("claim with only cut-off members ready: got %s, want a miss", m.ID)
		}
		be.down.Delete("m1")
		if m, ok := e.p.Claim(keyA, false); !ok || m.ID != "m1" {
			t.Fatalf("claim once m1 answers again: %+v %v, want m1", m, ok)
		}
	})
}

func TestFillsToMinWarmAndRefillsOnClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{Parallel: 2}, 3)
		time.Sleep(time.Second)
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 3 || s.Target != 3 {
			t.Fatalf("after fill: %+v, want 3 ready, target 3", s)
		}
		m, ok := e.p.Claim(keyA, false)
		if !ok {
			t.Fatal("claim missed a full pool")
		}
		if m.Key != keyA || m.AccessToken != "tok" || e.be.Get(m.ID) == nil {
			t.Fatalf("claimed member %+v is not a live backend sandbox", m)
		}
		if got := e.be.Get(m.ID).Spec.AccessToken; got != m.AccessToken {
			t.Errorf("backend token %q, member token %q", got, m.AccessToken)
		}
		// The tick is an hour away: only a wake-up can refill, and a hit
		// leaves it to the claimer, once the member is handed over.
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 2 || s.Starting != 0 {
			t.Fatalf("right after claim: %+v, want no refill before Refill", s)
		}
		e.p.Refill()
		synctest.Wait()
		if s := e.stat(keyA); s.Ready+s.Starting != 3 {
			t.Fatalf("after Refill: %+v, want a refill under way", s)
		}
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 3 {
			t.Fatalf("after refill: %+v, want 3 ready", s)
		}
		if got := e.be.Len(); got != 4 {
			t.Fatalf("backend holds %d, want 4 (3 warm + the claimed one)", got)
		}
		// The claimed member is never handed out again.
		for range 3 {
			m2, ok := e.p.Claim(keyA, false)
			if !ok || m2.ID == m.ID {
				t.Fatalf("claim: %+v %v (first claim was %s)", m2, ok, m.ID)
			}
		}
		c := e.p.Counts()
		if len(c) != 1 || c[0].Hits != 4 || c[0].Misses != 0 {
			t.Fatalf("counts = %+v, want 4 hits", c)
		}
	})
}

func TestMissOnEmptyPool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{}, 0)
		other := keyA
		other.Template = "python"
		if _, ok := e.p.Claim(other, false); ok {
			t.Fatal("claim hit an empty pool")
		}
		c := e.p.Counts()
		if len(c) != 1 || c[0].Misses != 1 || c[0].Template != "python" {
			t.Fatalf("counts = %+v, want one miss of python", c)
		}
		// One claim is not demand enough for a member (min_warm is 0).
		time.Sleep(time.Second)
		synctest.Wait()
		if got := e.be.Len(); got != 0 {
			t.Fatalf("backend holds %d members, want 0", got)
		}
	})
}

func TestAdaptiveSizingAndTrim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{Lead: 5 * time.Second, HalfLife: time.Minute, IdleAfter: 5 * time.Minute,
			ForgetAfter: time.Hour, Parallel: 4, Tick: time.Second}, 1)
		k := keyA
		k.Template = "busy"
		// Two claims a second for two minutes: the average reaches
		// 2 × (1 - 2^-2) = 1.5/s, so the target is round(1.5 × 5) = 8.
		for range 240 {
			e.p.Claim(k, false)
			time.Sleep(500 * time.Millisecond)
		}
		synctest.Wait()
		s := e.stat(k)
		if s.Target < 7 || s.Target > 9 {
			t.Fatalf("target after 2/s for 2 min = %d, want about 8", s.Target)
		}
		if s.Ready+s.Starting < s.Target-1 {
			t.Fatalf("pool %+v lags its target", s)
		}
		// Claims stop: after IdleAfter the adaptive part goes; min_warm stays.
		time.Sleep(6 * time.Minute)
		synctest.Wait()
		if s := e.stat(k); s.Target != 1 || s.Ready != 1 {
			t.Fatalf("after idle: %+v, want target 1 (min_warm), 1 ready", s)
		}
		// After ForgetAfter a non-seed pool goes entirely.
		time.Sleep(time.Hour)
		synctest.Wait()
		for _, s := range e.p.Stats() {
			if s.Key == k {
				t.Fatalf("idle pool %+v not forgotten", s)
			}
		}
		// The seed (default) pool keeps min_warm throughout.
		if s := e.stat(keyA); s.Ready != 1 {
			t.Fatalf("seed pool %+v, want 1 ready", s)
		}
	})
}

func TestMinWarmChangePickedUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{Tick: time.Second}, 2)
		time.Sleep(time.Second)
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 2 {
			t.Fatalf("%+v, want 2 ready", s)
		}
		e.minWarm.Store(0) // `tenants set a --min-warm 0`
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := e.be.Len(); got != 0 {
			t.Fatalf("backend holds %d after min_warm 0, want 0", got)
		}
		e.minWarm.Store(4)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 4 {
			t.Fatalf("%+v, want 4 ready", s)
		}
	})
}

func TestAdmitCapsThePool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var seen []int
		admit := func(_ context.Context, k Key, members, memMB int) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, members)
			if members+1 > 2 {
				return errors.New("quota")
			}
			if memMB != members*k.MemoryMB {
				return fmt.Errorf("memory %d for %d members", memMB, members)
			}
			return nil
		}
		e := start(t, Config{Admission: &admission{admit: admit}, Tick: time.Second}, 5)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 2 || s.Target != 5 {
			t.Fatalf("%+v, want 2 ready (capped by Admit) of target 5", s)
		}
	})
}

func TestUnhealthyMemberNeverClaimable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fail atomic.Bool
		fail.Store(true)
		health := func(context.Context, string) error {
			if fail.Load() {
				return errors.New("envd not answering")
			}
			return nil
		}
		e := start(t, Config{Health: health, Parallel: 1, Tick: time.Second}, 1)
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if _, ok := e.p.Claim(keyA, false); ok {
			t.Fatal("claimed a member whose envd failed /health")
		}
		if got := e.be.Len(); got != 0 {
			t.Fatalf("backend holds %d unhealthy members, want 0 (destroyed)", got)
		}
		fail.Store(false)
		time.Sleep(5 * time.Second) // backoff, then retry
		synctest.Wait()
		if _, ok := e.p.Claim(keyA, false); !ok {
			t.Fatal("no member after envd recovered")
		}
	})
}

func TestCreateFailureBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Count attempts through NewID calls: each create mints an id.
		var n atomic.Int64
		newID := func() string { return fmt.Sprintf("m%d", n.Add(1)) }
		e := start(t, Config{Parallel: 1, Tick: 100 * time.Millisecond, NewID: newID}, 1)
		boom := errors.New("backend down")
		e.be.FailCreate.Store(&boom)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		attempts := int(n.Load())
		// Backoff 1, 2, 4, 8 s: a handful of attempts in 10 s, not 100.
		if attempts > 6 {
			t.Fatalf("%d create attempts in 10 s against a failing backend", attempts)
		}
		e.be.FailCreate.Store(nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 1 {
			t.Fatalf("%+v after recovery, want 1 ready", s)
		}
	})
}

func TestDrainDestroysMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{Parallel: 4}, 3)
		time.Sleep(time.Second)
		synctest.Wait()
		claimed, ok := e.p.Claim(keyA, false)
		if !ok {
			t.Fatal("claim missed")
		}
		time.Sleep(50 * time.Millisecond) // a refill is in flight
		e.stop()
		if ids := e.be.IDs(); len(ids) != 1 || ids[0] != claimed.ID {
			t.Fatalf("after drain backend holds %v, want only the claimed %s", ids, claimed.ID)
		}
		if _, ok := e.p.Claim(keyA, false); ok {
			t.Fatal("claim after drain")
		}
	})
}

func TestReservedMB(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{}, 2)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := e.p.ReservedMB(); got != 2*512 {
			t.Fatalf("reserved = %d MiB, want 1024", got)
		}
	})
}

func TestUnknownTemplatePoolDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{Tick: time.Second, Admission: &admission{seeds: func() []Key { return nil }}}, 1)
		boom := fmt.Errorf("template nope: %w", runtime.ErrTemplateNotFound)
		e.be.FailCreate.Store(&boom)
		k := keyA
		k.Template = "nope"
		e.p.Claim(k, false) // a miss: the pool is born with min_warm 1
		time.Sleep(time.Second)
		synctest.Wait()
		for _, s := range e.p.Stats() {
			if s.Key == k {
				t.Fatalf("pool of an unknown template kept: %+v", s)
			}
		}
	})
}

// TestTakeAfterMiss: a caller whose claim missed waits on Ready and takes
// the member the claim's refill makes; Take counts it as Waited, and after
// the drain Ready fires once more and Take finds nothing.
func TestTakeAfterMiss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{Lead: -1}, 1)
		time.Sleep(time.Second)
		synctest.Wait()
		if _, ok := e.p.Claim(keyA, false); !ok {
			t.Fatal("claim missed a full pool")
		}
		if _, ok := e.p.Claim(keyA, false); ok {
			t.Fatal("second claim hit: the refill cannot be ready yet")
		}
		ready := e.p.Ready()
		if _, ok := e.p.Take(keyA, false); ok {
			t.Fatal("take hit before the refill was ready")
		}
		select {
		case <-ready:
			t.Fatal("Ready fired before a member was ready")
		default:
		}
		<-ready // the refill the claims started
		m, ok := e.p.Take(keyA, false)
		if !ok || e.be.Get(m.ID) == nil {
			t.Fatalf("take after Ready: %+v %v", m, ok)
		}
		c := e.p.Counts()
		if len(c) != 1 || c[0].Hits != 1 || c[0].Misses != 1 || c[0].Waited != 1 {
			t.Fatalf("counts = %+v, want 1 hit, 1 miss, 1 waited", c)
		}
		ready = e.p.Ready()
		e.stop()
		<-ready // the drain wakes waiters
		if _, ok := e.p.Take(keyA, false); ok {
			t.Fatal("take after the drain")
		}
		if e.p.Ready() != nil {
			t.Fatal("Ready after the drain should never fire")
		}
	})
}

// Drop destroys a template's ready members at once and its starting ones
// when they are done; a claim after it misses.
func TestDropTemplate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := start(t, Config{Parallel: 1}, 3)
		time.Sleep(150 * time.Millisecond) // one ready, the next starting
		synctest.Wait()
		if s := e.stat(keyA); s.Ready != 1 || s.Starting != 1 {
			t.Fatalf("before drop: %+v, want 1 ready, 1 starting", s)
		}
		e.seeds = nil // keyA's pool stays dropped: no seed brings it back
		ready := e.be.IDs()
		e.p.Drop(t.Context(), keyA.Template)
		for _, id := range ready {
			if e.be.Get(id) != nil {
				t.Fatalf("ready member %s outlived the drop", id)
			}
			if !e.wasTold(id) {
				t.Errorf("Config.Destroyed not told of dropped member %s", id)
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := e.be.Len(); got != 0 {
			t.Fatalf("after the starting member finished the backend holds %d, want 0", got)
		}
		if _, ok := e.p.Claim(keyA, false); ok {
			t.Fatal("claim of a dropped template hit")
		}
	})
}

// spareOfAll is Config.Spare serving every key but those of template
// "private".
func spareOfAll(k Key) (Key, bool) {
	if k.Template == "private" {
		return Key{}, false
	}
	k.Tenant = ""
	return k, true
}

// A claim takes the tenant's own member (its min_warm reservation) first,
// then a spare member, which any tenant may get, and only then misses;
// spare members carry nothing of a tenant and are refilled after claims.
func TestSpareServesAfterOwnPool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spare := keyA
		spare.Tenant = ""
		keyB := keyA
		keyB.Tenant = "b"
		adm := &admission{minWarmOf: func(k Key) int {
			switch k.Tenant {
			case "":
				return 2
			case "a":
				return 1
			}
			return 0
		}, seeds: func() []Key { return []Key{keyA, spare} }}
		e := start(t, Config{Admission: adm, Spare: spareOfAll, Lead: -1, Parallel: 4}, 0)
		time.Sleep(time.Second)
		synctest.Wait()
		if s := e.stat(spare); s.Ready != 2 {
			t.Fatalf("spare pool %+v, want 2 ready", s)
		}
		for _, m := range e.p.pools[spare].ready {
			if sp := e.be.Get(m.ID).Spec; sp.Env != nil || m.Key.Tenant != "" {
				t.Errorf("spare member %s carries a tenant's data: %+v", m.ID, sp)
			}
		}
		own, ok := e.p.Claim(keyA, false)
		if !ok || own.Key != keyA {
			t.Fatalf("first claim of a: %+v %v, want a's own member", own, ok)
		}
		for i, k := range []Key{keyA, keyB} {
			m, ok := e.p.Claim(k, false)
			if !ok || !m.Key.IsSpare() {
				t.Fatalf("claim %d of %s: %+v %v, want a spare member", i, k.Tenant, m, ok)
			}
		}
		if _, ok := e.p.Claim(keyB, false); ok {
			t.Fatal("claim hit with both pools empty")
		}
		want := map[tenant.ID]Count{
			"a": {Tenant: "a", Template: "base", Hits: 1, Spare: 1},
			"b": {Tenant: "b", Template: "base", Spare: 1, Misses: 1},
			"":  {Tenant: "", Template: "base", Hits: 2, Misses: 1},
		}
		for _, c := range e.p.Counts() {
			if c != want[c.Tenant] {
				t.Errorf("count of %q = %+v, want %+v", c.Tenant, c, want[c.Tenant])
			}
		}
		// Both pools refill; a member of a's reservation goes to a only.
		time.Sleep(time.Second)
		synctest.Wait()
		if s, o := e.stat(spare), e.stat(keyA); s.Ready != 2 || o.Ready != 1 {
			t.Fatalf("after refill: spare %+v, a %+v", s, o)
		}
		if m, ok := e.p.Claim(keyB, false); !ok || !m.Key.IsSpare() {
			t.Fatalf("b after refill: %+v %v, want a spare member", m, ok)
		}
	})
}

// Once two tenants claimed from a spare pool, its last SpareReserve members
// go to lone claims only: a claim in the background of its tenant's other
// creates misses there, by Claim and by Take alike, and a lone claim still
// gets them. A pool only one tenant claims from keeps no reserve.
func TestSpareReserveIsForLoneClaims(t *testing.T) {
	keyB := keyA
	keyB.Tenant = "b"
	for _, tc := range []struct {
		name    string
		reserve int
		// first claims before a's background ones (one member each), then
		// idle without claims (the pool refills meanwhile)
		first []Key
		idle  time.Duration
		// a's background claims that hit before the first miss; then b's
		// lone claims that hit
		background, lone int
	}{
		{"shared, default reserve", 0, []Key{keyB}, 0, 1, 2},
		{"shared, reserve of 3", 3, []Key{keyB}, 0, 0, 3},
		{"shared, no reserve", -1, []Key{keyB}, 0, 3, 0},
		{"one tenant: no reserve", 0, []Key{keyA}, 0, 3, 0},
		{"shared an hour ago: no longer", 0, []Key{keyB, keyA}, spareShared + time.Second, 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				spare := keyA
				spare.Tenant = ""
				adm := &admission{minWarmOf: func(k Key) int {
					if k.IsSpare() {
						return 4
					}
					return 0
				}, seeds: func() []Key { return []Key{spare} }}
				e := start(t, Config{Admission: adm, Spare: spareOfAll, Lead: -1, Parallel: 4, SpareReserve: tc.reserve,
					Tick: time.Hour, Recheck: -1}, 0)
				time.Sleep(time.Second)
				synctest.Wait()
				if s := e.stat(spare); s.Ready != 4 {
					t.Fatalf("spare pool %+v, want 4 ready", s)
				}
				for _, k := range tc.first {
					if _, ok := e.p.Claim(k, false); !ok {
						t.Fatalf("first claim of %s missed", k.Tenant)
					}
				}
				time.Sleep(tc.idle)
				synctest.Wait()
				hits := 0
				for {
					if _, ok := e.p.Claim(keyA, true); !ok {
						break
					}
					hits++
				}
				if hits != tc.background {
					t.Errorf("background claims hit %d times, want %d", hits, tc.background)
				}
				if m, ok := e.p.Take(keyA, true); ok {
					t.Errorf("a background Take got %s", m.ID)
				}
				for i := range tc.lone {
					if m, ok := e.p.Claim(keyB, false); !ok || !m.Key.IsSpare() {
						t.Fatalf("lone claim %d: %+v %v, want a spare member", i, m, ok)
					}
				}
				if m, ok := e.p.Claim(keyB, false); ok {
					t.Errorf("a lone claim got %s from an empty spare pool", m.ID)
				}
			})
		})
	}
}

// With spare pools the adaptive size follows the host-wide claim rate in
// the spare pool, and a tenant's own pool stays at min_warm; a key no spare
// pool serves keeps its own adaptive pool.
func TestSpareFollowsHostWideRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		adm := &admission{seeds: func() []Key { return nil }}
		e := start(t, Config{Admission: adm, Spare: spareOfAll, Lead: 5 * time.Second, HalfLife: time.Minute,
			IdleAfter: 5 * time.Minute, Parallel: 8, Tick: time.Second}, 0)
		keys := []Key{keyA, keyA, keyA}
		keys[1].Tenant, keys[2].Tenant = "b", "c"
		private := keyA
		private.Template = "private"
		// Three tenants, each 2/3 claim a second: 2/s host-wide, for 2 min.
		for i := range 240 {
			e.p.Claim(keys[i%3], false)
			if i%2 == 0 {
				e.p.Claim(private, false)
			}
			time.Sleep(500 * time.Millisecond)
		}
		synctest.Wait()
		spare := keyA
		spare.Tenant = ""
		if s := e.stat(spare); s.Target < 7 || s.Target > 9 {
			t.Errorf("spare target after 2/s host-wide = %d, want about 8", s.Target)
		}
		for _, k := range keys {
			if s := e.stat(k); s.Target != 0 {
				t.Errorf("tenant %s's pool target = %d, want 0 (min_warm; the spare pool adapts)", k.Tenant, s.Target)
			}
		}
		if s := e.stat(private); s.Target < 3 || s.Target > 5 {
			t.Errorf("private template pool target after 1/s = %d, want about 4 (its own adaptive size)", s.Target)
		}
		// Idle: the spare pool shrinks to its floor (0 here).
		time.Sleep(6 * time.Minute)
		synctest.Wait()
		if s := e.stat(spare); s.Target != 0 || s.Ready != 0 {
			t.Errorf("spare pool after idle: %+v, want empty", s)
		}
	})
}

// The spare pool's members pass the same Admission as a tenant's (the host
// memory guard): refused, the pool stays below its floor.
func TestSpareHeldBackByAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spare := keyA
		spare.Tenant = ""
		var asked atomic.Int64
		adm := &admission{
			minWarmOf: func(Key) int { return 4 },
			admit: func(_ context.Context, k Key, members, _ int) error {
				if !k.IsSpare() {
					return fmt.Errorf("unexpected key %+v", k)
				}
				asked.Add(1)
				if members >= 3 {
					return errors.New("host memory budget reached")
				}
				return nil
			},
		}
		adm.seeds = func() []Key { return []Key{spare} }
		e := start(t, Config{Admission: adm, Spare: spareOfAll, Tick: time.Second}, 0)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if s := e.stat(spare); s.Ready != 3 || s.Target != 4 || asked.Load() == 0 {
			t.Fatalf("spare pool %+v (asked %d), want 3 ready of target 4", s, asked.Load())
		}
	})
}

// health is a Config.Health whose members can be made to fail, or to hang
// until the check's deadline, and that counts its calls per member.
type health struct {
	mu    sync.Mutex
	calls map[string]int
	bad   map[string]bool // answers an error
	hang  map[string]bool // answers only when ctx ends
}

func newHealth() *health {
	return &health{calls: map[string]int{}, bad: map[string]bool{}, hang: map[string]bool{}}
}

func (h *health) check(ctx context.Context, id string) error {
	h.mu.Lock()
	h.calls[id]++
	bad, hang := h.bad[id], h.hang[id]
	h.mu.Unlock()
	switch {
	case hang:
		<-ctx.Done()
		return ctx.Err()
	case bad:
		return errors.New("envd not answering")
	}
	return nil
}

func (h *health) set(m map[string]bool, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m[id] = true
}

func (h *health) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[id]
}

// A member ready for Recheck is checked again: healthy, it stays, in its
// place (the oldest is still handed out first); dead, it is destroyed,
// never handed out, and replaced. A negative Recheck checks only at create.
func TestRecheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		recheck time.Duration
		bad     bool // m1's envd dies once it is ready
		// m1's /health calls: at create, and at each recheck
		wantCalls  int
		wantGone   bool     // m1 destroyed
		wantClaims []string // what claims hand out, in order
	}{
		{"healthy members stay in order", 10 * time.Second, false, 2, false, []string{"m1", "m2"}},
		{"dead member destroyed and replaced", 10 * time.Second, true, 2, true, []string{"m2", "m3"}},
		{"disabled", -1, true, 1, false, []string{"m1", "m2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHealth()
				// One create at a time: m1 is ready 100 ms before m2, and
				// with a tick of 50 ms it is rechecked alone, then goes
				// back before m2.
				e := start(t, Config{Health: h.check, Recheck: tc.recheck, Parallel: 1, Tick: 50 * time.Millisecond, Lead: -1}, 2)
				time.Sleep(time.Second)
				synctest.Wait()
				if s := e.stat(keyA); s.Ready != 2 {
					t.Fatalf("after fill: %+v, want 2 ready", s)
				}
				if tc.bad {
					h.set(h.bad, "m1")
				}
				// Past the rechecks (due at 10.1 and 10.2 s) and the
				// refill they may start (100 ms).
				time.Sleep(11 * time.Second)
				synctest.Wait()
				if got := h.count("m1"); got != tc.wantCalls {
					t.Errorf("m1's /health calls = %d, want %d", got, tc.wantCalls)
				}
				if gone := e.be.Get("m1") == nil; gone != tc.wantGone || e.wasTold("m1") != tc.wantGone {
					t.Errorf("m1 destroyed = %v, Config.Destroyed told = %v; want %v", gone, e.wasTold("m1"), tc.wantGone)
				}
				if s := e.stat(keyA); s.Ready != 2 || s.Starting != 0 {
					t.Fatalf("after the recheck: %+v, want 2 ready", s)
				}
				for i, want := range tc.wantClaims {
					m, ok := e.p.Claim(keyA, false)
					if !ok || m.ID != want {
						t.Fatalf("claim %d: %+v %v, want %s", i, m, ok, want)
					}
				}
			})
		})
	}
}

// A member under a recheck is out of the pool: a claim cannot take it,
// even when its envd answers only at the check's deadline; once that
// passes it is destroyed and replaced. Meanwhile it still counts as ready,
// so no refill doubles it.
func TestRecheckHoldsMemberOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHealth()
		e := start(t, Config{Health: h.check, Recheck: 10 * time.Second, Parallel: 1, Tick: time.Second, Lead: -1}, 1)
		time.Sleep(time.Second)
		synctest.Wait()
		h.set(h.hang, "m1")
		time.Sleep(10 * time.Second) // the tick at 11 s starts m1's recheck
		synctest.Wait()
		if got := h.count("m1"); got != 2 {
			t.Fatalf("m1's /health calls = %d, want 2 (its recheck under way)", got)
		}
		if s := e.stat(keyA); s.Ready != 1 || s.Starting != 0 {
			t.Fatalf("during the recheck: %+v, want 1 ready (under check), none starting", s)
		}
		if m, ok := e.p.Claim(keyA, false); ok {
			t.Fatalf("claimed %s, a member under its recheck", m.ID)
		}
		time.Sleep(recheckTimeout)
		synctest.Wait()
		if e.be.Get("m1") != nil {
			t.Fatal("m1 outlived a recheck that timed out")
		}
		time.Sleep(200 * time.Millisecond) // its replacement
		synctest.Wait()
		if m, ok := e.p.Claim(keyA, false); !ok || m.ID != "m2" {
			t.Fatalf("claim after the recheck: %+v %v, want m2", m, ok)
		}
	})
}

// MaxPerPool caps a tenant's pool and MaxSpare a spare pool: one cap for
// every tenant's burst would hold the shared pool to one tenant's size.
func TestPoolCaps(t *testing.T) {
	for _, c := range []struct {
		name                 string
		maxPerPool, maxSpare int
		wantOwn, wantSpare   int
	}{
		{"spare above the per-pool cap", 3, 6, 3, 6},
		{"spare below it", 5, 2, 5, 2},
		{"spare cap unset: the per-pool cap", 4, 0, 4, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				spare := keyA
				spare.Tenant = ""
				adm := &admission{minWarmOf: func(Key) int { return 10 }, seeds: func() []Key { return []Key{keyA, spare} }}
				e := start(t, Config{Admission: adm, Spare: spareOfAll, Lead: -1, Parallel: 4,
					MaxPerPool: c.maxPerPool, MaxSpare: c.maxSpare}, 0)
				time.Sleep(3 * time.Second)
				synctest.Wait()
				if s := e.stat(keyA); s.Target != c.wantOwn || s.Ready != c.wantOwn {
					t.Errorf("tenant's pool %+v, want target and ready %d", s, c.wantOwn)
				}
				if s := e.stat(spare); s.Target != c.wantSpare || s.Ready != c.wantSpare {
					t.Errorf("spare pool %+v, want target and ready %d", s, c.wantSpare)
				}
			})
		})
	}
}
