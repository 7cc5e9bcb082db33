package leader

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/tcpcut"
	"github.com/sandboxd/sandboxd/store/pgtest"
)

// open opens holder's lease on d, closed at cleanup.
func open(t *testing.T, d, holder string, ttl time.Duration) *Lease {
	t.Helper()
	l, err := Open(t.Context(), d, Options{Holder: holder, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// holding returns a, holding the lease of a fresh database, and b, not.
func holding(t *testing.T, ttl time.Duration) (a, b *Lease) {
	t.Helper()
	d := pgtest.DSN(t)
	a, b = open(t, d, "a", ttl), open(t, d, "b", ttl)
	if ok, _, err := a.TryAcquire(t.Context()); !ok || err != nil {
		t.Fatalf("a acquires a free lease: ok=%v err=%v", ok, err)
	}
	return a, b
}

func TestOneHolderAtATime(t *testing.T) {
	a, b := holding(t, time.Second)
	ctx := t.Context()
	ok, other, err := b.TryAcquire(ctx)
	if ok || err != nil || other != "a" {
		t.Fatalf("b while a holds: ok=%v other=%q err=%v, want false, a, nil", ok, other, err)
	}
	// Acquiring again is a renewal of the holder's own lease.
	if ok, _, err := a.TryAcquire(ctx); !ok || err != nil {
		t.Fatalf("a again: ok=%v err=%v", ok, err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := b.TryAcquire(ctx); !ok || err != nil {
		t.Fatalf("b after a released: ok=%v err=%v", ok, err)
	}
	holder, _, err := a.Status(ctx)
	if err != nil || holder != "b" {
		t.Fatalf("status: %q %v, want b", holder, err)
	}
	// a's old term is over: renewing it must not steal b's lease.
	if err := a.renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("a renews an ended term: %v, want ErrLost", err)
	}
}

// A holder that stops renewing (a crash) loses the lease after the TTL,
// and not before; its late renewal then fails.
func TestTakeoverAfterTTL(t *testing.T) {
	ttl := 800 * time.Millisecond
	a, b := holding(t, ttl)
	ctx := t.Context()
	acquired := time.Now()
	if err := b.Acquire(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(acquired); waited < ttl-a.margin() {
		t.Fatalf("b took the lease %v after a did, before its TTL %v", waited, ttl)
	}
	if err := a.Hold(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("a holds after the takeover: %v, want ErrLost", err)
	}
}

// While Hold runs, the lease is kept past many TTLs; cancelling Hold
// returns nil.
func TestHoldRenews(t *testing.T) {
	ttl := 400 * time.Millisecond
	a, b := holding(t, ttl)
	ctx, cancel := context.WithCancel(t.Context())
	held := make(chan error, 1)
	go func() { held <- a.Hold(ctx) }()
	for range 10 {
		time.Sleep(ttl / 2)
		if ok, other, err := b.TryAcquire(t.Context()); ok || err != nil || other != "a" {
			t.Fatalf("b while a holds and renews: ok=%v other=%q err=%v", ok, other, err)
		}
	}
	cancel()
	if err := <-held; err != nil {
		t.Fatalf("Hold after cancel: %v", err)
	}
}

// A holder cut off from the database gives up before its lease ends, so
// it has stopped by the time a standby takes over.
func TestHoldGivesUpWhenCutOff(t *testing.T) {
	d := pgtest.DSN(t)
	ttl := time.Second
	p := tcpcut.New(t, tcpcut.Target(t, d))
	a := open(t, p.URL(t, d), "a", ttl)
	b := open(t, d, "b", ttl)
	if ok, _, err := a.TryAcquire(t.Context()); !ok || err != nil {
		t.Fatalf("a: ok=%v err=%v", ok, err)
	}
	held := make(chan error, 1)
	go func() { held <- a.Hold(t.Context()) }()
	time.Sleep(ttl / 2)
	p.Cut()
	var gaveUp time.Time
	select {
	case err := <-held:
		gaveUp = time.Now()
		if !errors.Is(err, ErrLost) {
			t.Fatalf("Hold cut off: %v, want ErrLost", err)
		}
	case <-time.After(5 * ttl):
		t.Fatal("Hold still holds 5 TTLs after the database was cut off")
	}
	if err := b.Acquire(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Now(); took.Before(gaveUp) {
		t.Fatalf("b took over at %v, before a gave up at %v", took, gaveUp)
	}
}

func TestOpenRejectsShortTTL(t *testing.T) {
	if _, err := Open(t.Context(), "postgres://127.0.0.1:1/x", Options{TTL: time.Millisecond}); err == nil {
		t.Fatal("a 1ms TTL was accepted")
	}
}
