// Package pgtest gives tests a PostgreSQL database of their own: a fresh
// schema on the server named by $SANDBOXD_TEST_POSTGRES (scripts/postgres.sh
// up starts one and prints its DSN), dropped when the test ends. The store's
// tests use it for their PostgreSQL variants, storetest for the packages
// above the store.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Env names the server's DSN. Unset, PostgreSQL tests skip; set, they run,
// and a server that does not answer fails them.
const Env = "SANDBOXD_TEST_POSTGRES"

// Enabled reports whether Env is set.
func Enabled() bool { return os.Getenv(Env) != "" }

// DSN creates a new schema on the server of $SANDBOXD_TEST_POSTGRES and
// returns a DSN whose connections use it (search_path), for tb only: the
// schema is dropped, with everything in it, at tb's cleanup. Register that
// cleanup before closing what uses the DSN, so that closing comes first.
// Without the variable, tb is skipped.
func DSN(tb testing.TB) string {
	tb.Helper()
	base := os.Getenv(Env)
	if base == "" {
		tb.Skip("PostgreSQL variant: set " + Env + " to a server's DSN (scripts/postgres.sh up starts one and prints it)")
	}
	b := make([]byte, 8)
	rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	exec(tb, base, "CREATE SCHEMA "+schema)
	tb.Cleanup(func() { exec(tb, base, "DROP SCHEMA "+schema+" CASCADE") })
	return withSearchPath(tb, base, schema)
}

// exec runs one statement on its own connection to dsn.
func exec(tb testing.TB, dsn, stmt string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatalf("%s (%s): %v", Env, stmt, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, stmt); err != nil {
		tb.Fatalf("%s: %v", stmt, err)
	}
}

// withSearchPath returns dsn, a URL or key=value DSN, with search_path set
// to schema: pgx sends parameters it does not know to the server as run-time
// parameters.
func withSearchPath(tb testing.TB, dsn, schema string) string {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " search_path=" + schema
	}
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatalf("%s: %v", Env, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
