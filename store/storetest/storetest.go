// Package storetest opens stores for the tests of the packages above the
// store (server, mcp): a fresh one per test, with tenants and their keys.
package storetest

import (
	"context"
	"testing"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Open opens a store in a temporary directory of t, closed at cleanup,
// with the tenants named, each with an API key: keys maps tenant to key.
func Open(t testing.TB, tenants ...string) (st *store.Store, keys map[string]string) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	keys = map[string]string{}
	for _, name := range tenants {
		if _, err := st.EnsureTenant(ctx, name); err != nil {
			t.Fatal(err)
		}
		key, _, err := st.CreateKey(ctx, tenant.ID(name))
		if err != nil {
			t.Fatal(err)
		}
		keys[name] = key
	}
	return st, keys
}
