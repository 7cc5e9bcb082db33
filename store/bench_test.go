package store

import (
	"fmt"
	"testing"
)

// BenchmarkCreateKillQueries runs the store's share of one cold create and
// one kill through the API: the key lookup of each request, the row's
// insert at admission, its update once the sandbox runs, the proxy's read
// of it, and the update that marks it killed.
func BenchmarkCreateKillQueries(b *testing.B) {
	for _, d := range testDialects {
		b.Run(d.name, func(b *testing.B) { benchCreateKill(b, d.fresh(b).store(b)) })
	}
}

func benchCreateKill(b *testing.B, s *Store) {
	ctx := b.Context()
	tn := mustTenant(b, s, "acme")
	key, _, err := s.CreateKey(ctx, tn)
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		i++
		if _, err := s.LookupKey(ctx, key); err != nil {
			b.Fatal(err)
		}
		sb := newSandbox(fmt.Sprintf("i%07d", i), tn, i)
		sb.State = StateCreating
		if err := s.InsertSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
		sb.State = StateRunning
		if err := s.UpdateSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
		if _, err := s.GetSandboxAny(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		if _, err := s.LookupKey(ctx, key); err != nil {
			b.Fatal(err)
		}
		sb.State = StateKilled
		if err := s.UpdateSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
	}
}
