package store

import (
	"errors"
	"testing"
	"time"
)

// TestSandboxTimeout: a sandbox's own timeout is stored at insert and kept
// by updates (they move end_at only); a row from before schema 8 has none.
func TestSandboxTimeout(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s, tn := migratedFrom(t, db, 7, insertOld)
		if got, err := s.GetSandboxAny(t.Context(), "old"); err != nil || got.Timeout != 0 {
			t.Fatalf("migrated row: timeout %v, %v; want 0", got.Timeout, err)
		}

		sb := newSandbox("new", tn, 1)
		sb.Timeout = 90*time.Second + 250*time.Millisecond
		if err := s.InsertSandbox(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
		sb.EndAt = sb.EndAt.Add(time.Hour)
		sb.Timeout = time.Second // ignored: the stored timeout never changes
		if err := s.UpdateSandbox(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSandboxAny(t.Context(), "new")
		if err != nil {
			t.Fatal(err)
		}
		if want := 90*time.Second + 250*time.Millisecond; got.Timeout != want {
			t.Errorf("timeout after update = %v; want %v", got.Timeout, want)
		}

		bad := newSandbox("bad", tn, 2)
		bad.Timeout = -time.Second
		if err := s.InsertSandbox(t.Context(), bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("insert with a negative timeout = %v; want ErrInvalid", err)
		}
	})
}
