package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

// State is a sandbox's lifecycle state as stored. Which transitions are
// allowed is the sandbox package's business; the store only knows which
// states are live.
type State string

// Sandbox states. The -ing states mark an operation in progress, so boot
// reconcile can finish or undo what a crash interrupted.
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePausing  State = "pausing"
	StatePaused   State = "paused"
	StateResuming State = "resuming"
	StateKilling  State = "killing"
	StateKilled   State = "killed"
)

// Valid reports whether s is one of the State constants.
func (s State) Valid() bool {
	switch s {
	case StateCreating, StateRunning, StatePausing, StatePaused, StateResuming, StateKilling, StateKilled:
		return true
	}
	return false
}

// Live reports whether a sandbox in state s exists or may still exist on its
// backend: every valid state but killed.
func (s State) Live() bool { return s.Valid() && s != StateKilled }

// liveStates are the states Live reports true for.
var liveStates = []State{StateCreating, StateRunning, StatePausing, StatePaused, StateResuming, StateKilling}

// OnTimeout is what happens to a sandbox when its end time passes.
type OnTimeout string

// OnTimeout actions.
const (
	OnTimeoutKill  OnTimeout = "kill"
	OnTimeoutPause OnTimeout = "pause"
	// OnTimeoutPauseDisk pauses keeping only the filesystem (E2B's
	// autoPauseMemory: false).
	OnTimeoutPauseDisk OnTimeout = "pause_disk"
)

// Lifecycle is a sandbox's timeout behaviour.
type Lifecycle struct {
	OnTimeout  OnTimeout // empty is stored as OnTimeoutKill
	AutoResume bool      // resume a paused sandbox on connect or inbound traffic
}

// Sandbox is the stored record of one sandbox.
type Sandbox struct {
	ID                  string // [a-z0-9]+, at most 64 characters
	Tenant              tenant.ID
	Template            string // template ID
	Alias               string // template alias the sandbox was created from, if any
	State               State
	StartedAt           time.Time
	EndAt               time.Time // when the timeout fires
	CPUCount            int
	MemoryMB            int
	DiskMB              int
	Metadata            map[string]string
	EnvVars             map[string]string
	EnvdAccessToken     string // stored in plain text: it is returned to the owner
	Secure              bool
	AllowInternetAccess bool
	Network             json.RawMessage // network configuration, opaque to the store; nil if unset
	Lifecycle           Lifecycle
	Backend             string // name of the backend holding the sandbox
	Handle              string // the backend's handle for it, opaque to the store
	// Generation is set to 1 by InsertSandbox and bumped by each
	// UpdateSandbox; an update carrying an older generation is refused, so an
	// actor (the sweeper, say) that read (ID, Generation) never acts on a
	// newer incarnation of the sandbox.
	Generation int64
	CreatedAt  time.Time
	UpdatedAt  time.Time
	// IdleTTL, when above zero, kills the running sandbox once it has seen
	// no activity for that long (whole seconds; stored NULL when zero).
	// Sandboxes of the native API have one, E2B's have none.
	IdleTTL time.Duration
	// LastActiveAt is the last data-plane activity, written by
	// TouchSandbox (which does not bump Generation); zero if never set.
	// UpdateSandbox never moves it backwards.
	LastActiveAt time.Time
	// Timeout is the sandbox's own timeout, as its create asked for it: an
	// auto-resume starts it over (E2B's autoResume.timeout). Set by
	// InsertSandbox only; UpdateSandbox keeps the stored one, as E2B's
	// set_timeout does not change it either. Zero on a row from before
	// schema 8.
	Timeout time.Duration
}

// Compiled on first use, not at package init: every sandbox start
// re-executes sandboxd as libcontainer's init, which runs all package inits,
// and a bounded repeat like {0,62} compiles to a large program.
var sandboxIDRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]{1,64}$`) })

// ValidSandboxID reports whether id can identify a sandbox: 1 to 64 lowercase
// letters and digits.
func ValidSandboxID(id string) bool { return sandboxIDRE().MatchString(id) }

// validate checks sb before it is written and normalizes its lifecycle.
func (sb *Sandbox) validate() error {
	switch {
	case !ValidSandboxID(sb.ID):
		return fmt.Errorf("%w: sandbox id %q must match %s", ErrInvalid, sb.ID, sandboxIDRE())
	case sb.Tenant == "":
		return fmt.Errorf("%w: no tenant", ErrInvalid)
	case !sb.State.Valid():
		return fmt.Errorf("%w: state %q", ErrInvalid, sb.State)
	case !validTime(sb.StartedAt) || !validTime(sb.EndAt):
		return fmt.Errorf("%w: start or end time unset or out of range", ErrInvalid)
	case sb.CPUCount < 0 || sb.MemoryMB < 0 || sb.DiskMB < 0:
		return fmt.Errorf("%w: negative resources", ErrInvalid)
	case len(sb.Network) > 0 && !json.Valid(sb.Network):
		return fmt.Errorf("%w: network config is not JSON", ErrInvalid)
	case sb.IdleTTL < 0:
		return fmt.Errorf("%w: negative idle TTL", ErrInvalid)
	case sb.Timeout < 0:
		return fmt.Errorf("%w: negative timeout", ErrInvalid)
	case !sb.LastActiveAt.IsZero() && !validTime(sb.LastActiveAt):
		return fmt.Errorf("%w: last active time out of range", ErrInvalid)
	}
	switch sb.Lifecycle.OnTimeout {
	case "":
		sb.Lifecycle.OnTimeout = OnTimeoutKill
	case OnTimeoutKill, OnTimeoutPause, OnTimeoutPauseDisk:
	default:
		return fmt.Errorf("%w: on timeout %q", ErrInvalid, sb.Lifecycle.OnTimeout)
	}
	return nil
}

const sandboxCols = `id, tenant_id, template, alias, state, started_at, end_at, cpu_count, memory_mb,
	disk_mb, metadata, env_vars, envd_access_token, secure, allow_internet_access, network,
	on_timeout, auto_resume, backend, handle, generation, created_at, updated_at, idle_ttl,
	last_active_at, timeout_ms`

func scanSandbox(row rowScanner) (Sandbox, error) {
	var (
		sb                             Sandbox
		started, end, created, updated int64
		metadata, envVars              string
		network                        sql.NullString
		secure, internet, autoResume   bool
		idleTTL, lastActive, timeout   sql.NullInt64
	)
	err := row.Scan(&sb.ID, &sb.Tenant, &sb.Template, &sb.Alias, &sb.State, &started, &end,
		&sb.CPUCount, &sb.MemoryMB, &sb.DiskMB, &metadata, &envVars, &sb.EnvdAccessToken,
		&secure, &internet, &network, &sb.Lifecycle.OnTimeout, &autoResume, &sb.Backend,
		&sb.Handle, &sb.Generation, &created, &updated, &idleTTL, &lastActive, &timeout)
	if err != nil {
		return Sandbox{}, err
	}
	if err := json.Unmarshal([]byte(metadata), &sb.Metadata); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(envVars), &sb.EnvVars); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s env vars: %w", sb.ID, err)
	}
	if network.Valid {
		sb.Network = json.RawMessage(network.String)
	}
	sb.Secure, sb.AllowInternetAccess, sb.Lifecycle.AutoResume = secure, internet, autoResume
	sb.StartedAt, sb.EndAt = fromUnixNano(started), fromUnixNano(end)
	sb.CreatedAt, sb.UpdatedAt = fromUnixNano(created), fromUnixNano(updated)
	if idleTTL.Valid {
		sb.IdleTTL = time.Duration(idleTTL.Int64) * time.Second
	}
	sb.LastActiveAt = nullTime(lastActive)
	if timeout.Valid {
		sb.Timeout = time.Duration(timeout.Int64) * time.Millisecond
	}
	return sb, nil
}

// encodeMap encodes a string map as a JSON object, nil as {}.
func encodeMap(m map[string]string) (string, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// idleArgs are the values of idle_ttl and last_active_at: NULL when unset.
// The TTL is stored in whole seconds, rounded up.
func (sb *Sandbox) idleArgs() (ttl, lastActive any) {
	if sb.IdleTTL > 0 {
		ttl = int64((sb.IdleTTL + time.Second - 1) / time.Second)
	}
	if !sb.LastActiveAt.IsZero() {
		lastActive = unixNano(sb.LastActiveAt)
	}
	return ttl, lastActive
}

// mutableArgs are the values of the columns UpdateSandbox may change, in the
// order of the SET clause and of the INSERT after id and tenant_id.
func (sb *Sandbox) mutableArgs() ([]any, error) {
	metadata, err := encodeMap(sb.Metadata)
	if err != nil {
		return nil, err
	}
	envVars, err := encodeMap(sb.EnvVars)
	if err != nil {
		return nil, err
	}
	var network any
	if len(sb.Network) > 0 {
		network = string(sb.Network)
	}
	return []any{sb.Template, sb.Alias, string(sb.State), unixNano(sb.StartedAt), unixNano(sb.EndAt),
		sb.CPUCount, sb.MemoryMB, sb.DiskMB, metadata, envVars, sb.EnvdAccessToken,
		boolInt(sb.Secure), boolInt(sb.AllowInternetAccess), network,
		string(sb.Lifecycle.OnTimeout), boolInt(sb.Lifecycle.AutoResume), sb.Backend, sb.Handle}, nil
}

const mutableSet = `template = ?, alias = ?, state = ?, started_at = ?, end_at = ?, cpu_count = ?,
	memory_mb = ?, disk_mb = ?, metadata = ?, env_vars = ?, envd_access_token = ?, secure = ?,
	allow_internet_access = ?, network = ?, on_timeout = ?, auto_resume = ?, backend = ?, handle = ?`

// InsertSandbox stores a new sandbox. It sets sb.Generation to 1 and
// sb.CreatedAt and sb.UpdatedAt to now. A taken ID is ErrConflict, an unknown
// tenant ErrNotFound.
func (s *Store) InsertSandbox(ctx context.Context, sb *Sandbox) error {
	if err := sb.validate(); err != nil {
		return fmt.Errorf("insert sandbox %s: %w", sb.ID, err)
	}
	args, err := sb.mutableArgs()
	if err != nil {
		return fmt.Errorf("insert sandbox %s: %w", sb.ID, err)
	}
	now := time.Now().UTC()
	args = append([]any{sb.ID, sb.Tenant}, args...)
	ttl, lastActive := sb.idleArgs()
	var timeout any // NULL when unset, like a row from before schema 8
	if sb.Timeout > 0 {
		timeout = sb.Timeout.Milliseconds()
	}
	args = append(args, int64(1), unixNano(now), unixNano(now), ttl, lastActive, timeout)
	// The tenant's foreign key refuses a tenant that does not exist (both
	// dialects enforce it): no lookup of its own on a create's way.
	_, err = s.writeStmt(ctx, s.stmts.insertSandbox, args...)
	switch {
	case isUniqueViolation(err):
		return fmt.Errorf("insert sandbox %s: %w: id taken", sb.ID, ErrConflict)
	case isForeignKeyViolation(err):
		return fmt.Errorf("insert sandbox %s: tenant %s: %w", sb.ID, sb.Tenant, ErrNotFound)
	case err != nil:
		return fmt.Errorf("insert sandbox %s: %w", sb.ID, err)
	}
	sb.Generation, sb.CreatedAt, sb.UpdatedAt = 1, now, now
	return nil
}

// GetSandbox returns tenant t's sandbox id, in any state. A sandbox of another
// tenant is ErrNotFound, exactly like a missing one.
func (s *Store) GetSandbox(ctx context.Context, t tenant.ID, id string) (Sandbox, error) {
	sb, err := scanSandbox(s.stmts.getSandbox.QueryRowContext(ctx, id, t))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// GetSandboxAny returns sandbox id whatever its tenant, for the proxy and the
// sweeper, which act on ids that did not come with a tenant.
func (s *Store) GetSandboxAny(ctx context.Context, id string) (Sandbox, error) {
	sb, err := scanSandbox(s.stmts.getSandboxAny.QueryRowContext(ctx, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// UpdateSandbox writes sb over the stored sandbox (sb.ID, sb.Tenant), if the
// stored generation still equals sb.Generation; ID, Tenant, CreatedAt and
// Timeout never change. On success sb.Generation is bumped and sb.UpdatedAt set. If
// the generation moved, it is ErrConflict and nothing is written: re-read and
// decide again. A missing sandbox (or one of another tenant) is ErrNotFound.
func (s *Store) UpdateSandbox(ctx context.Context, sb *Sandbox) error {
	if err := sb.validate(); err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	args, err := sb.mutableArgs()
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	now := time.Now().UTC()
	ttl, lastActive := sb.idleArgs()
	args = append(args, ttl, lastActive, lastActive, unixNano(now), sb.ID, sb.Tenant, sb.Generation)
	res, err := s.writeStmt(ctx, s.stmts.updateSandbox, args...)
	if err == nil {
		if n, rerr := res.RowsAffected(); rerr != nil {
			err = rerr
		} else if n != 1 {
			// Nothing changed: say why, as the row is now. The writer
			// reads it, so a commit made since is seen.
			var gen int64
			err = s.w.QueryRowContext(ctx, `SELECT generation FROM sandboxes WHERE id = ? AND tenant_id = ?`,
				sb.ID, sb.Tenant).Scan(&gen)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				err = ErrNotFound
			case err == nil:
				err = fmt.Errorf("%w: generation is %d, not %d", ErrConflict, gen, sb.Generation)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	sb.Generation++
	sb.UpdatedAt = now
	return nil
}

// TouchSandbox records activity on live sandbox id at time at: it moves
// last_active_at forwards (never back) and, unlike UpdateSandbox, bumps
// neither generation nor updated_at, so it never conflicts with a writer
// holding (ID, Generation). A missing or killed sandbox is ErrNotFound.
func (s *Store) TouchSandbox(ctx context.Context, id string, at time.Time) error {
	if !validTime(at) {
		return fmt.Errorf("touch sandbox %s: %w: time out of range", id, ErrInvalid)
	}
	err := s.writeOne(ctx, `UPDATE sandboxes SET last_active_at = `+laterOf("last_active_at")+`
		WHERE id = ? AND state != ?`, unixNano(at), unixNano(at), id, StateKilled)
	if err != nil {
		return fmt.Errorf("touch sandbox %s: %w", id, err)
	}
	return nil
}

// DeleteSandbox removes sandbox id's row whatever its state or tenant; an
// unknown id is ErrNotFound. Usually a sandbox is first updated to
// StateKilled (with the generation check) and its row deleted later.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	err := s.writeOne(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// PurgeKilled deletes the rows of killed sandboxes last updated before
// before, and returns how many it deleted.
func (s *Store) PurgeKilled(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE state = ? AND updated_at < ?`,
			StateKilled, unixNano(before))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("purge killed sandboxes: %w", err)
	}
	return int(n), nil
}

// ListExpired returns the running sandboxes whose end time is at or before
// now, soonest first, for the sweeper. It acts on each by (ID, Generation).
func (s *Store) ListExpired(ctx context.Context, now time.Time) ([]Sandbox, error) {
	return s.list(ctx, "expired", `state = ? AND end_at <= ? ORDER BY end_at, id`,
		StateRunning, unixNano(now))
}

// ListIdle returns the running sandboxes with an idle TTL whose last
// activity (their start, if none was recorded) plus that TTL is at or
// before now, for the sweeper. It acts on each by (ID, Generation) and must
// re-check idleness: TouchSandbox does not bump the generation.
func (s *Store) ListIdle(ctx context.Context, now time.Time) ([]Sandbox, error) {
	// last + ttl <= now, written so that a huge TTL cannot overflow:
	// PostgreSQL's BIGINT arithmetic fails where SQLite's turns REAL. The
	// division truncates, which for whole seconds means the same.
	return s.list(ctx, "idle", `state = ? AND idle_ttl > 0
		AND idle_ttl <= (? - COALESCE(last_active_at, started_at)) / 1000000000
		ORDER BY id`, StateRunning, unixNano(now))
}

// ListLive returns every live sandbox of every tenant (all states but
// killed), ordered by ID, for boot reconcile.
func (s *Store) ListLive(ctx context.Context) ([]Sandbox, error) {
	return s.list(ctx, "live", `state != ? ORDER BY id`, StateKilled)
}

// CountLive returns how many live sandboxes (paused and in-progress states
// included) tenant t has.
func (s *Store) CountLive(ctx context.Context, t tenant.ID) (int, error) {
	var n int
	err := s.r.QueryRowContext(ctx,
		`SELECT COUNT(*) FROM sandboxes WHERE tenant_id = ? AND state != ?`, t, StateKilled).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count sandboxes of %s: %w", t, err)
	}
	return n, nil
}

// SumMemoryMB returns the total MemoryMB of tenant t's live sandboxes
// (paused and in-progress states included), plus their DiskMB when withDisk
// is set (a backend whose disks live in RAM).
func (s *Store) SumMemoryMB(ctx context.Context, t tenant.ID, withDisk bool) (int, error) {
	var n int
	err := s.r.QueryRowContext(ctx,
		`SELECT COALESCE(SUM(memory_mb + CASE WHEN ? THEN disk_mb ELSE 0 END), 0) FROM sandboxes WHERE tenant_id = ? AND state != ?`,
		withDisk, t, StateKilled).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("sum memory of %s: %w", t, err)
	}
	return n, nil
}

// query runs a read returning sandbox rows.
func (s *Store) query(ctx context.Context, q string, args ...any) ([]Sandbox, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var sbs []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		sbs = append(sbs, sb)
	}
	return sbs, rows.Err()
}

// list returns the sandboxes matching where (a WHERE clause, with its
// ORDER BY); what names them in the error.
func (s *Store) list(ctx context.Context, what, where string, args ...any) ([]Sandbox, error) {
	sbs, err := s.query(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("list %s sandboxes: %w", what, err)
	}
	return sbs, nil
}

// writeOne runs statement q in a write transaction; when it affects no row
// the error is ErrNotFound.
func (s *Store) writeOne(ctx context.Context, q string, args ...any) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return ErrNotFound
		}
		return nil
	})
}

// placeholders returns "?, ?, ..." with n question marks.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
