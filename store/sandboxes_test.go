package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

func TestSandboxRoundTrip(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")
		in := &Sandbox{
			ID:                  "i0abc123",
			Tenant:              tn,
			Template:            "rki5dems9wqfm4r03t7g",
			Alias:               "base",
			State:               StatePaused,
			StartedAt:           time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC),
			EndAt:               time.Date(2026, 3, 4, 5, 11, 7, 123456789, time.UTC),
			CPUCount:            4,
			MemoryMB:            2048,
			DiskMB:              10240,
			Metadata:            map[string]string{"user": "u1", "weird key \"'.$[]": "ü"},
			EnvVars:             map[string]string{"FOO": "bar"},
			EnvdAccessToken:     "tok",
			Secure:              true,
			AllowInternetAccess: true,
			Network:             json.RawMessage(`{"allowOut":["1.1.1.1"]}`),
			Lifecycle:           Lifecycle{OnTimeout: OnTimeoutPause, AutoResume: true},
			Backend:             "incus",
			Handle:              "sandboxd-i0abc123",
		}
		if err := s.InsertSandbox(ctx, in); err != nil {
			t.Fatal(err)
		}
		if in.Generation != 1 || in.CreatedAt.IsZero() || !in.UpdatedAt.Equal(in.CreatedAt) {
			t.Errorf("after InsertSandbox: generation %d, created %v, updated %v", in.Generation, in.CreatedAt, in.UpdatedAt)
		}
		for name, get := range map[string]func() (Sandbox, error){
			"GetSandbox":    func() (Sandbox, error) { return s.GetSandbox(ctx, tn, in.ID) },
			"GetSandboxAny": func() (Sandbox, error) { return s.GetSandboxAny(ctx, in.ID) },
		} {
			got, err := get()
			if err != nil {
				t.Fatalf("%s() = %v", name, err)
			}
			if !reflect.DeepEqual(&got, in) {
				t.Errorf("%s() =\n%+v\nwant\n%+v", name, got, *in)
			}
		}

		// Defaults: nil maps and network, empty OnTimeout.
		bare := newSandbox("bare", tn, 0)
		if err := s.InsertSandbox(ctx, bare); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSandbox(ctx, tn, "bare")
		if err != nil {
			t.Fatal(err)
		}
		if got.Network != nil || len(got.Metadata) != 0 || len(got.EnvVars) != 0 || got.Lifecycle.OnTimeout != OnTimeoutKill {
			t.Errorf("GetSandbox(bare) = network %q, metadata %v, env %v, on timeout %q; want nil, empty, empty, kill",
				got.Network, got.Metadata, got.EnvVars, got.Lifecycle.OnTimeout)
		}
	})
}

func TestInsertSandboxErrors(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		tn := mustTenant(t, s, "acme")
		if err := s.InsertSandbox(t.Context(), newSandbox("dup", tn, 0)); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name    string
			edit    func(*Sandbox)
			wantErr error
		}{
			{"ok", func(*Sandbox) {}, nil},
			{"duplicate id", func(sb *Sandbox) { sb.ID = "dup" }, ErrConflict},
			{"unknown tenant", func(sb *Sandbox) { sb.Tenant = "nobody" }, ErrNotFound},
			{"empty tenant", func(sb *Sandbox) { sb.Tenant = "" }, ErrInvalid},
			{"empty id", func(sb *Sandbox) { sb.ID = "" }, ErrInvalid},
			{"upper id", func(sb *Sandbox) { sb.ID = "ABC" }, ErrInvalid},
			{"dash id", func(sb *Sandbox) { sb.ID = "a-b" }, ErrInvalid},
			{"bad state", func(sb *Sandbox) { sb.State = "zombie" }, ErrInvalid},
			{"empty state", func(sb *Sandbox) { sb.State = "" }, ErrInvalid},
			{"no start", func(sb *Sandbox) { sb.StartedAt = time.Time{} }, ErrInvalid},
			{"no end", func(sb *Sandbox) { sb.EndAt = time.Time{} }, ErrInvalid},
			{"negative memory", func(sb *Sandbox) { sb.MemoryMB = -1 }, ErrInvalid},
			{"bad network json", func(sb *Sandbox) { sb.Network = json.RawMessage(`{`) }, ErrInvalid},
			{"bad on timeout", func(sb *Sandbox) { sb.Lifecycle.OnTimeout = "explode" }, ErrInvalid},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				sb := newSandbox(fmt.Sprintf("s%d", i), tn, i)
				tt.edit(sb)
				err := s.InsertSandbox(t.Context(), sb)
				if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
					t.Errorf("InsertSandbox(%s) = %v; want %v", tt.name, err, tt.wantErr)
				}
			})
		}
	})
}

func TestSandboxTenantIsolation(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		a, b := mustTenant(t, s, "a"), mustTenant(t, s, "b")
		sb := newSandbox("owned", a, 0)
		if err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}

		_, errForeign := s.GetSandbox(ctx, b, "owned")
		_, errMissing := s.GetSandbox(ctx, b, "missing")
		if !errors.Is(errForeign, ErrNotFound) || !errors.Is(errMissing, ErrNotFound) {
			t.Fatalf("GetSandbox(foreign) = %v, GetSandbox(missing) = %v; want ErrNotFound for both", errForeign, errMissing)
		}
		// Answered exactly alike, up to the id the caller gave.
		if want := fmt.Sprintf("get sandbox owned: %v", ErrNotFound); errForeign.Error() != want {
			t.Errorf("GetSandbox(foreign) = %q; want %q", errForeign, want)
		}
		if want := fmt.Sprintf("get sandbox missing: %v", ErrNotFound); errMissing.Error() != want {
			t.Errorf("GetSandbox(missing) = %q; want %q", errMissing, want)
		}

		// A foreign tenant cannot update it either, and the row is untouched.
		hijack := *sb
		hijack.Tenant = b
		hijack.State = StateKilled
		if err := s.UpdateSandbox(ctx, &hijack); !errors.Is(err, ErrNotFound) {
			t.Errorf("UpdateSandbox(foreign) = %v; want ErrNotFound", err)
		}
		got, err := s.GetSandboxAny(ctx, "owned")
		if err != nil || got.Tenant != a || got.State != StateRunning || got.Generation != 1 {
			t.Errorf("GetSandboxAny(owned) = %+v, %v; want a's running sandbox at generation 1", got, err)
		}

		if sbs, _, err := s.ListSandboxes(ctx, ListFilter{Tenant: b}); err != nil || len(sbs) != 0 {
			t.Errorf("ListSandboxes(b) = %d sandboxes, %v; want 0", len(sbs), err)
		}
		if n, err := s.CountLive(ctx, b); err != nil || n != 0 {
			t.Errorf("CountLive(b) = %d, %v; want 0", n, err)
		}
	})
}

func TestUpdateSandboxGeneration(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")
		sb := newSandbox("gen", tn, 0)
		if err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}

		// Two actors read generation 1: a resume and the sweeper.
		resume, sweep := *sb, *sb
		resume.State = StatePaused
		resume.EndAt = resume.EndAt.Add(time.Hour)
		if err := s.UpdateSandbox(ctx, &resume); err != nil {
			t.Fatalf("first UpdateSandbox() = %v", err)
		}
		if resume.Generation != 2 {
			t.Errorf("generation after update = %d; want 2", resume.Generation)
		}
		sweep.State = StateKilled
		if err := s.UpdateSandbox(ctx, &sweep); !errors.Is(err, ErrConflict) {
			t.Fatalf("stale UpdateSandbox() = %v; want ErrConflict", err)
		}
		if sweep.Generation != 1 {
			t.Errorf("stale update changed the caller's generation to %d", sweep.Generation)
		}
		got, err := s.GetSandbox(ctx, tn, "gen")
		if err != nil || got.State != StatePaused || got.Generation != 2 || !got.EndAt.Equal(resume.EndAt) {
			t.Errorf("GetSandbox() = %+v, %v; want the resume's write at generation 2", got, err)
		}

		// Re-read, decide again, succeed.
		got.State = StateKilled
		if err := s.UpdateSandbox(ctx, &got); err != nil || got.Generation != 3 {
			t.Errorf("UpdateSandbox() after re-read = %v, generation %d; want nil, 3", err, got.Generation)
		}

		missing := newSandbox("missing", tn, 0)
		missing.Generation = 1
		if err := s.UpdateSandbox(ctx, missing); !errors.Is(err, ErrNotFound) {
			t.Errorf("UpdateSandbox(missing) = %v; want ErrNotFound", err)
		}
	})
}

// insertN inserts n running sandboxes prefixNNN of tenant tn, in id order;
// start times run 0,1,1,3,4,4,... seconds, so paging must break ties by id.
func insertN(t *testing.T, s *Store, tn tenant.ID, prefix string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s%03d", prefix, i)
		sb := newSandbox(id, tn, i-i%3/2) // times 0,0,2,3,3,5,...
		if err := s.InsertSandbox(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func TestListSandboxesPaging(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		tn := mustTenant(t, s, "acme")
		other := mustTenant(t, s, "other")
		asc := insertN(t, s, tn, "s", 250)
		insertN(t, s, other, "o", 10) // not listed
		desc := slices.Clone(asc)
		slices.Reverse(desc)

		for _, tt := range []struct {
			order Order
			want  []string
		}{
			{OrderAsc, asc},
			{OrderDesc, desc},
			{"", desc}, // E2B's default
		} {
			t.Run(string(tt.order), func(t *testing.T) {
				var (
					got   []string
					token string
					pages int
				)
				for {
					sbs, next, err := s.ListSandboxes(t.Context(), ListFilter{Tenant: tn, Order: tt.order, Limit: 100, Cursor: token})
					if err != nil {
						t.Fatalf("ListSandboxes(page %d) = %v", pages+1, err)
					}
					pages++
					for _, sb := range sbs {
						got = append(got, sb.ID)
					}
					if next == "" {
						break
					}
					if pages > 3 {
						t.Fatalf("more than 3 pages")
					}
					token = next
				}
				if pages != 3 {
					t.Errorf("pages = %d; want 3", pages)
				}
				if !slices.Equal(got, tt.want) {
					t.Errorf("paged ids = %v\nwant %v", got, tt.want)
				}
			})
		}
	})
}

func TestListSandboxesExactPage(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		// 100 sandboxes with limit 100: one page, no token.
		s := db.store(t)
		tn := mustTenant(t, s, "acme")
		insertN(t, s, tn, "s", 100)
		sbs, next, err := s.ListSandboxes(t.Context(), ListFilter{Tenant: tn})
		if err != nil || len(sbs) != 100 || next != "" {
			t.Errorf("ListSandboxes() = %d sandboxes, next %q, %v; want 100, \"\", nil", len(sbs), next, err)
		}
	})
}

func TestListSandboxesFilters(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")
		for i, sb := range []*Sandbox{
			{ID: "a", State: StateRunning, Template: "t1", Alias: "py", Metadata: map[string]string{"env": "prod", "team": "x"}},
			{ID: "b", State: StateRunning, Template: "t1", Alias: "py", Metadata: map[string]string{"env": "prod", "team": "y"}},
			{ID: "c", State: StatePaused, Template: "t2", Metadata: map[string]string{"env": "dev", "team": "x"}},
			{ID: "d", State: StateKilled, Template: "t2", Metadata: map[string]string{"env": "prod", "team": "x"}},
			{ID: "e", State: StateCreating, Template: "t3", Metadata: map[string]string{"env": "5"}},
			{ID: "f", State: StateRunning, Template: "t3", Metadata: map[string]string{"a=b&c": "d=e&f"}},
		} {
			full := newSandbox(sb.ID, tn, i)
			full.State, full.Template, full.Alias, full.Metadata = sb.State, sb.Template, sb.Alias, sb.Metadata
			if err := s.InsertSandbox(ctx, full); err != nil {
				t.Fatal(err)
			}
		}

		tests := []struct {
			name string
			f    ListFilter
			want []string // ascending
		}{
			{"default: live states", ListFilter{}, []string{"a", "b", "c", "e", "f"}},
			{"running", ListFilter{States: []State{StateRunning}}, []string{"a", "b", "f"}},
			{"running and paused", ListFilter{States: []State{StateRunning, StatePaused}}, []string{"a", "b", "c", "f"}},
			{"killed", ListFilter{States: []State{StateKilled}}, []string{"d"}},
			{"metadata one pair", ListFilter{Metadata: map[string]string{"env": "prod"}}, []string{"a", "b"}},
			{"metadata AND", ListFilter{Metadata: map[string]string{"env": "prod", "team": "x"}}, []string{"a"}},
			{"metadata AND no match", ListFilter{Metadata: map[string]string{"env": "dev", "team": "y"}}, nil},
			{"metadata unknown key", ListFilter{Metadata: map[string]string{"nope": "prod"}}, nil},
			{"metadata value is text", ListFilter{Metadata: map[string]string{"env": "5"}}, []string{"e"}},
			{"metadata special characters", ListFilter{Metadata: map[string]string{"a=b&c": "d=e&f"}}, []string{"f"}},
			{"metadata with killed", ListFilter{States: []State{StateKilled, StateRunning}, Metadata: map[string]string{"team": "x"}}, []string{"a", "d"}},
			{"template id", ListFilter{Template: "t2"}, []string{"c"}},
			{"template alias", ListFilter{Template: "py"}, []string{"a", "b"}},
			{"started after", ListFilter{StartedAfter: base.Add(2 * time.Second)}, []string{"e", "f"}},
			{"started after, strictly", ListFilter{StartedAfter: base.Add(5 * time.Second)}, nil},
			{"started after year 1", ListFilter{StartedAfter: time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)}, []string{"a", "b", "c", "e", "f"}},
			{"started after year 9999", ListFilter{StartedAfter: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)}, nil},
			{"combined", ListFilter{States: []State{StateRunning}, Template: "t1", Metadata: map[string]string{"team": "y"}}, []string{"b"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				tt.f.Tenant, tt.f.Order = tn, OrderAsc
				sbs, next, err := s.ListSandboxes(ctx, tt.f)
				if err != nil || next != "" {
					t.Fatalf("ListSandboxes() = next %q, %v", next, err)
				}
				var got []string
				for _, sb := range sbs {
					got = append(got, sb.ID)
				}
				if !slices.Equal(got, tt.want) {
					t.Errorf("ListSandboxes(%+v) = %v; want %v", tt.f, got, tt.want)
				}
			})
		}
	})
}

func TestListSandboxesInvalid(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		tn := mustTenant(t, s, "acme")
		insertN(t, s, tn, "s", 3)
		_, ascToken, err := s.ListSandboxes(t.Context(), ListFilter{Tenant: tn, Order: OrderAsc, Limit: 1})
		if err != nil || ascToken == "" {
			t.Fatalf("ListSandboxes() = token %q, %v", ascToken, err)
		}
		tests := []struct {
			name string
			f    ListFilter
		}{
			{"no tenant", ListFilter{}},
			{"bad order", ListFilter{Tenant: tn, Order: "sideways"}},
			{"negative limit", ListFilter{Tenant: tn, Limit: -1}},
			{"bad state", ListFilter{Tenant: tn, States: []State{"zombie"}}},
			{"garbage token", ListFilter{Tenant: tn, Cursor: "!!!"}},
			{"token of another order", ListFilter{Tenant: tn, Order: OrderDesc, Cursor: ascToken}},
			{"forged token", ListFilter{Tenant: tn, Cursor: cursor{order: OrderDesc, id: "x') OR 1=1"}.encode()}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if _, _, err := s.ListSandboxes(t.Context(), tt.f); !errors.Is(err, ErrInvalid) {
					t.Errorf("ListSandboxes(%+v) = %v; want ErrInvalid", tt.f, err)
				}
			})
		}
	})
}

func TestListExpiredAndLive(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		a, b := mustTenant(t, s, "a"), mustTenant(t, s, "b")
		now := base.Add(time.Hour)
		for _, c := range []struct {
			id    string
			tn    tenant.ID
			state State
			end   time.Time
		}{
			{"expired2", a, StateRunning, now.Add(-time.Second)},
			{"expired1", b, StateRunning, now.Add(-time.Minute)},
			{"exactly", a, StateRunning, now},
			{"future", a, StateRunning, now.Add(time.Second)},
			{"paused", a, StatePaused, now.Add(-time.Hour)},
			{"killed", b, StateKilled, now.Add(-time.Hour)},
			{"creating", b, StateCreating, now.Add(time.Hour)},
		} {
			sb := newSandbox(c.id, c.tn, 0)
			sb.State, sb.EndAt = c.state, c.end
			if err := s.InsertSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		ids := func(sbs []Sandbox) []string {
			var out []string
			for _, sb := range sbs {
				out = append(out, sb.ID)
			}
			return out
		}

		exp, err := s.ListExpired(ctx, now)
		if got, want := ids(exp), []string{"expired1", "expired2", "exactly"}; err != nil || !slices.Equal(got, want) {
			t.Errorf("ListExpired() = %v, %v; want %v", got, err, want)
		}
		for _, sb := range exp {
			if sb.Generation != 1 {
				t.Errorf("ListExpired() %s generation %d; want 1", sb.ID, sb.Generation)
			}
		}
		live, err := s.ListLive(ctx)
		if got, want := ids(live), []string{"creating", "exactly", "expired1", "expired2", "future", "paused"}; err != nil || !slices.Equal(got, want) {
			t.Errorf("ListLive() = %v, %v; want %v", got, err, want)
		}
	})
}

func TestCountAndSum(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		const diskMB = 100
		s := db.store(t)
		ctx := t.Context()
		a, b := mustTenant(t, s, "a"), mustTenant(t, s, "b")
		for i, c := range []struct {
			tn    tenant.ID
			state State
			mem   int
		}{
			{a, StateRunning, 512},
			{a, StatePaused, 1024},
			{a, StateCreating, 256},
			{a, StateKilled, 4096},
			{b, StateRunning, 8192},
		} {
			sb := newSandbox(fmt.Sprintf("s%d", i), c.tn, i)
			sb.State, sb.MemoryMB, sb.DiskMB = c.state, c.mem, diskMB
			if err := s.InsertSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		for _, tt := range []struct {
			tn       tenant.ID
			count    int
			memoryMB int
		}{
			{a, 3, 1792},
			{b, 1, 8192},
			{"nobody", 0, 0},
		} {
			n, err := s.CountLive(ctx, tt.tn)
			if err != nil || n != tt.count {
				t.Errorf("CountLive(%s) = %d, %v; want %d", tt.tn, n, err, tt.count)
			}
			m, err := s.SumMemoryMB(ctx, tt.tn, false)
			if err != nil || m != tt.memoryMB {
				t.Errorf("SumMemoryMB(%s) = %d, %v; want %d", tt.tn, m, err, tt.memoryMB)
			}
			m, err = s.SumMemoryMB(ctx, tt.tn, true)
			if want := tt.memoryMB + tt.count*diskMB; err != nil || m != want {
				t.Errorf("SumMemoryMB(%s, with disk) = %d, %v; want %d", tt.tn, m, err, want)
			}
		}
	})
}

func TestDeleteAndPurge(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")
		for i, id := range []string{"live", "dead1", "dead2"} {
			sb := newSandbox(id, tn, i)
			if id != "live" {
				sb.State = StateKilled
			}
			if err := s.InsertSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.DeleteSandbox(ctx, "dead1"); err != nil {
			t.Fatalf("DeleteSandbox(dead1) = %v", err)
		}
		if err := s.DeleteSandbox(ctx, "dead1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("DeleteSandbox(dead1) twice = %v; want ErrNotFound", err)
		}
		if _, err := s.GetSandboxAny(ctx, "dead1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("GetSandboxAny(deleted) = %v; want ErrNotFound", err)
		}
		if n, err := s.PurgeKilled(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
			t.Errorf("PurgeKilled(an hour ago) = %d, %v; want 0", n, err)
		}
		if n, err := s.PurgeKilled(ctx, time.Now().Add(time.Second)); err != nil || n != 1 {
			t.Errorf("PurgeKilled(now) = %d, %v; want 1", n, err)
		}
		live, err := s.ListLive(ctx)
		if err != nil || len(live) != 1 || live[0].ID != "live" {
			t.Errorf("ListLive() = %v, %v; want [live]", live, err)
		}
	})
}

func TestStates(t *testing.T) {
	for _, tt := range []struct {
		s           State
		valid, live bool
	}{
		{StateCreating, true, true},
		{StateRunning, true, true},
		{StatePausing, true, true},
		{StatePaused, true, true},
		{StateResuming, true, true},
		{StateKilling, true, true},
		{StateKilled, true, false},
		{"", false, false},
		{"Running", false, false},
	} {
		if got := tt.s.Valid(); got != tt.valid {
			t.Errorf("State(%q).Valid() = %v; want %v", tt.s, got, tt.valid)
		}
		if got := tt.s.Live(); got != tt.live {
			t.Errorf("State(%q).Live() = %v; want %v", tt.s, got, tt.live)
		}
	}
	var live []State
	for _, st := range liveStates {
		if st.Live() {
			live = append(live, st)
		}
	}
	if len(live) != len(liveStates) {
		t.Errorf("liveStates %v holds a state that is not live", liveStates)
	}
}

func FuzzDecodeCursor(f *testing.F) {
	f.Add(cursor{order: OrderAsc, started: 42, id: "abc"}.encode())
	f.Add("")
	f.Add("YXNjLjEuYQ")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := decodeCursor(tok)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("decodeCursor(%q) = %v; want ErrInvalid", tok, err)
			}
			return
		}
		if !ValidSandboxID(c.id) || (c.order != OrderAsc && c.order != OrderDesc) {
			t.Errorf("decodeCursor(%q) = %+v; accepted an invalid cursor", tok, c)
		}
		back, err := decodeCursor(c.encode())
		if err != nil || back != c {
			t.Errorf("decodeCursor(encode(%+v)) = %+v, %v", c, back, err)
		}
	})
}
