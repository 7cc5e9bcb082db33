package main

import (
	"context"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/tcpcut"
	"github.com/sandboxd/sandboxd/store/pgtest"
)

// TestHAFailover runs several sandboxd on one PostgreSQL store, as two
// hosts would in front of one Incus cluster (here: one host, the local
// backend, one run dir): one active, the others standby. It covers the
// three ways an active one ends: cut off from the database (it must stop
// on its own before a standby takes over), SIGKILL (a standby takes over
// after the lease's TTL) and SIGTERM (it hands the lease over at once).
// After each, the sandboxes made before answer through the new active
// one, which also creates new ones; the env's cleanup then checks that
// nothing is left on the host.
func TestHAFailover(t *testing.T) {
	dsn := pgtest.DSN(t)
	e := newE2EEnv(t)
	const ttl = 2 * time.Second
	e.serveArgs = []string{"--store", dsn, "--lease-ttl", ttl.String()}
	key := e.postgresTenant(t, dsn, "acme")

	// a reaches the database through a proxy the test can cut.
	cut := tcpcut.New(t, tcpcut.Target(t, dsn))
	a := startE2EServer(t, e.launch, e.dataDir, e.runDir, filepath.Join(e.logDir, "a.log"),
		"--store", cut.URL(t, dsn), "--lease-ttl", ttl.String())
	e.setCurrent(a)
	b := e.standby(t, "b", e.dataDir)

	// A standby answers every request 503 with Retry-After, and says who
	// is active.
	h := b.do(t, http.MethodGet, "/health", "", nil)
	wantError(t, "standby's /health", h, http.StatusServiceUnavailable)
	if !strings.Contains(string(h.body), "standby") {
		t.Fatalf("standby's /health: %s, want it to say standby", h.body)
	}
	r := b.api(t, http.MethodGet, "/v2/sandboxes", key, nil)
	wantError(t, "standby's list", r, http.StatusServiceUnavailable)
	if r.header.Get("Retry-After") == "" {
		t.Fatalf("standby's 503 has no Retry-After: %v", r.header)
	}
	if m := b.do(t, http.MethodGet, "/metrics", "", nil); m.status != http.StatusOK || !strings.Contains(string(m.body), "sandboxd_lease_held 0") {
		t.Fatalf("standby's /metrics: %d, want 200 with sandboxd_lease_held 0", m.status)
	}

	id1, tok1 := e.createKept(t, key)
	wantCommand(t, a, id1, tok1)

	// Cut off from the database, a stops on its own (exit 75) before b
	// takes over.
	cut.Cut()
	select {
	case <-a.done:
	case <-time.After(10 * ttl):
		t.Fatalf("a still runs %v after its database was cut off", 10*ttl)
	}
	a.stopped.Store(true)
	var ee *exec.ExitError
	if !errors.As(a.waitErr, &ee) || ee.ExitCode() != exitLeaseLost {
		t.Fatalf("a cut off from the database exited with %v, want status %d", a.waitErr, exitLeaseLost)
	}
	took := e.takeOver(t, b, "a cut off")
	wantCommand(t, b, id1, tok1)
	id2, tok2 := e.createKept(t, key)
	wantCommand(t, b, id2, tok2)
	t.Logf("takeover after a was cut off from the database: %v", took)

	// SIGKILL: c takes over once b's lease has ended.
	c := e.standby(t, "c", e.dataDir)
	if err := b.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took = e.takeOver(t, c, "b killed")
	for _, s := range [][2]string{{id1, tok1}, {id2, tok2}} {
		wantCommand(t, c, s[0], s[1])
	}
	t.Logf("takeover after SIGKILL of the active sandboxd (lease TTL %v): %v", ttl, took)

	// SIGTERM: c hands the lease to d as it exits.
	d := e.standby(t, "d", e.dataDir)
	stopped := time.Now()
	if err := c.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("c's SIGTERM: %v", err)
	}
	exited := time.Since(stopped)
	took = e.takeOver(t, d, "c stopped")
	wantCommand(t, d, id1, tok1)
	d1 := d.get(t, key, id2)
	if d1.State != "running" {
		t.Fatalf("sandbox %s after three handovers: %q, want running", id2, d1.State)
	}
	t.Logf("takeover after SIGTERM of the active sandboxd: %v (its shutdown took %v)", took, exited)
}

// setCurrent makes s the env's server: requests and the cleanup go to it.
func (e *e2eEnv) setCurrent(s *e2eServer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.srv = s
	if !slices.Contains(e.servers, s) {
		e.servers = append(e.servers, s)
	}
}

// postgresTenant makes tenant name with an API key in the PostgreSQL store
// at dsn and returns the key.
func (e *e2eEnv) postgresTenant(t *testing.T, dsn, name string) string {
	t.Helper()
	out, _ := e.sandboxdCLI(t, "keys", "create", "--store", dsn, "--tenant", name)
	key := strings.TrimSpace(out)
	if !e2eKeyRE.MatchString(key) {
		t.Fatalf("sandboxd keys create --store: %q", out)
	}
	e.keys[name] = key
	return key
}

// standby starts a sandboxd on the env's store, with its own dataDir (the
// env's when it stands for the same host), that waits for the lease: it
// must answer /health 503 and keep running. It is killed at cleanup unless
// it became the env's server.
func (e *e2eEnv) standby(t *testing.T, name, dataDir string) *e2eServer {
	t.Helper()
	s, err := launchE2EServer(e.launch, dataDir, e.runDir, filepath.Join(e.logDir, name+".log"), e.serveArgs...)
	if err != nil {
		t.Fatal(err)
	}
	// Its log is checked for races and shown on failure with the others'.
	e.mu.Lock()
	e.servers = append(e.servers, s)
	e.mu.Unlock()
	t.Cleanup(func() {
		if e.current() != s {
			_ = s.stop(syscall.SIGKILL)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if !s.running() {
			t.Fatalf("standby %s exited: %v\n%s", name, s.waitErr, e2eTail(s.logs(), 40))
		}
		r, err := s.tryDo(http.MethodGet, "/health", "", nil, nil)
		if err == nil && r.status == http.StatusServiceUnavailable && strings.Contains(string(r.body), "is active") {
			return s
		}
		if err == nil && r.status == http.StatusOK {
			t.Fatalf("standby %s answers /health 200 while another holds the lease", name)
		}
		if time.Now().After(deadline) {
			t.Fatalf("standby %s: /health never said another sandboxd is active (last %v %v)", name, r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// takeOver waits until s serves (after why) and makes it the env's server;
// it returns how long that took.
func (e *e2eEnv) takeOver(t *testing.T, s *e2eServer, why string) time.Duration {
	t.Helper()
	start := time.Now()
	if err := s.waitHealthy(90 * time.Second); err != nil {
		t.Fatalf("no takeover after %s: %v\n%s", why, err, e2eTail(e2eWithoutAccessLog(s.logs()), 40))
	}
	e.setCurrent(s)
	return time.Since(start)
}

// wantCommand runs a command in sandbox id through s and checks its output.
func wantCommand(t *testing.T, s *e2eServer, id, tok string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := s.run(ctx, id, tok, "echo $SBX_KEPT alive")
	if err != nil || !strings.HasSuffix(strings.TrimSpace(res.stdout), "alive") || !strings.HasPrefix(res.stdout, "kept ") {
		t.Fatalf("command in %s through %s: %+v %v", id, s.base, res, err)
	}
}
