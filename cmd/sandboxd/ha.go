package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/leader"
	"github.com/sandboxd/sandboxd/server"
	"github.com/sandboxd/sandboxd/store"
)

const storeUsage = "durable state: empty for SQLite in --data-dir; a postgres:// URL for PostgreSQL, which several sandboxd may share, one active and the others standby (docs/ha.md)"

// exitLeaseLost is serve's exit status when it lost the lease: EX_TEMPFAIL,
// so a supervisor restarts it, as a standby.
const exitLeaseLost = 75

func isPostgres(storeURL string) bool {
	return strings.HasPrefix(storeURL, "postgres://") || strings.HasPrefix(storeURL, "postgresql://")
}

// openStore opens the PostgreSQL store storeURL names, or the SQLite one in
// dataDir when it is empty.
func openStore(ctx context.Context, dataDir, storeURL string) (*store.Store, error) {
	switch {
	case isPostgres(storeURL):
		return store.OpenPostgres(ctx, storeURL)
	case storeURL != "":
		return nil, fmt.Errorf("--store %q: want empty (SQLite in --data-dir) or a postgres:// URL", redactURL(storeURL))
	case dataDir == "":
		return nil, errors.New("--data-dir is required")
	}
	return store.Open(ctx, dataDir)
}

// redactURL hides a password in an error message.
func redactURL(s string) string {
	if at := strings.LastIndex(s, "@"); at >= 0 {
		if scheme := strings.Index(s, "://"); scheme >= 0 && scheme < at {
			return s[:scheme+3] + "…" + s[at:]
		}
	}
	return s
}

// holdLease waits, as a standby, until this process holds the lease of the
// store at storeURL, then keeps it. A holder that cannot renew it in time
// exits the process at once, without a graceful shutdown (which would
// write to the store and touch sandboxes), before a standby can take
// over: what it leaves is what a crash leaves, and the next holder's
// reconcile adopts or removes it. release, called once serving has
// stopped, hands the lease over at once. A nil release with a nil error:
// ctx ended while waiting.
func holdLease(ctx context.Context, storeURL string, ttl time.Duration, front *server.Front, metrics *server.Metrics, log *slog.Logger) (release func(), err error) {
	l, err := leader.Open(ctx, storeURL, leader.Options{TTL: ttl, Log: log.With("component", "leader")})
	if err != nil {
		return nil, err
	}
	held := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sandboxd_lease_held",
		Help: "1 while this sandboxd holds the store's lease (it is the active one), 0 while it is a standby.",
	})
	metrics.Registry().MustRegister(held)
	front.Wait("standby: waiting for the store's lease")
	err = l.Acquire(ctx, func(holder string) {
		front.Wait("standby: sandboxd " + holder + " is active")
	})
	if err != nil {
		l.Close()
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, err
	}
	held.Set(1)
	front.Wait("starting")
	holdCtx, stopHold := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := l.Hold(holdCtx); err != nil {
			log.Error("lost the store's lease: exiting so that a standby takes over", "err", err)
			os.Exit(exitLeaseLost)
		}
	}()
	return func() {
		stopHold()
		<-done
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.Release(rctx); err != nil {
			log.Warn("release the lease", "err", err)
		}
		held.Set(0)
		l.Close()
	}, nil
}
