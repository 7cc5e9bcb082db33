package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// writeLockKey is the PostgreSQL advisory lock every write transaction takes
// first (pg_advisory_xact_lock, released at commit or rollback). It makes
// PostgreSQL's writers what SQLite's are: one at a time, across every
// sandboxd sharing the database, so the store's read-then-write
// transactions (generation checks, quotas, migrations) stay atomic under
// READ COMMITTED. The value is arbitrary ("sandboxd" in ASCII), fixed so
// that every process takes the same lock.
const writeLockKey int64 = 0x73616e64626f7864

// OpenPostgres opens the PostgreSQL database named by dsn (a postgres:// URL or key=value DSN)
// and brings its schema up to date.
func OpenPostgres(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's error leaves the password out.
		return nil, fmt.Errorf("open store: %w: %v", ErrInvalid, err)
	}
	where := fmt.Sprintf("postgres %s:%d/%s", cfg.Host, cfg.Port, cfg.Database)

	// One writer connection, as with SQLite: writes are serialised by
	// writeLockKey anyway, and a second connection would only wait on the
	// lock while holding a server slot. A writer waits for another
	// process's lock no longer than SQLite's busy handler would.
	w := openPG(cfg, "lock_timeout", strconv.FormatInt(busyTimeout.Milliseconds(), 10))
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	// Readers cannot write by mistake, like SQLite's query_only ones.
	r := openPG(cfg, "default_transaction_read_only", "on")
	// A server restart or failover drops connections; recycling them keeps
	// a pool from holding only stale ones for long.
	for _, db := range []*sql.DB{w, r} {
		db.SetConnMaxIdleTime(5 * time.Minute)
		db.SetConnMaxLifetime(time.Hour)
	}

	return (&Store{dialect: postgresDialect, w: w, r: r}).start(ctx, where)
}

// openPG opens a pool on cfg with one more run-time parameter, unless the
// DSN sets it.
func openPG(cfg *pgx.ConnConfig, param, value string) *sql.DB {
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if _, ok := cfg.RuntimeParams[param]; !ok {
		cfg.RuntimeParams[param] = value
	}
	return sql.OpenDB(pgConnector{stdlib.GetConnector(*cfg)})
}

// pgCode returns the SQLSTATE of a PostgreSQL error, or "".
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// SQLSTATEs the store maps to its errors.
const (
	pgUniqueViolation     = "23505"
	pgForeignKeyViolation = "23503"
)
