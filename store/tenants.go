package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"regexp"
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
	Settings  Settings
	CreatedAt time.Time
	UpdatedAt time.Time // last change of Settings
}

// Settings are a tenant's pool, rate and quota settings. A nil field means
// "use the server default"; a set field is used as is, zero included.
type Settings struct {
	MinWarm      *int     // warm sandboxes kept per pool
	CreateRate   *float64 // sandbox creates per second (token refill rate)
	CreateBurst  *int     // create token bucket size
	MaxSandboxes *int     // live sandboxes at once
	MaxMemoryMB  *int     // total memory of live sandboxes, MiB

	// Token buckets of the other route classes (see package ratelimit).
	LifecycleRate  *float64 // other mutating API calls per second
	LifecycleBurst *int
	ReadRate       *float64 // API reads (GET, HEAD) per second
	ReadBurst      *int
	DataPlaneRate  *float64 // data-plane requests per second
	DataPlaneBurst *int
}

// Validate reports a negative, NaN or infinite setting as ErrInvalid.
func (s Settings) Validate() error {
	for _, f := range []struct {
		name string
		v    *int
	}{
		{"min warm", s.MinWarm},
		{"create burst", s.CreateBurst},
		{"max sandboxes", s.MaxSandboxes},
		{"max memory", s.MaxMemoryMB},
		{"lifecycle burst", s.LifecycleBurst},
		{"read burst", s.ReadBurst},
		{"dataplane burst", s.DataPlaneBurst},
	} {
		if f.v != nil && *f.v < 0 {
			return fmt.Errorf("%w: %s %d is negative", ErrInvalid, f.name, *f.v)
		}
	}
	for _, f := range []struct {
		name string
		r    *float64
	}{
		{"create rate", s.CreateRate},
		{"lifecycle rate", s.LifecycleRate},
		{"read rate", s.ReadRate},
		{"dataplane rate", s.DataPlaneRate},
	} {
		if r := f.r; r != nil && (*r < 0 || math.IsNaN(*r) || math.IsInf(*r, 0)) {
			return fmt.Errorf("%w: %s %v is not a finite non-negative number", ErrInvalid, f.name, *r)
		}
	}
	return nil
}

const tenantCols = `id, min_warm, create_rate, create_burst, max_sandboxes, max_memory_mb,
	lifecycle_rate, lifecycle_burst, read_rate, read_burst, dataplane_rate, dataplane_burst, created_at, updated_at`

type rowScanner interface{ Scan(dest ...any) error }

func scanTenant(row rowScanner) (Tenant, error) {
	var (
		t                                    Tenant
		minWarm, burst, maxSandboxes, maxMem sql.NullInt64
		lcBurst, readBurst, dpBurst          sql.NullInt64
		rate, lcRate, readRate, dpRate       sql.NullFloat64
		created, updated                     int64
	)
	if err := row.Scan(&t.ID, &minWarm, &rate, &burst, &maxSandboxes, &maxMem,
		&lcRate, &lcBurst, &readRate, &readBurst, &dpRate, &dpBurst, &created, &updated); err != nil {
		return Tenant{}, err
	}
	t.Settings = Settings{
		MinWarm:        intPtr(minWarm),
		CreateRate:     floatPtr(rate),
		CreateBurst:    intPtr(burst),
		MaxSandboxes:   intPtr(maxSandboxes),
		MaxMemoryMB:    intPtr(maxMem),
		LifecycleRate:  floatPtr(lcRate),
		LifecycleBurst: intPtr(lcBurst),
		ReadRate:       floatPtr(readRate),
		ReadBurst:      intPtr(readBurst),
		DataPlaneRate:  floatPtr(dpRate),
		DataPlaneBurst: intPtr(dpBurst),
	}
	t.CreatedAt, t.UpdatedAt = fromUnixNano(created), fromUnixNano(updated)
	return t, nil
}

func intPtr(n sql.NullInt64) *int {
	if !n.Valid {
		return nil
	}
	v := int(n.Int64)
	return &v
}

func floatPtr(n sql.NullFloat64) *float64 {
	if !n.Valid {
		return nil
	}
	v := n.Float64
	return &v
}

// nullable turns a nil pointer into SQL NULL.
func nullable[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
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
func (s *Store) SetTenantSettings(ctx context.Context, id tenant.ID, set Settings) (Tenant, error) {
	return s.UpdateTenantSettings(ctx, id, func(cur *Settings) { *cur = set })
}

// UpdateTenantSettings reads the settings of tenant id, lets fn change them
// and stores the result, all in one transaction, so concurrent updates of
// different fields (say, two CLI invocations) do not undo each other. fn runs
// inside the transaction: it must only modify its argument, never call the
// Store.
func (s *Store) UpdateTenantSettings(ctx context.Context, id tenant.ID, fn func(*Settings)) (Tenant, error) {
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
		st := t.Settings
		_, err = tx.ExecContext(ctx, `UPDATE tenants SET min_warm = ?, create_rate = ?, create_burst = ?,
			max_sandboxes = ?, max_memory_mb = ?, lifecycle_rate = ?, lifecycle_burst = ?,
			read_rate = ?, read_burst = ?, dataplane_rate = ?, dataplane_burst = ?, updated_at = ? WHERE id = ?`,
			nullable(st.MinWarm), nullable(st.CreateRate), nullable(st.CreateBurst),
			nullable(st.MaxSandboxes), nullable(st.MaxMemoryMB),
			nullable(st.LifecycleRate), nullable(st.LifecycleBurst), nullable(st.ReadRate), nullable(st.ReadBurst),
			nullable(st.DataPlaneRate), nullable(st.DataPlaneBurst), unixNano(t.UpdatedAt), id)
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
