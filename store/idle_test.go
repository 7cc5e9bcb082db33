package store

import (
	"errors"
	"testing"
	"time"
)

// TestMigrateIdleColumns: a database at schema 1 (before idle TTLs) with a
// sandbox in it is migrated on open; the old row has no idle TTL.
func TestMigrateIdleColumns(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s, _ := migratedFrom(t, db, 1, insertOld)
		got, err := s.GetSandboxAny(t.Context(), "old")
		if err != nil {
			t.Fatal(err)
		}
		if got.IdleTTL != 0 || !got.LastActiveAt.IsZero() {
			t.Errorf("migrated row: idle TTL %v, last active %v; want 0, zero", got.IdleTTL, got.LastActiveAt)
		}
	})
}

func TestIdleTTLRoundTrip(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")
		sb := newSandbox("idle", tn, 0)
		sb.IdleTTL = 90 * time.Second
		sb.LastActiveAt = base
		if err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSandbox(ctx, tn, "idle")
		if err != nil {
			t.Fatal(err)
		}
		if got.IdleTTL != 90*time.Second || !got.LastActiveAt.Equal(base) {
			t.Errorf("got idle TTL %v, last active %v; want 90s, %v", got.IdleTTL, got.LastActiveAt, base)
		}
		bad := newSandbox("neg", tn, 0)
		bad.IdleTTL = -time.Second
		if err := s.InsertSandbox(ctx, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("InsertSandbox(negative idle TTL) = %v; want ErrInvalid", err)
		}
	})
}

// TestTouchSandbox: a touch moves last_active_at forwards only and bumps
// neither generation nor updated_at, so a writer holding the generation it
// read still succeeds, and its older last_active_at does not undo the touch.
func TestTouchSandbox(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")
		sb := newSandbox("t1", tn, 0)
		sb.IdleTTL = time.Minute
		if err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		read, err := s.GetSandbox(ctx, tn, "t1") // a writer's copy, generation 1
		if err != nil {
			t.Fatal(err)
		}

		t1 := base.Add(10 * time.Second)
		if err := s.TouchSandbox(ctx, "t1", t1); err != nil {
			t.Fatal(err)
		}
		if err := s.TouchSandbox(ctx, "t1", base.Add(5*time.Second)); err != nil { // older: ignored
			t.Fatal(err)
		}
		got, _ := s.GetSandbox(ctx, tn, "t1")
		if got.Generation != 1 || !got.UpdatedAt.Equal(sb.UpdatedAt) || !got.LastActiveAt.Equal(t1) {
			t.Errorf("after touches: generation %d, updated %v, last active %v; want 1, %v, %v",
				got.Generation, got.UpdatedAt, got.LastActiveAt, sb.UpdatedAt, t1)
		}

		read.EndAt = read.EndAt.Add(time.Minute)
		if err := s.UpdateSandbox(ctx, &read); err != nil {
			t.Fatalf("UpdateSandbox after a touch = %v; want nil (touches do not bump generation)", err)
		}
		got, _ = s.GetSandbox(ctx, tn, "t1")
		if got.Generation != 2 || !got.LastActiveAt.Equal(t1) {
			t.Errorf("after update: generation %d, last active %v; want 2, %v (kept)", got.Generation, got.LastActiveAt, t1)
		}

		if err := s.TouchSandbox(ctx, "nope", t1); !errors.Is(err, ErrNotFound) {
			t.Errorf("TouchSandbox(missing) = %v; want ErrNotFound", err)
		}
		got.State = StateKilled
		if err := s.UpdateSandbox(ctx, &got); err != nil {
			t.Fatal(err)
		}
		if err := s.TouchSandbox(ctx, "t1", t1.Add(time.Second)); !errors.Is(err, ErrNotFound) {
			t.Errorf("TouchSandbox(killed) = %v; want ErrNotFound", err)
		}
	})
}

func TestListIdle(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")
		add := func(id string, ttl time.Duration, last time.Time, st State) {
			sb := newSandbox(id, tn, 0) // started at base
			sb.IdleTTL, sb.LastActiveAt, sb.State = ttl, last, st
			if err := s.InsertSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		add("a", time.Minute, base, StateRunning)                     // idle at base+1m
		add("b", time.Minute, base.Add(30*time.Second), StateRunning) // idle at base+1m30s
		add("c", 0, time.Time{}, StateRunning)                        // no TTL
		add("d", time.Minute, base, StatePaused)                      // not running
		add("e", time.Minute, time.Time{}, StateRunning)              // never touched: from its start
		for _, tc := range []struct {
			at   time.Time
			want []string
		}{
			{base.Add(59 * time.Second), nil},
			{base.Add(time.Minute), []string{"a", "e"}},
			{base.Add(2 * time.Minute), []string{"a", "b", "e"}},
		} {
			sbs, err := s.ListIdle(ctx, tc.at)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, sb := range sbs {
				ids = append(ids, sb.ID)
			}
			if len(ids) != len(tc.want) || (len(ids) > 0 && fmtIDs(ids) != fmtIDs(tc.want)) {
				t.Errorf("ListIdle(%v) = %v; want %v", tc.at.Sub(base), ids, tc.want)
			}
		}
	})
}

func fmtIDs(ids []string) string {
	out := ""
	for _, id := range ids {
		out += id + ","
	}
	return out
}
