package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

// Volume is the record of an E2B volume; the backend keeps its files.
type Volume struct {
	ID        string
	Tenant    tenant.ID
	Name      string // unique within the tenant
	Token     string // the content API's bearer token
	SizeMB    int
	CreatedAt time.Time
	// Deleting says a delete has begun (MarkVolumeDeleting): the record
	// is hidden from every read but ListVolumes of all tenants, which
	// Prune uses to finish a delete a crash interrupted.
	Deleting bool
}

const volumeCols = `id, tenant_id, name, token, size_mb, created_at`

// volumeSel is what scanVolume reads: the columns and the delete mark.
const volumeSel = volumeCols + `, deleting_at IS NOT NULL`

func scanVolume(row rowScanner) (Volume, error) {
	var (
		v       Volume
		created int64
	)
	if err := row.Scan(&v.ID, &v.Tenant, &v.Name, &v.Token, &v.SizeMB, &created, &v.Deleting); err != nil {
		return Volume{}, err
	}
	v.CreatedAt = fromUnixNano(created)
	return v, nil
}

// VolumeQuota bounds InsertVolume: the tenant's volumes, the new one
// included, may number at most Max and total at most MaxMB MiB; 0: no
// limit.
type VolumeQuota struct{ Max, MaxMB int }

// InsertVolume records v if the tenant's quota allows, checked in the same
// transaction as the insert so that concurrent creates cannot both pass.
// A name the tenant uses is ErrConflict; a quota exceeded is
// errdefs.ErrResourceExhausted (ErrQuota).
func (s *Store) InsertVolume(ctx context.Context, v Volume, q VolumeQuota) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		if ok, err := s.tenantExists(ctx, tx, v.Tenant); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("tenant %s: %w", v.Tenant, ErrNotFound)
		}
		var n, mb int
		if err := tx.QueryRowContext(ctx,
			`SELECT COUNT(*), COALESCE(SUM(size_mb), 0) FROM volumes WHERE tenant_id = ?`, v.Tenant).Scan(&n, &mb); err != nil {
			return err
		}
		if q.Max > 0 && n+1 > q.Max {
			return fmt.Errorf("%w: the tenant has %d of %d volumes", ErrQuota, n, q.Max)
		}
		if q.MaxMB > 0 && mb+v.SizeMB > q.MaxMB {
			return fmt.Errorf("%w: the tenant's volumes would total %d MiB, above its limit of %d MiB", ErrQuota, mb+v.SizeMB, q.MaxMB)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO volumes (`+volumeCols+`) VALUES (?, ?, ?, ?, ?, ?)`,
			v.ID, v.Tenant, v.Name, v.Token, v.SizeMB, unixNano(v.CreatedAt))
		return err
	})
	if isUniqueViolation(err) {
		return fmt.Errorf("create volume %q: %w: the name is taken", v.Name, ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("create volume %q: %w", v.Name, err)
	}
	return nil
}

// GetVolume returns volume id of tenant t; another tenant's, or one being
// deleted, is ErrNotFound.
func (s *Store) GetVolume(ctx context.Context, t tenant.ID, id string) (Volume, error) {
	v, err := scanVolume(s.r.QueryRowContext(ctx, `SELECT `+volumeSel+` FROM volumes
		WHERE id = ? AND tenant_id = ? AND deleting_at IS NULL`, id, t))
	return v, volumeErr(id, err)
}

// VolumeByID returns volume id whoever owns it (the content API, which
// authenticates by the volume's token).
func (s *Store) VolumeByID(ctx context.Context, id string) (Volume, error) {
	v, err := scanVolume(s.r.QueryRowContext(ctx, `SELECT `+volumeSel+` FROM volumes
		WHERE id = ? AND deleting_at IS NULL`, id))
	return v, volumeErr(id, err)
}

// VolumeByName returns tenant t's volume called name.
func (s *Store) VolumeByName(ctx context.Context, t tenant.ID, name string) (Volume, error) {
	v, err := scanVolume(s.r.QueryRowContext(ctx, `SELECT `+volumeSel+` FROM volumes
		WHERE tenant_id = ? AND name = ? AND deleting_at IS NULL`, t, name))
	return v, volumeErr(name, err)
}

func volumeErr(id string, err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("volume %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	return nil
}

// ListVolumes returns tenant t's volumes by name, but those being deleted;
// or, when t is empty, every tenant's, those being deleted included.
func (s *Store) ListVolumes(ctx context.Context, t tenant.ID) ([]Volume, error) {
	q, args := `SELECT `+volumeSel+` FROM volumes ORDER BY tenant_id, name`, []any{}
	if t != "" {
		q, args = `SELECT `+volumeSel+` FROM volumes WHERE tenant_id = ? AND deleting_at IS NULL ORDER BY name`, []any{t}
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	defer rows.Close()
	var out []Volume
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, fmt.Errorf("list volumes: %w", err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	return out, nil
}

// DeleteVolume removes tenant t's volume id, marked or not; ErrNotFound if
// it has none.
func (s *Store) DeleteVolume(ctx context.Context, t tenant.ID, id string) error {
	return s.volumeExec(ctx, "delete", id, `DELETE FROM volumes WHERE id = ? AND tenant_id = ?`, id, t)
}

// MarkVolumeDeleting marks tenant t's volume id as being deleted, before
// its files go, so that a crash from here on leaves a record Prune finds.
// A missing volume, or one already marked (a delete under way), is
// ErrNotFound.
func (s *Store) MarkVolumeDeleting(ctx context.Context, t tenant.ID, id string) error {
	return s.volumeExec(ctx, "mark deleting", id, `UPDATE volumes SET deleting_at = ?
		WHERE id = ? AND tenant_id = ? AND deleting_at IS NULL`, unixNano(time.Now()), id, t)
}

// UnmarkVolumeDeleting undoes MarkVolumeDeleting, for a delete the backend
// refused (the volume is in use): the volume is listed again.
func (s *Store) UnmarkVolumeDeleting(ctx context.Context, t tenant.ID, id string) error {
	return s.volumeExec(ctx, "unmark deleting", id, `UPDATE volumes SET deleting_at = NULL
		WHERE id = ? AND tenant_id = ?`, id, t)
}

// volumeExec runs one statement on volume id's row; no row is ErrNotFound.
func (s *Store) volumeExec(ctx context.Context, what, id, query string, args ...any) error {
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("%s volume %s: %w", what, id, err)
	}
	if n == 0 {
		return fmt.Errorf("%s volume %s: %w", what, id, ErrNotFound)
	}
	return nil
}

// SandboxVolume is a volume mounted in a sandbox: the volume, the name the
// create gave it, and where.
type SandboxVolume struct {
	VolumeID, Name, Path string
}

// SetSandboxVolumes records the volumes sandbox id mounts; they are removed
// with its row.
func (s *Store) SetSandboxVolumes(ctx context.Context, id string, vs []SandboxVolume) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_volumes WHERE sandbox_id = ?`, id); err != nil {
			return err
		}
		for _, v := range vs {
			if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_volumes (sandbox_id, volume_id, name, path) VALUES (?, ?, ?, ?)`,
				id, v.VolumeID, v.Name, v.Path); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("set volumes of sandbox %s: %w", id, err)
	}
	return nil
}

// SandboxVolumes returns the volumes sandbox id mounts, by path.
func (s *Store) SandboxVolumes(ctx context.Context, id string) ([]SandboxVolume, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT volume_id, name, path FROM sandbox_volumes WHERE sandbox_id = ? ORDER BY path`, id)
	if err != nil {
		return nil, fmt.Errorf("volumes of sandbox %s: %w", id, err)
	}
	defer rows.Close()
	var out []SandboxVolume
	for rows.Next() {
		var v SandboxVolume
		if err := rows.Scan(&v.VolumeID, &v.Name, &v.Path); err != nil {
			return nil, fmt.Errorf("volumes of sandbox %s: %w", id, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("volumes of sandbox %s: %w", id, err)
	}
	return out, nil
}
