package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

// Compiled on first use: see sandboxIDRE.
var tenantNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`) })

// ValidTenantName reports whether name can name a tenant: 1 to 63 lowercase
// letters, digits and dashes, not starting with a dash.
func ValidTenantName(name string) bool { return tenantNameRE().MatchString(name) }

// Tenant is a tenant and its settings. Its ID is its name.
type Tenant struct {
	ID        tenant.ID
	Settings  tenant.Settings
	CreatedAt time.Time
	UpdatedAt time.Time // last change of Settings
}

// The tenants table keeps one nullable column per setting (NULL: unset), a
// rate and a burst column per route class; classCols maps them to
// tenant.Settings.
var classCols = []struct {
	class       tenant.Class
	rate, burst string
}{
	{tenant.Create, "create_rate", "create_burst"},
	{tenant.Lifecycle, "lifecycle_rate", "lifecycle_burst"},
	{tenant.Read, "read_rate", "read_burst"},
	{tenant.DataPlane, "dataplane_rate", "dataplane_burst"},
}

// settingCols are the columns of tenant.Settings, in the order of
// settingArgs and scanTenant.
var settingCols = func() []string {
	cols := []string{"min_warm", "max_sandboxes", "max_memory_mb"}
	for _, cc := range classCols {
		cols = append(cols, cc.rate, cc.burst)
	}
	return append(cols, "build_cpu", "build_memory_mb", "build_disk_mb", "build_timeout_s",
		"max_volumes", "max_volumes_mb", "volume_size_mb")
}()

var (
	tenantCols        = "id, " + strings.Join(settingCols, ", ") + ", created_at, updated_at"
	updateSettingsSQL = "UPDATE tenants SET " + strings.Join(settingCols, " = ?, ") + " = ?, updated_at = ? WHERE id = ?"
)

// settingArgs returns the values of settingCols (nil: NULL).
func settingArgs(st tenant.Settings) []any {
	args := []any{sqlValue(st.MinWarm), sqlValue(st.MaxSandboxes), sqlValue(st.MaxMemoryMB)}
	for _, cc := range classCols {
		l := st.Limit(cc.class)
		args = append(args, sqlValue(l.Rate), sqlValue(l.Burst))
	}
	b := st.Build
	v := st.Volumes
	return append(args, sqlValue(b.CPU), sqlValue(b.MemoryMB), sqlValue(b.DiskMB), sqlValue(b.TimeoutS),
		sqlValue(v.Max), sqlValue(v.MaxMB), sqlValue(v.SizeMB))
}

func sqlValue[T int | float64](v tenant.Value[T]) any {
	if x, ok := v.Get(); ok {
		return x
	}
	return nil
}

func fromNull[T int | float64](n sql.Null[T]) tenant.Value[T] {
	if !n.Valid {
		return tenant.Value[T]{}
	}
	return tenant.Of(n.V)
}

type rowScanner interface{ Scan(dest ...any) error }

func scanTenant(row rowScanner) (Tenant, error) {
	var (
		t                             Tenant
		minWarm, maxSandboxes, maxMem sql.Null[int]
		rates                         = make([]sql.Null[float64], len(classCols))
		bursts                        = make([]sql.Null[int], len(classCols))
		created, updated              int64
		build                         [4]sql.Null[int]
		volumes                       [3]sql.Null[int]
	)
	dest := []any{&t.ID, &minWarm, &maxSandboxes, &maxMem}
	for i := range classCols {
		dest = append(dest, &rates[i], &bursts[i])
	}
	for i := range build {
		dest = append(dest, &build[i])
	}
	for i := range volumes {
		dest = append(dest, &volumes[i])
	}
	if err := row.Scan(append(dest, &created, &updated)...); err != nil {
		return Tenant{}, err
	}
	t.Settings = tenant.Settings{
		MinWarm:      fromNull(minWarm),
		MaxSandboxes: fromNull(maxSandboxes),
		MaxMemoryMB:  fromNull(maxMem),
		Build: tenant.BuildLimits{CPU: fromNull(build[0]), MemoryMB: fromNull(build[1]),
			DiskMB: fromNull(build[2]), TimeoutS: fromNull(build[3])},
		Volumes: tenant.VolumeLimits{Max: fromNull(volumes[0]), MaxMB: fromNull(volumes[1]), SizeMB: fromNull(volumes[2])},
	}
	for i, cc := range classCols {
		t.Settings.SetLimit(cc.class, tenant.Limit{Rate: fromNull(rates[i]), Burst: fromNull(bursts[i])})
	}
	t.CreatedAt, t.UpdatedAt = fromUnixNano(created), fromUnixNano(updated)
	return t, nil
}

// CreateTenant creates a tenant with default settings. A taken name is
// ErrConflict, a malformed one ErrInvalid.
func (s *Store) CreateTenant(ctx context.Context, name string) (Tenant, error) {
	if !ValidTenantName(name) {
		return Tenant{}, fmt.Errorf("create tenant %q: %w: name must match %s", name, ErrInvalid, tenantNameRE())
	}
	now := time.Now().UTC()
	t := Tenant{ID: tenant.ID(name), CreatedAt: now, UpdatedAt: now}
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx,
			`INSERT INTO tenants (id, created_at, updated_at) VALUES (?, ?, ?)`,
			name, unixNano(now), unixNano(now))
		return err
	})
	if isUniqueViolation(err) {
		return Tenant{}, fmt.Errorf("create tenant %s: %w: it exists", name, ErrConflict)
	}
	if err != nil {
		return Tenant{}, fmt.Errorf("create tenant %s: %w", name, err)
	}
	return t, nil
}

// EnsureTenant returns the tenant named name, creating it if it does not
// exist (for "sandboxd keys create --tenant NAME" and first start).
func (s *Store) EnsureTenant(ctx context.Context, name string) (Tenant, error) {
	t, err := s.CreateTenant(ctx, name)
	if errors.Is(err, ErrConflict) {
		return s.GetTenant(ctx, tenant.ID(name))
	}
	return t, err
}

// GetTenant returns the tenant id, or ErrNotFound.
func (s *Store) GetTenant(ctx context.Context, id tenant.ID) (Tenant, error) {
	t, err := scanTenant(s.r.QueryRowContext(ctx,
		`SELECT `+tenantCols+` FROM tenants WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Tenant{}, fmt.Errorf("get tenant %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Tenant{}, fmt.Errorf("get tenant %s: %w", id, err)
	}
	return t, nil
}

// ListTenants returns all tenants ordered by ID. A server that polls it picks
// up settings changed by the CLI without a restart.
func (s *Store) ListTenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+tenantCols+` FROM tenants ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	defer rows.Close()
	var ts []Tenant
	for rows.Next() {
		t, err := scanTenant(rows)
		if err != nil {
			return nil, fmt.Errorf("list tenants: %w", err)
		}
		ts = append(ts, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	return ts, nil
}

// SetTenantSettings replaces the settings of tenant id.
func (s *Store) SetTenantSettings(ctx context.Context, id tenant.ID, set tenant.Settings) (Tenant, error) {
	return s.UpdateTenantSettings(ctx, id, func(cur *tenant.Settings) { *cur = set })
}

// UpdateTenantSettings reads the settings of tenant id, lets fn change them
// and stores the result, all in one transaction, so concurrent updates of
// different fields (say, two CLI invocations) do not undo each other. fn runs
// inside the transaction: it must only modify its argument, never call the
// Store.
func (s *Store) UpdateTenantSettings(ctx context.Context, id tenant.ID, fn func(*tenant.Settings)) (Tenant, error) {
	var t Tenant
	err := s.write(ctx, func(tx *sql.Tx) error {
		var err error
		t, err = scanTenant(tx.QueryRowContext(ctx, `SELECT `+tenantCols+` FROM tenants WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		fn(&t.Settings)
		if err := t.Settings.Validate(); err != nil {
			return err
		}
		t.UpdatedAt = time.Now().UTC()
		_, err = tx.ExecContext(ctx, updateSettingsSQL, append(settingArgs(t.Settings), unixNano(t.UpdatedAt), id)...)
		return err
	})
	if err != nil {
		return Tenant{}, fmt.Errorf("update tenant %s settings: %w", id, err)
	}
	return t, nil
}

// tenantExists reports whether tenant id exists, inside tx.
func (s *Store) tenantExists(ctx context.Context, tx *sql.Tx, id tenant.ID) (bool, error) {
	var one int
	err := tx.StmtContext(ctx, s.stmts.tenantExists).QueryRowContext(ctx, id).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
