package store

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"
)

// migrationFS holds the schema migrations, NNNN_name.sql, applied in order of
// NNNN: SQLite's in migrations, PostgreSQL's in migrations/postgres, each
// version in both. A migration, once released, is never edited: changes go
// in a new file (a new pair).
//
//go:embed migrations/*.sql migrations/postgres/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns dialect d's embedded migrations sorted by version.
// Versions increase but may leave gaps: branches developed side by side
// reserve their numbers, and migrate applies a gap's migration when it
// arrives.
func migrations(d dialect) ([]migration, error) {
	names, err := fs.Glob(migrationFS, d.migrationDir()+"/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, p := range names { // fs.Glob sorts, and versions are zero-padded
		base := path.Base(p)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: name is not NNNN_name.sql", base)
		}
		if v < 1 || (len(ms) > 0 && v <= ms[len(ms)-1].version) {
			return nil, fmt.Errorf("migration %s: version %d does not follow %d", base, v, lastVersion(ms))
		}
		b, err := migrationFS.ReadFile(p)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: strings.TrimSuffix(base, ".sql"), sql: string(b)})
	}
	return ms, nil
}

// migrate applies the pending migrations in one write transaction, so a
// failure leaves the schema as it was and two processes opening a new
// database at once apply each migration exactly once. A database migrated by
// a newer sandboxd is refused rather than misread.
func (s *Store) migrate(ctx context.Context) error {
	ms, err := migrations(s.dialect)
	if err != nil {
		return err
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.dialect.schemaMigrationsDDL()); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		applied, err := appliedVersions(ctx, tx)
		if err != nil {
			return err
		}
		for v := range applied {
			if v > lastVersion(ms) {
				return fmt.Errorf("schema version %d is newer than this sandboxd knows (%d): upgrade sandboxd", v, lastVersion(ms))
			}
		}
		for _, m := range ms {
			if applied[m.version] {
				continue
			}
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			if _, err := tx.ExecContext(ctx,
				`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
				m.version, m.name, unixNano(time.Now())); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
		}
		return nil
	})
}

func lastVersion(ms []migration) int {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].version
}

// appliedVersions reads which migrations tx's database has.
func appliedVersions(ctx context.Context, tx *sql.Tx) (map[int]bool, error) {
	rows, err := tx.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read schema versions: %w", err)
	}
	defer rows.Close()
	out := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read schema versions: %w", err)
		}
		out[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read schema versions: %w", err)
	}
	return out, nil
}

// SchemaVersion returns the version of the newest migration applied.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.r.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}
