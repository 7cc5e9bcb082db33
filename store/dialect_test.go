package store

import (
	"context"
	"testing"

	"github.com/sandboxd/sandboxd/store/pgtest"
)

// testDB is where a test's stores live: a directory for SQLite, a schema of
// its own for PostgreSQL. Every open of it reaches the same database.
type testDB struct {
	dialect dialect
	dir     string // SQLite
	dsn     string // PostgreSQL
}

// testDialects are the dialects the tests run on, each a subtest's name
// and how to make a fresh database. PostgreSQL's skips without
// SANDBOXD_TEST_POSTGRES (package pgtest).
var testDialects = []struct {
	name  string
	fresh func(tb testing.TB) testDB
}{
	{"sqlite", func(tb testing.TB) testDB { return testDB{dialect: sqliteDialect, dir: tb.TempDir()} }},
	{"postgres", func(tb testing.TB) testDB { return testDB{dialect: postgresDialect, dsn: pgtest.DSN(tb)} }},
}

// forEachDialect runs fn in a subtest per dialect, each with a fresh
// database.
func forEachDialect(t *testing.T, fn func(t *testing.T, db testDB)) {
	for _, d := range testDialects {
		t.Run(d.name, func(t *testing.T) { fn(t, d.fresh(t)) })
	}
}

// open opens a Store on db; the caller closes it.
func (db testDB) open(ctx context.Context) (*Store, error) {
	if db.dialect == postgresDialect {
		return OpenPostgres(ctx, db.dsn)
	}
	return Open(ctx, db.dir)
}

// store opens a Store on db and closes it when the test ends.
func (db testDB) store(tb testing.TB) *Store {
	tb.Helper()
	s, err := db.open(tb.Context())
	if err != nil {
		tb.Fatalf("open %s%s = %v", db.dir, db.dsn, err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close() = %v", err)
		}
	})
	return s
}

func TestRebind(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`a = ? AND b IN (?, ?)`, `a = $1 AND b IN ($2, $3)`},
		{`x = '?' AND y = ? -- z?` + "\n" + `AND w = ?`, `x = '?' AND y = $1 -- z?` + "\n" + `AND w = $2`},
		{`"a?" = ? /* ? */ AND 'it''s?' = ?`, `"a?" = $1 /* ? */ AND 'it''s?' = $2`},
		{`x = '?`, `x = '?`},
		{`m::jsonb @> jsonb_build_object(CAST(? AS TEXT), ?)`, `m::jsonb @> jsonb_build_object(CAST($1 AS TEXT), $2)`},
	} {
		if got := rebind(tc.in); got != tc.want {
			t.Errorf("rebind(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

// TestMigrationsMatch: each dialect has the same migrations, by version and
// name.
func TestMigrationsMatch(t *testing.T) {
	lite, err := migrations(sqliteDialect)
	if err != nil {
		t.Fatal(err)
	}
	pg, err := migrations(postgresDialect)
	if err != nil {
		t.Fatal(err)
	}
	if len(lite) != len(pg) {
		t.Fatalf("%d SQLite migrations, %d PostgreSQL ones", len(lite), len(pg))
	}
	for i := range lite {
		if lite[i].version != pg[i].version || lite[i].name != pg[i].name {
			t.Errorf("migration #%d: SQLite's %s, PostgreSQL's %s", i, lite[i].name, pg[i].name)
		}
	}
}

// TestPostgresTextCollation: every text column of the PostgreSQL schema
// orders bytewise (COLLATE "C"), as SQLite's do, whatever the database's
// default collation: listings by id or name and their pages depend on it.
func TestPostgresTextCollation(t *testing.T) {
	s := testDB{dialect: postgresDialect, dsn: pgtest.DSN(t)}.store(t)
	rows, err := s.r.QueryContext(t.Context(), `SELECT table_name, column_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND data_type = 'text' AND table_name != 'schema_migrations'
		AND collation_name IS DISTINCT FROM 'C'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var table, col string
		if err := rows.Scan(&table, &col); err != nil {
			t.Fatal(err)
		}
		t.Errorf("%s.%s: not COLLATE \"C\"", table, col)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}
