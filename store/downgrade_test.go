package store

import (
	"strconv"
	"testing"

	"github.com/sandboxd/sandboxd/tenant"
)

// undoMigration lists, per schema version, the statements that take a
// database back to the version before it. A test of a migration downgrades
// a fresh database with downgrade and reopens it; adding a migration means
// adding its undo here, not editing every older migration's test.
var undoMigration = map[int][]string{
	2: {
		`ALTER TABLE sandboxes DROP COLUMN idle_ttl`,
		`ALTER TABLE sandboxes DROP COLUMN last_active_at`,
	},
	3: {
		`ALTER TABLE tenants DROP COLUMN lifecycle_rate`,
		`ALTER TABLE tenants DROP COLUMN lifecycle_burst`,
		`ALTER TABLE tenants DROP COLUMN read_rate`,
		`ALTER TABLE tenants DROP COLUMN read_burst`,
		`ALTER TABLE tenants DROP COLUMN dataplane_rate`,
		`ALTER TABLE tenants DROP COLUMN dataplane_burst`,
	},
	4: {
		`DROP TABLE template_tags`,
		`DROP TABLE template_builds`,
		`DROP TABLE templates`,
	},
	5: {
		`ALTER TABLE tenants DROP COLUMN build_cpu`,
		`ALTER TABLE tenants DROP COLUMN build_memory_mb`,
		`ALTER TABLE tenants DROP COLUMN build_disk_mb`,
		`ALTER TABLE tenants DROP COLUMN build_timeout_s`,
	},
	6: {
		`ALTER TABLE templates DROP COLUMN snapshot_of`,
	},
	7: {
		`DROP TABLE sandbox_volumes`,
		`DROP TABLE volumes`,
		`ALTER TABLE tenants DROP COLUMN max_volumes`,
		`ALTER TABLE tenants DROP COLUMN max_volumes_mb`,
		`ALTER TABLE tenants DROP COLUMN volume_size_mb`,
	},
	8: {
		`ALTER TABLE sandboxes DROP COLUMN timeout_ms`,
	},
	9: {
		`ALTER TABLE volumes DROP COLUMN deleting_at`,
	},
	10: {
		`DROP TABLE layer_removals`,
	},
}

// downgrade takes s's schema back to version to.
func downgrade(t *testing.T, s *Store, to int) {
	t.Helper()
	from, err := s.SchemaVersion(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	known := map[int]bool{}
	ms, err := migrations(s.dialect)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		known[m.version] = true
	}
	for v := from; v > to; v-- {
		if !known[v] {
			continue // a gap: another branch's number
		}
		undo, ok := undoMigration[v]
		if !ok {
			t.Fatalf("no undo for schema version %d: add it to undoMigration", v)
		}
		for _, q := range append(undo, `DELETE FROM schema_migrations WHERE version = `+strconv.Itoa(v)) {
			if _, err := s.w.ExecContext(t.Context(), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
}

// latestSchema is the version every open migrates to (the same in both
// dialects: TestMigrationsMatch).
func latestSchema(t *testing.T) int {
	t.Helper()
	ms, err := migrations(sqliteDialect)
	if err != nil {
		t.Fatal(err)
	}
	return lastVersion(ms)
}

// migratedFrom creates tenant acme in a fresh store of db, lets fill add
// rows, takes the schema back to version to and reopens the store, which
// migrates it to the latest version again (checked). The reopened store is
// closed when the test ends.
func migratedFrom(t *testing.T, db testDB, to int, fill func(t *testing.T, s *Store, tn tenant.ID)) (*Store, tenant.ID) {
	t.Helper()
	s, err := db.open(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tn := mustTenant(t, s, "acme")
	fill(t, s, tn)
	downgrade(t, s, to)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = db.store(t)
	if v, err := s.SchemaVersion(t.Context()); err != nil || v != latestSchema(t) {
		t.Fatalf("SchemaVersion() = %d, %v; want %d", v, err, latestSchema(t))
	}
	return s, tn
}

// insertOld is a fill of migratedFrom: sandbox "old" of tn.
func insertOld(t *testing.T, s *Store, tn tenant.ID) {
	if err := s.InsertSandbox(t.Context(), newSandbox("old", tn, 0)); err != nil {
		t.Fatal(err)
	}
}
