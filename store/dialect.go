package store

import (
	"context"
	"database/sql/driver"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/stdlib"
)

// dialect is the SQL flavour of a Store's database. The queries are written
// once, in the SQL both understand, with ? placeholders; the few places that
// differ ask the dialect.
type dialect uint8

const (
	sqliteDialect dialect = iota
	postgresDialect
)

// migrationDir is where the dialect's migrations are embedded: the same
// versions and names in each, the DDL translated.
func (d dialect) migrationDir() string {
	if d == postgresDialect {
		return "migrations/postgres"
	}
	return "migrations"
}

// schemaMigrationsDDL creates the table of applied migrations.
func (d dialect) schemaMigrationsDDL() string {
	if d == postgresDialect {
		return `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    BIGINT PRIMARY KEY,
			name       TEXT   NOT NULL,
			applied_at BIGINT NOT NULL
		)`
	}
	return `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER PRIMARY KEY,
			name       TEXT    NOT NULL,
			applied_at INTEGER NOT NULL
		) STRICT`
}

// metadataMatch is a condition on a sandboxes row, with two placeholders
// (key, value): the row's metadata object has that key with that string
// value. Both forms take the key as a value, not a JSON path, so any key
// works without quoting.
func (d dialect) metadataMatch() string {
	if d == postgresDialect {
		// Containment of a one-pair object: a string value only matches a
		// string, as json_each's type check below.
		return `sandboxes.metadata::jsonb @> jsonb_build_object(CAST(? AS TEXT), CAST(? AS TEXT))`
	}
	return `EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) AS m
			WHERE m.key = ? AND m.type = 'text' AND m.value = ?)`
}

// laterOf is the later of column col (a nullable Unix nanoseconds column)
// and the value of the two placeholders (given the same value, possibly
// NULL): the value when col is NULL, col when the value is NULL. SQLite's
// two-argument MAX is NULL if either is, PostgreSQL's GREATEST ignores
// NULLs; a CASE means the same in both.
func laterOf(col string) string {
	return `CASE WHEN ` + col + ` IS NULL OR ? > ` + col + ` THEN ? ELSE ` + col + ` END`
}

// rebind rewrites q's ? placeholders as PostgreSQL's $1, $2, ...; a ? inside
// a quoted string or identifier or a comment stays.
func rebind(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); {
		var end int // q[i:end] is copied as is
		switch c := q[i]; {
		case c == '\'' || c == '"':
			end = closing(q, i+1, string(c))
		case strings.HasPrefix(q[i:], "--"):
			end = closing(q, i+2, "\n")
		case strings.HasPrefix(q[i:], "/*"):
			end = closing(q, i+2, "*/")
		case c == '?':
			n++
			b.WriteString("$" + strconv.Itoa(n))
			i++
			continue
		default:
			end = i + 1
		}
		b.WriteString(q[i:end])
		i = end
	}
	return b.String()
}

// closing returns the index just after the first delim in q at or after
// from, or len(q). A quote doubled inside a string, its escape, reads as
// the string's end followed by a new string, which comes to the same.
func closing(q string, from int, delim string) int {
	if j := strings.Index(q[from:], delim); j >= 0 {
		return from + j + len(delim)
	}
	return len(q)
}

// pgConnector hands database/sql pgx connections whose queries are rebound:
// the one place where the store's ? queries become PostgreSQL's, for every
// path (pools, transactions, prepared statements).
type pgConnector struct{ driver.Connector }

func (c pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return pgConn{conn.(*stdlib.Conn)}, nil
}

// pgConn is a pgx connection taking ? placeholders. Embedding the concrete
// type keeps every optional driver interface it implements (session reset,
// named value checks, ping, BeginTx).
type pgConn struct{ *stdlib.Conn }

func (c pgConn) Prepare(q string) (driver.Stmt, error) { return c.Conn.Prepare(rebind(q)) }

func (c pgConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.PrepareContext(ctx, rebind(q))
}

func (c pgConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.ExecContext(ctx, rebind(q), args)
}

func (c pgConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, rebind(q), args)
}
