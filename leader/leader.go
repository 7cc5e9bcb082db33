// Package leader decides which of several sandboxd processes that share one
// PostgreSQL store is the active one. The active one holds a lease: a row
// of the database naming its holder and an end time. Only the database's
// clock decides whether a lease has ended, so the hosts' clocks may
// disagree.
//
// A standby polls the row and takes the lease once it has ended. The holder
// renews it well before then. The holder must stop acting before the
// database lets another take over. Hold measures that deadline on the
// holder's own monotonic clock, from the moment it sent its last
// successful renewal. The database set the end time no earlier than that
// moment, so the holder's deadline never falls after the database's end
// time, as long as neither clock runs fast against the other by more than
// the margin.
package leader

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// ErrLost is returned by Hold when this process no longer holds the lease,
// or can no longer be sure it does: its holder must stop acting at once.
var ErrLost = errors.New("leader: lease lost")

// DefaultTTL is how long a lease lasts without renewal: how long a standby
// waits for a holder that vanished without releasing it.
const DefaultTTL = 5 * time.Second

// leaseKey serialises the creation of the lease table between processes
// starting at once (CREATE TABLE IF NOT EXISTS alone races on the catalog).
const leaseKey = 0x7362786c65617365 // "sbxlease": not the store's write lock

// Options configure a Lease.
type Options struct {
	// Name is the lease's row: processes contend only for the same name.
	// Default "sandboxd".
	Name string
	// Holder names this process in the row and in logs. Default
	// hostname:pid:random.
	Holder string
	// TTL is the lease's length (default DefaultTTL). The holder renews it
	// every TTL/4 and gives up TTL/5 before it ends unrenewed.
	TTL time.Duration
	Log *slog.Logger
}

// Lease is one process' claim on the lease named Options.Name.
type Lease struct {
	db     *sql.DB
	name   string
	holder string
	ttl    time.Duration
	log    *slog.Logger
	// term is the lease's term while this process holds it: it grows at
	// every change of holder, so a renewal of a term that ended fails even
	// if the same holder took the lease again since.
	term int64
	// deadline is when this process stops acting unless a renewal
	// succeeds first (local monotonic clock).
	deadline time.Time
}

// Open connects to the database at dsn (a postgres:// URL or a key=value
// DSN) and creates the lease table if it is missing. Close the Lease when
// done.
func Open(ctx context.Context, dsn string, o Options) (*Lease, error) {
	if o.Name == "" {
		o.Name = "sandboxd"
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.TTL < 200*time.Millisecond {
		return nil, fmt.Errorf("leader: lease TTL %v is under 200ms", o.TTL)
	}
	if o.Holder == "" {
		o.Holder = defaultHolder()
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("leader: %w", err)
	}
	// One connection renews; a second keeps a status read from queueing
	// behind a renewal stuck on a dead network.
	db.SetMaxOpenConns(2)
	db.SetMaxIdleConns(2)
	// A connection the network broke is not reused forever.
	db.SetConnMaxIdleTime(time.Minute)
	l := &Lease{db: db, name: o.Name, holder: o.Holder, ttl: o.TTL, log: o.Log.With("lease", o.Name, "holder", o.Holder)}
	if err := l.createTable(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return l, nil
}

func defaultHolder() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b))
}

func (l *Lease) createTable(ctx context.Context) error {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("leader: create table: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(leaseKey)); err != nil {
		return fmt.Errorf("leader: create table: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS sandboxd_leases (
		name       TEXT        PRIMARY KEY,
		holder     TEXT        NOT NULL,
		term       BIGINT      NOT NULL,
		expires_at TIMESTAMPTZ NOT NULL
	)`); err != nil {
		return fmt.Errorf("leader: create table: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("leader: create table: %w", err)
	}
	return nil
}

// Holder returns the name this process holds (or waits for) the lease by.
func (l *Lease) Holder() string { return l.holder }

// Close closes the database connections; it does not release the lease.
func (l *Lease) Close() error { return l.db.Close() }

// TryAcquire takes the lease if it is free, has ended, or is already this
// holder's. It reports whether this process now holds it; if not, other
// names the holder.
func (l *Lease) TryAcquire(ctx context.Context) (ok bool, other string, err error) {
	sent := time.Now()
	var term int64
	err = l.db.QueryRowContext(ctx, `INSERT INTO sandboxd_leases AS l (name, holder, term, expires_at)
		VALUES ($1, $2, 1, clock_timestamp() + make_interval(secs => $3))
		ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, term = l.term + 1, expires_at = EXCLUDED.expires_at
		WHERE l.expires_at <= clock_timestamp() OR l.holder = EXCLUDED.holder
		RETURNING term`, l.name, l.holder, l.ttl.Seconds()).Scan(&term)
	switch {
	case err == nil:
		l.term = term
		l.deadline = sent.Add(l.ttl - l.margin())
		l.log.Info("lease acquired", "term", term)
		return true, "", nil
	case errors.Is(err, sql.ErrNoRows):
		other, _, err := l.Status(ctx)
		return false, other, err
	default:
		return false, "", fmt.Errorf("leader: acquire: %w", err)
	}
}

// Acquire waits until this process holds the lease, polling every TTL/4.
// waiting, if not nil, is called when the holder it waits for changes. A
// database that does not answer is retried: the standby outlives an outage
// of the database, as the holder does not.
func (l *Lease) Acquire(ctx context.Context, waiting func(holder string)) error {
	last := ""
	for {
		ok, other, err := l.TryAcquire(ctx)
		switch {
		case ok:
			return nil
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			l.log.Warn("lease: cannot reach the database", "err", err)
		case other != last:
			last = other
			l.log.Info("standby: another sandboxd holds the lease", "active", other)
			if waiting != nil {
				waiting(other)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(l.ttl / 4):
		}
	}
}

// margin is how long before the lease ends the holder gives up: room for
// the clocks' drift and for the holder to stop.
func (l *Lease) margin() time.Duration { return l.ttl / 5 }

// Hold renews the lease every TTL/4 until ctx ends (it returns nil then)
// or the lease is lost: another process holds it, or no renewal succeeded
// before the deadline. Call it after Acquire.
func (l *Lease) Hold(ctx context.Context) error {
	t := time.NewTicker(l.ttl / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := l.renew(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrLost) {
				return err
			}
			if !time.Now().Before(l.deadline) {
				return fmt.Errorf("%w: no renewal succeeded in time: %v", ErrLost, err)
			}
			l.log.Warn("lease: renewal failed; retrying", "err", err, "gives_up_in", time.Until(l.deadline).Round(time.Millisecond))
		}
	}
}

// renew extends the lease by TTL from now, bounded by the deadline: a
// renewal still in flight when it passes no longer counts.
func (l *Lease) renew(ctx context.Context) error {
	sent := time.Now()
	rctx, cancel := context.WithDeadline(ctx, l.deadline)
	defer cancel()
	res, err := l.db.ExecContext(rctx, `UPDATE sandboxd_leases
		SET expires_at = clock_timestamp() + make_interval(secs => $4)
		WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > clock_timestamp()`,
		l.name, l.holder, l.term, l.ttl.Seconds())
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: term %d ended or was taken over", ErrLost, l.term)
	}
	l.deadline = sent.Add(l.ttl - l.margin())
	return nil
}

// Release ends this process' lease at once, so a standby takes over at its
// next poll rather than after the TTL. Call it once this process has
// stopped acting.
func (l *Lease) Release(ctx context.Context) error {
	_, err := l.db.ExecContext(ctx, `UPDATE sandboxd_leases SET expires_at = clock_timestamp()
		WHERE name = $1 AND holder = $2 AND term = $3`, l.name, l.holder, l.term)
	if err != nil {
		return fmt.Errorf("leader: release: %w", err)
	}
	l.log.Info("lease released", "term", l.term)
	return nil
}

// Status returns the lease's holder and its end time on the database's
// clock; "" when nobody ever held it.
func (l *Lease) Status(ctx context.Context) (holder string, expires time.Time, err error) {
	err = l.db.QueryRowContext(ctx, `SELECT holder, expires_at FROM sandboxd_leases WHERE name = $1`, l.name).Scan(&holder, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("leader: status: %w", err)
	}
	return holder, expires, nil
}
