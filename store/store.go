// Package store is sandboxd's durable state: tenants and their settings,
// hashed API keys, templates, volumes, and one row per sandbox with its
// lifecycle. It is the input of boot reconcile: after a crash, every live
// sandbox is still listed here.
//
// It speaks two SQL dialects, with the same methods, errors and semantics:
//
//   - SQLite (Open), the default: <data-dir>/sandboxd.db, embedded
//     (modernc.org/sqlite, no cgo), nothing to run beside sandboxd. For a
//     single host.
//   - PostgreSQL (OpenPostgres): for several sandboxd, on different hosts,
//     sharing one state (see the HA docs). Driven by pgx through
//     database/sql.
//
// Several processes may open the same database at once (a running server
// and a CLI command such as "sandboxd keys create", or several servers).
// Writers are serialised across all of them, so a write transaction's reads
// and writes are atomic together: with SQLite the file runs in WAL mode
// (readers never block the writer), each Store sends all its writes through
// a single connection, and every write transaction starts with BEGIN
// IMMEDIATE, so a writer that has to wait for another process waits in
// SQLite's busy handler (up to busyTimeout) instead of failing with
// "database is locked". With PostgreSQL every write transaction first takes
// one advisory lock (writeLockKey), and readers use a pool of their own.
//
// Queries are written once with ? placeholders; dialect.go holds what
// differs.
//
// Errors that callers branch on wrap ErrNotFound, ErrConflict or ErrInvalid;
// test them with errors.Is.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sandboxd/sandboxd/errdefs"
)

// FileName is the database's name inside the data directory.
const FileName = "sandboxd.db"

// busyTimeout is how long a connection waits for another connection's lock
// (typically the other process's write transaction) before giving up.
const busyTimeout = 10 * time.Second

// Errors wrapped by the store's methods. They are the errdefs kinds, so the
// surfaces map a store failure to a status without knowing the store.
var (
	// ErrNotFound: no such tenant, key or sandbox, or not one the caller's
	// tenant owns.
	ErrNotFound = errdefs.ErrNotFound
	// ErrConflict: the name or id is taken, or a sandbox's generation moved
	// since the caller read it.
	ErrConflict = errdefs.ErrConflict
	// ErrInvalid: an argument failed validation (name, id, state, settings,
	// cursor).
	ErrInvalid = errdefs.ErrInvalidArgument
	// ErrQuota: a tenant's quota does not allow it (volumes).
	ErrQuota = errdefs.ErrResourceExhausted
)

// Store is an open sandboxd database. It is safe for concurrent use.
type Store struct {
	dialect dialect
	path    string // the SQLite file; "" with PostgreSQL
	// w holds exactly one connection: all writes of this process queue on
	// it, and its transactions take the write lock up front (BEGIN
	// IMMEDIATE, or the advisory lock).
	w *sql.DB
	// r holds read-only connections; they read concurrently with the writer
	// and with each other.
	r *sql.DB
	// stmts are the request path's queries, prepared (stmts.go).
	stmts *stmts
}

// Open opens, creating it if needed, the database in dataDir (created with
// mode 0700 if missing) and brings its schema up to date. Close it when done.
func Open(ctx context.Context, dataDir string) (*Store, error) {
	if dataDir == "" {
		return nil, fmt.Errorf("open store: %w: empty data dir", ErrInvalid)
	}
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	path := filepath.Join(dir, FileName)
	// The database holds envd access tokens and sandbox env vars: create it
	// private. SQLite gives the -wal and -shm files the database's mode.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}

	w, err := openDB(path, false)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	if err := setWAL(ctx, w); err != nil {
		w.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}

	r, err := openDB(path, true)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return (&Store{path: path, w: w, r: r}).start(ctx, path)
}

// start sizes the reader pool of s, whose pools are open, brings the schema
// up to date and prepares the statements; on failure it closes s. where
// names the database in the error.
func (s *Store) start(ctx context.Context, where string) (*Store, error) {
	n := max(4, runtime.GOMAXPROCS(0))
	s.r.SetMaxOpenConns(n)
	s.r.SetMaxIdleConns(n)
	err := s.migrate(ctx)
	if err == nil {
		s.stmts, err = prepareStmts(ctx, s.w, s.r)
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("open store %s: %w", where, err)
	}
	return s, nil
}

// setWAL switches the file to WAL, a persistent setting. Not a pragma of the
// DSN: the switch needs an exclusive lock, and SQLite answers SQLITE_BUSY at
// once, without its busy handler, while another process opening the same new
// database holds a lock; so the switch is retried here, up to busyTimeout.
func setWAL(ctx context.Context, w *sql.DB) error {
	deadline := time.Now().Add(busyTimeout)
	for {
		_, err := w.ExecContext(ctx, "PRAGMA journal_mode=WAL")
		if err == nil || sqliteCode(err)&0xff != sqlite3.SQLITE_BUSY || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// openDB opens a connection pool on path. Writer connections use
// synchronous=NORMAL (Open switches the file to WAL first): in WAL mode a
// commit survives a crash of the process (SIGKILL) and the database stays
// consistent on power loss, which may drop the last few commits; boot
// reconcile copes with that. Reader connections are query_only.
func openDB(path string, readOnly bool) (*sql.DB, error) {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "foreign_keys(1)")
	if readOnly {
		q.Add("_pragma", "query_only(1)")
	} else {
		q.Add("_pragma", "synchronous(NORMAL)")
		q.Set("_txlock", "immediate")
	}
	// A file: URI, so that '?' or '#' in the path cannot be taken for the
	// query; SQLite percent-decodes the path.
	dsn := "file:" + (&url.URL{Path: filepath.ToSlash(path)}).EscapedPath() + "?" + q.Encode()
	c, err := sqlite.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

// Path returns the database file's absolute path; "" for PostgreSQL.
func (s *Store) Path() string { return s.path }

// Close closes the database. Operations in flight fail or finish first.
func (s *Store) Close() error {
	if s.stmts != nil {
		s.stmts.close()
	}
	return errors.Join(s.r.Close(), s.w.Close())
}

// write runs fn in a write transaction (BEGIN IMMEDIATE, or the advisory
// lock, on the single writer connection) and commits it if fn returns nil. fn
// must not call other Store methods that write: the writer connection is
// taken.
func (s *Store) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if s.dialect == postgresDialect {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(`+strconv.FormatInt(writeLockKey, 10)+`)`); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("take the write lock: %w", err)
		}
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback() // the error from fn is the one to report
		return err
	}
	return tx.Commit()
}

// writeStmt runs st, a statement prepared on the writer, as a write of its
// own. On SQLite the statement is its own transaction (autocommit), with
// two statements fewer than write's BEGIN IMMEDIATE … COMMIT on every
// create's and kill's way; it is as safe with other processes: a write
// statement's first step takes the write lock before it reads anything
// (SQLite's OP_Transaction), waiting in the busy handler, as BEGIN
// IMMEDIATE does. On PostgreSQL it goes through write, under the advisory
// write lock.
func (s *Store) writeStmt(ctx context.Context, st *sql.Stmt, args ...any) (sql.Result, error) {
	if s.dialect != postgresDialect {
		return st.ExecContext(ctx, args...)
	}
	var res sql.Result
	err := s.write(ctx, func(tx *sql.Tx) error {
		var err error
		res, err = tx.StmtContext(ctx, st).ExecContext(ctx, args...)
		return err
	})
	return res, err
}

// sqliteCode returns the extended result code of a SQLite error, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

// isUniqueViolation reports whether err is a PRIMARY KEY or UNIQUE violation.
func isUniqueViolation(err error) bool {
	c := sqliteCode(err)
	return c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || c == sqlite3.SQLITE_CONSTRAINT_UNIQUE ||
		pgCode(err) == pgUniqueViolation
}

// isForeignKeyViolation reports whether err is a FOREIGN KEY violation.
func isForeignKeyViolation(err error) bool {
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY || pgCode(err) == pgForeignKeyViolation
}

// Times are stored as Unix nanoseconds and read back in UTC.

func unixNano(t time.Time) int64 { return t.UnixNano() }

func fromUnixNano(n int64) time.Time { return time.Unix(0, n).UTC() }

func nullTime(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return fromUnixNano(n.Int64)
}

// validTime reports whether t can be stored: not zero and within the range of
// Unix nanoseconds (years 1678 to 2262).
func validTime(t time.Time) bool {
	return !t.IsZero() && t.Year() > 1678 && t.Year() < 2262
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// nullString stores "" as NULL.
func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
