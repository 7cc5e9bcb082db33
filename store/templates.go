package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

// Template is a template built through E2B's template API. Its name is
// unique within its tenant; other tenants see it only when it is public.
type Template struct {
	ID       string
	Tenant   tenant.ID
	Name     string
	Public   bool
	CPUCount int // 0: the server's default
	MemoryMB int // 0: the server's default
	// SnapshotOf is the sandbox the template's newest build was taken
	// from when it is a snapshot (E2B's snapshot template); "" when built.
	SnapshotOf string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// BuildStatus is where a template build is.
type BuildStatus string

const (
	BuildWaiting  BuildStatus = "waiting" // requested, steps not sent yet
	BuildBuilding BuildStatus = "building"
	BuildReady    BuildStatus = "ready"
	BuildError    BuildStatus = "error"
)

// Finished reports whether a build in s has ended, well or not.
func (s BuildStatus) Finished() bool { return s == BuildReady || s == BuildError }

// Build is one build of a template. Result and Logs are the builder's JSON.
type Build struct {
	ID         string
	TemplateID string
	Status     BuildStatus
	Reason     string
	ReasonStep string
	Result     []byte
	Logs       []byte
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Tag points a template's tag at one of its builds.
type Tag struct {
	Tag       string
	BuildID   string
	CreatedAt time.Time
}

const templateCols = `id, tenant_id, name, public, cpu_count, memory_mb, created_at, updated_at, snapshot_of`
const buildCols = `id, template_id, status, reason, reason_step, result, logs, created_at, updated_at`

func scanTemplate(row rowScanner) (Template, error) {
	var (
		t        Template
		pub      int
		cre, upd int64
		snap     sql.NullString
	)
	if err := row.Scan(&t.ID, &t.Tenant, &t.Name, &pub, &t.CPUCount, &t.MemoryMB, &cre, &upd, &snap); err != nil {
		return Template{}, err
	}
	t.Public, t.SnapshotOf = pub != 0, snap.String
	t.CreatedAt, t.UpdatedAt = fromUnixNano(cre), fromUnixNano(upd)
	return t, nil
}

func scanBuild(row rowScanner) (Build, error) {
	var (
		b        Build
		result   sql.NullString
		logs     string
		cre, upd int64
	)
	if err := row.Scan(&b.ID, &b.TemplateID, &b.Status, &b.Reason, &b.ReasonStep, &result, &logs, &cre, &upd); err != nil {
		return Build{}, err
	}
	if result.Valid {
		b.Result = []byte(result.String)
	}
	b.Logs = []byte(logs)
	b.CreatedAt, b.UpdatedAt = fromUnixNano(cre), fromUnixNano(upd)
	return b, nil
}

// RequestBuild records a new build, waiting, of the tenant's template named
// t.Name: the template is created with t's id, visibility and resources if
// the tenant has none of that name, else it is the existing one (its
// resources updated to t's). It returns the template as stored.
func (s *Store) RequestBuild(ctx context.Context, t Template, buildID string, now time.Time) (Template, error) {
	t.SnapshotOf = ""
	return s.addBuild(ctx, t, buildID, BuildWaiting, nil, now)
}

// StartCommit is RequestBuild for a build made of a sandbox's files (a
// snapshot, or a publish of its changes): the build is "building" while
// they are taken, with its result already (what it will be: a build of
// steps has none until it is ready, which tells the two apart after a
// crash), and with t.SnapshotOf set the template, new or existing,
// becomes a snapshot of that sandbox. FinishCommit makes the build ready.
func (s *Store) StartCommit(ctx context.Context, t Template, buildID string, result []byte, now time.Time) (Template, error) {
	if result == nil {
		return Template{}, fmt.Errorf("start commit %s: no result", buildID)
	}
	return s.addBuild(ctx, t, buildID, BuildBuilding, result, now)
}

func (s *Store) addBuild(ctx context.Context, t Template, buildID string, status BuildStatus, result []byte, now time.Time) (Template, error) {
	var out Template
	err := s.write(ctx, func(tx *sql.Tx) error {
		if ok, err := s.tenantExists(ctx, tx, t.Tenant); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("tenant %s: %w", t.Tenant, ErrNotFound)
		}
		cur, err := scanTemplate(tx.QueryRowContext(ctx,
			`SELECT `+templateCols+` FROM templates WHERE tenant_id = ? AND name = ?`, t.Tenant, t.Name))
		switch {
		case errors.Is(err, sql.ErrNoRows):
			t.CreatedAt, t.UpdatedAt = now.UTC(), now.UTC()
			if _, err := tx.ExecContext(ctx, `INSERT INTO templates (`+templateCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				t.ID, t.Tenant, t.Name, boolInt(t.Public), t.CPUCount, t.MemoryMB, unixNano(now), unixNano(now), nullString(t.SnapshotOf)); err != nil {
				if isUniqueViolation(err) {
					return fmt.Errorf("template %s: %w", t.ID, ErrConflict)
				}
				return err
			}
			out = t
		case err != nil:
			return err
		default:
			cur.CPUCount, cur.MemoryMB, cur.UpdatedAt = t.CPUCount, t.MemoryMB, now.UTC()
			if t.SnapshotOf != "" {
				cur.SnapshotOf = t.SnapshotOf
			}
			if _, err := tx.ExecContext(ctx, `UPDATE templates SET cpu_count = ?, memory_mb = ?, updated_at = ?, snapshot_of = ? WHERE id = ?`,
				cur.CPUCount, cur.MemoryMB, unixNano(now), nullString(cur.SnapshotOf), cur.ID); err != nil {
				return err
			}
			out = cur
		}
		var res any
		if result != nil {
			res = string(result)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO template_builds (`+buildCols+`) VALUES (?, ?, ?, '', '', ?, '[]', ?, ?)`,
			buildID, out.ID, status, res, unixNano(now), unixNano(now))
		if isUniqueViolation(err) {
			return fmt.Errorf("build %s: %w", buildID, ErrConflict)
		}
		return err
	})
	if err != nil {
		return Template{}, fmt.Errorf("request build: %w", err)
	}
	return out, nil
}

// FindTemplate returns the template tenant t may use by id or name: its
// own first, then a public one. Another tenant's private template is
// ErrNotFound, exactly like a missing one.
func (s *Store) FindTemplate(ctx context.Context, t tenant.ID, idOrName string) (Template, error) {
	tpl, err := scanTemplate(s.r.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates
		WHERE (id = ? OR name = ?) AND (tenant_id = ? OR public = 1)
		ORDER BY tenant_id = ? DESC, id = ? DESC LIMIT 1`, idOrName, idOrName, t, t, idOrName))
	if errors.Is(err, sql.ErrNoRows) {
		return Template{}, fmt.Errorf("template %q: %w", idOrName, ErrNotFound)
	}
	return tpl, err
}

// ListTemplates returns the templates tenant t may use (its own and the
// public ones), oldest first.
func (s *Store) ListTemplates(ctx context.Context, t tenant.ID) ([]Template, error) {
	return s.queryTemplates(ctx, `SELECT `+templateCols+` FROM templates
		WHERE tenant_id = ? OR public = 1 ORDER BY created_at, id`, t)
}

// queryTemplates runs a query of templateCols rows.
func (s *Store) queryTemplates(ctx context.Context, query string, args ...any) ([]Template, error) {
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Template
	for rows.Next() {
		tpl, err := scanTemplate(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, tpl)
	}
	return out, rows.Err()
}

// SetTemplatePublic changes the visibility of tenant t's template id.
func (s *Store) SetTemplatePublic(ctx context.Context, t tenant.ID, id string, public bool, now time.Time) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE templates SET public = ?, updated_at = ? WHERE id = ? AND tenant_id = ?`,
			boolInt(public), unixNano(now), id, t)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("template %q: %w", id, ErrNotFound)
		}
		return nil
	})
}

// DeleteTemplate removes tenant t's template id with its builds and tags,
// and returns the builds it had. The layers layersOf names of those
// builds (the caller reads their results, which are opaque here) are
// queued for removal in the same transaction (QueueLayerRemovals).
func (s *Store) DeleteTemplate(ctx context.Context, t tenant.ID, id string, layersOf func(Build) []string, now time.Time) ([]Build, error) {
	var builds []Build
	err := s.write(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT `+buildCols+` FROM template_builds
			WHERE template_id = (SELECT id FROM templates WHERE id = ? AND tenant_id = ?)`, id, t)
		if err != nil {
			return err
		}
		for rows.Next() {
			b, err := scanBuild(rows)
			if err != nil {
				rows.Close()
				return err
			}
			builds = append(builds, b)
		}
		rows.Close()
		res, err := tx.ExecContext(ctx, `DELETE FROM templates WHERE id = ? AND tenant_id = ?`, id, t)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("template %q: %w", id, ErrNotFound)
		}
		for _, b := range builds {
			if err := queueLayerRemovals(ctx, tx, layersOf(b), now); err != nil {
				return err
			}
		}
		return nil
	})
	return builds, err
}

// QueueLayerRemovals records layers as removals to do; one queued already
// keeps its place.
func (s *Store) QueueLayerRemovals(ctx context.Context, layers []string, now time.Time) error {
	return s.write(ctx, func(tx *sql.Tx) error { return queueLayerRemovals(ctx, tx, layers, now) })
}

func queueLayerRemovals(ctx context.Context, tx *sql.Tx, layers []string, now time.Time) error {
	for _, l := range layers {
		if _, err := tx.ExecContext(ctx, `INSERT INTO layer_removals (layer, queued_at) VALUES (?, ?)
			ON CONFLICT (layer) DO NOTHING`, l, unixNano(now)); err != nil {
			return fmt.Errorf("queue the removal of layer %s: %w", l, err)
		}
	}
	return nil
}

// LayerRemovals returns the layers queued for removal, the longest queued
// first.
func (s *Store) LayerRemovals(ctx context.Context) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT layer FROM layer_removals ORDER BY queued_at, layer`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// LayerRemoved forgets layer's queued removal: done, or no longer wanted.
func (s *Store) LayerRemoved(ctx context.Context, layer string) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM layer_removals WHERE layer = ?`, layer)
		return err
	})
}

// GetBuild returns build id of template templateID.
func (s *Store) GetBuild(ctx context.Context, templateID, id string) (Build, error) {
	b, err := scanBuild(s.r.QueryRowContext(ctx, `SELECT `+buildCols+` FROM template_builds
		WHERE id = ? AND template_id = ?`, id, templateID))
	if errors.Is(err, sql.ErrNoRows) {
		return Build{}, fmt.Errorf("build %q: %w", id, ErrNotFound)
	}
	return b, err
}

// ListBuilds returns the builds of template templateID, newest first, or
// those in status when status is not empty (of every template when
// templateID is empty).
func (s *Store) ListBuilds(ctx context.Context, templateID string, status BuildStatus) ([]Build, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+buildCols+` FROM template_builds
		WHERE (? = '' OR template_id = ?) AND (? = '' OR status = ?) ORDER BY created_at DESC, id`,
		templateID, templateID, status, status)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Build
	for rows.Next() {
		b, err := scanBuild(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// RecordBuildResult writes the result of build id of template templateID
// while it builds (what it has made so far), and nothing else; a build
// that is not building is left as it is (ErrConflict).
func (s *Store) RecordBuildResult(ctx context.Context, templateID, id string, result []byte, now time.Time) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE template_builds SET result = ?, updated_at = ?
			WHERE id = ? AND template_id = ? AND status = ?`, string(result), unixNano(now), id, templateID, BuildBuilding)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("build %q: %w: missing or not building", id, ErrConflict)
		}
		return nil
	})
}

// UpdateBuild writes b's status, reason, result and logs. A finished build
// is final: updating it again is ErrConflict.
func (s *Store) UpdateBuild(ctx context.Context, b Build, now time.Time) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		var result any
		if b.Result != nil {
			result = string(b.Result)
		}
		logs := string(b.Logs)
		if logs == "" {
			logs = "[]"
		}
		res, err := tx.ExecContext(ctx, `UPDATE template_builds SET status = ?, reason = ?, reason_step = ?,
			result = ?, logs = ?, updated_at = ? WHERE id = ? AND template_id = ? AND status NOT IN ('ready', 'error')`,
			b.Status, b.Reason, b.ReasonStep, result, logs, unixNano(now), b.ID, b.TemplateID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("build %q: %w: missing or finished", b.ID, ErrConflict)
		}
		return nil
	})
}

// SetTags points tags of template templateID at build buildID, moving them
// from the builds they pointed at.
func (s *Store) SetTags(ctx context.Context, templateID, buildID string, tags []string, now time.Time) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		for _, tag := range tags {
			if _, err := tx.ExecContext(ctx, `INSERT INTO template_tags (template_id, tag, build_id, created_at) VALUES (?, ?, ?, ?)
				ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id, created_at = excluded.created_at`,
				templateID, tag, buildID, unixNano(now)); err != nil {
				if isForeignKeyViolation(err) {
					return fmt.Errorf("build %q: %w", buildID, ErrNotFound)
				}
				return err
			}
		}
		return nil
	})
}

// DeleteTags removes tags of template templateID; missing ones are ignored.
func (s *Store) DeleteTags(ctx context.Context, templateID string, tags []string) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		for _, tag := range tags {
			if _, err := tx.ExecContext(ctx, `DELETE FROM template_tags WHERE template_id = ? AND tag = ?`, templateID, tag); err != nil {
				return err
			}
		}
		return nil
	})
}

// ListTags returns the tags of template templateID, by name.
func (s *Store) ListTags(ctx context.Context, templateID string) ([]Tag, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT tag, build_id, created_at FROM template_tags
		WHERE template_id = ? ORDER BY tag`, templateID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Tag
	for rows.Next() {
		var (
			tg  Tag
			cre int64
		)
		if err := rows.Scan(&tg.Tag, &tg.BuildID, &cre); err != nil {
			return nil, err
		}
		tg.CreatedAt = fromUnixNano(cre)
		out = append(out, tg)
	}
	return out, rows.Err()
}

// GetTemplate returns template id, whoever owns it (for the builder and
// boot, never for a tenant's request).
func (s *Store) GetTemplate(ctx context.Context, id string) (Template, error) {
	tpl, err := scanTemplate(s.r.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Template{}, fmt.Errorf("template %q: %w", id, ErrNotFound)
	}
	return tpl, err
}

// FinishCommit makes build b (StartCommit) ready with its result and
// points tag at it, in one transaction: a snapshot or version is there
// whole or not at all. With expect set, tag must still point at build
// expect (ErrConflict otherwise, and nothing changes): two publishes made
// from the same version cannot both become the next one.
func (s *Store) FinishCommit(ctx context.Context, b Build, tag, expect string, now time.Time) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		if expect != "" {
			var cur string
			err := tx.QueryRowContext(ctx, `SELECT build_id FROM template_tags WHERE template_id = ? AND tag = ?`, b.TemplateID, tag).Scan(&cur)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			if cur != expect {
				return fmt.Errorf("tag %q of template %q moved to build %q: %w", tag, b.TemplateID, cur, ErrConflict)
			}
		}
		res, err := tx.ExecContext(ctx, `UPDATE template_builds SET status = ?, result = ?, updated_at = ?
			WHERE id = ? AND template_id = ? AND status = ?`,
			BuildReady, string(b.Result), unixNano(now), b.ID, b.TemplateID, BuildBuilding)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("snapshot build %q: %w: missing or finished", b.ID, ErrConflict)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO template_tags (template_id, tag, build_id, created_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id, created_at = excluded.created_at`,
			b.TemplateID, tag, b.ID, unixNano(now))
		return err
	})
}

// ListSnapshotTemplates returns tenant t's snapshot templates, newest
// first; of sandbox sandboxID only, when not empty.
func (s *Store) ListSnapshotTemplates(ctx context.Context, t tenant.ID, sandboxID string) ([]Template, error) {
	return s.queryTemplates(ctx, `SELECT `+templateCols+` FROM templates
		WHERE tenant_id = ? AND snapshot_of IS NOT NULL AND (? = '' OR snapshot_of = ?)
		ORDER BY created_at DESC, id`, t, sandboxID, sandboxID)
}
