// Package storetest opens stores for the tests of the packages above the
// store (server, mcp): a fresh one per test, with tenants and their keys.
// They are SQLite's, or, with SANDBOXD_TEST_STORE=postgres and
// SANDBOXD_TEST_POSTGRES set (see package pgtest), PostgreSQL's, to run
// those packages' tests on the other dialect.
package storetest

import (
	"context"
	"os"
	"testing"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/store/pgtest"
	"github.com/sandboxd/sandboxd/tenant"
)

// DialectEnv chooses the dialect of Open's stores: "postgres" for
// PostgreSQL (with pgtest.Env set); anything else, SQLite.
const DialectEnv = "SANDBOXD_TEST_STORE"

// Open opens a fresh store, closed at cleanup: in a temporary directory of
// t, or in a schema of its own (see DialectEnv). The tenants named get an
// API key each: keys maps tenant to key.
func Open(t testing.TB, tenants ...string) (st *store.Store, keys map[string]string) {
	t.Helper()
	ctx := context.Background()
	var err error
	if os.Getenv(DialectEnv) == "postgres" && pgtest.Enabled() {
		st, err = store.OpenPostgres(ctx, pgtest.DSN(t))
	} else {
		st, err = store.Open(ctx, t.TempDir())
	}
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
