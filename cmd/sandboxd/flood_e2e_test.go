package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestTenantFlood proves per-tenant rate limits on the real local backend: tenant a
// floods creates at 10× its create rate for 10 s while tenant b creates at
// its own rate. a gets 429s with Retry-After, X-RateLimit-* and E2B's error
// body; b gets no 429 and every create of b succeeds; a never gets more
// than its token bucket allows. Then everything is killed and sandboxd
// stopped, and nothing may be left: no sandbox listed, no state dir, no
// cgroup under the run dir's cgroup parent, no mount under the run dir.
//
// The limits are set per tenant with `sandboxd tenants set` (the server's
// defaults stay off, as in every e2e test). Warm pools stay at their
// defaults, so a's misses also grow an adaptive pool whose members the
// stop must drain.
func TestTenantFlood(t *testing.T) {
	const (
		rate     = 2.0 // creates per second, both tenants
		burstA   = 2
		burstB   = 4 // b sends at exactly its rate: slack for scheduling jitter
		duration = 10 * time.Second
	)
	e := newE2EEnv(t, "a", "b")
	e.sandboxdCLI(t, "tenants", "set", "a", "--data-dir", e.dataDir,
		"--create-rate", fmt.Sprint(rate), "--create-burst", strconv.Itoa(burstA))
	e.sandboxdCLI(t, "tenants", "set", "b", "--data-dir", e.dataDir,
		"--create-rate", fmt.Sprint(rate), "--create-burst", strconv.Itoa(burstB))
	s := e.start()
	keyA, keyB := e.keys["a"], e.keys["b"]
	body := map[string]any{"templateID": "base", "allow_internet_access": false}

	type result struct {
		r   e2eResponse
		err error
	}
	var (
		mu       sync.Mutex
		resultsA []result
		resultsB []result
		wg       sync.WaitGroup
	)
	send := func(key string, into *[]result) {
		r, err := s.tryDo(http.MethodPost, e2eAPIPrefix+"/v2/sandboxes", key, body, nil)
		if err == nil && r.status == http.StatusCreated {
			var sb e2eSandbox
			if json.Unmarshal(r.body, &sb) == nil && sb.SandboxID != "" {
				e.track(sb.SandboxID, key)
			}
		}
		mu.Lock()
		*into = append(*into, result{r, err})
		mu.Unlock()
	}
	// Tickers pace both tenants; one that falls behind drops ticks, so
	// neither ever sends faster than its pace.
	start := time.Now()
	wg.Go(func() { // a: 10× its rate, without waiting for answers
		tick := time.NewTicker(time.Duration(float64(time.Second) / (10 * rate)))
		defer tick.Stop()
		for time.Since(start) < duration {
			<-tick.C
			wg.Go(func() { send(keyA, &resultsA) })
		}
	})
	wg.Go(func() { // b: its own rate, one create at a time
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for time.Since(start) < duration {
			send(keyB, &resultsB)
			<-tick.C
		}
	})
	wg.Wait()
	elapsed := time.Since(start)

	createdA, limitedA := 0, 0
	for i, res := range resultsA {
		what := fmt.Sprintf("tenant a's create %d", i)
		switch {
		case res.err != nil:
			t.Errorf("%s: %v", what, res.err)
		case res.r.status == http.StatusCreated:
			createdA++
		case res.r.status == http.StatusTooManyRequests:
			limitedA++
			wantError(t, what, res.r, http.StatusTooManyRequests)
			wantFloodHeaders(t, what, res.r, burstA)
		default:
			t.Errorf("%s: got %s, want 201 or 429", what, res.r)
		}
	}
	if limitedA == 0 {
		t.Errorf("tenant a sent %d creates at 10× its rate; none got 429", len(resultsA))
	}
	// A token bucket lets at most burst + rate × elapsed through, however
	// fast or slow the host is.
	if most := burstA + int(rate*elapsed.Seconds()) + 1; createdA > most {
		t.Errorf("tenant a got %d creates through in %v; its bucket (rate %g, burst %d) allows at most %d",
			createdA, elapsed, rate, burstA, most)
	}
	if createdA == 0 {
		t.Errorf("tenant a got no create through at all (%d refused)", limitedA)
	}
	for i, res := range resultsB {
		switch {
		case res.err != nil:
			t.Errorf("tenant b's create %d: %v", i, res.err)
		case res.r.status != http.StatusCreated:
			t.Errorf("tenant b's create %d during a's flood: got %s, want 201", i, res.r)
		}
	}
	t.Logf("in %v: a sent %d creates, %d created, %d refused with 429; b sent %d",
		elapsed.Round(time.Millisecond), len(resultsA), createdA, limitedA, len(resultsB))

	// The leak checks below must look where the sandboxes are: while they
	// live, those places hold them.
	if cgs := e2eChildCgroups(cgroupParent(e.runDir)); len(cgs) == 0 {
		t.Errorf("no cgroup under the run dir's cgroup parent %s while %d sandboxes live", cgroupParent(e.runDir), len(e.sandboxIDs()))
	}
	if len(e2eStateDirs(e)) == 0 || len(e2eMountsUnder(e.runDir)) == 0 {
		t.Errorf("no state dir or mount under %s while %d sandboxes live", e.runDir, len(e.sandboxIDs()))
	}

	// Kill everything through the API; the kills are lifecycle calls, which
	// a's create limit must not hold up.
	for _, id := range e.sandboxIDs() {
		e.mu.Lock()
		key := e.created[id]
		e.mu.Unlock()
		r := s.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil)
		wantStatus(t, "DELETE /sandboxes/"+id, r, http.StatusNoContent)
	}
	for name, key := range map[string]string{"a": keyA, "b": keyB} {
		if left, _ := s.list(t, key, ""); len(left) > 0 {
			t.Errorf("tenant %s still lists %v after killing every sandbox", name, e2eIDs(left))
		}
	}
	// Stopping sandboxd drains the warm pools; after that nothing of any
	// sandbox, warm or not, may be on the host.
	if err := s.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("stop sandboxd: %v", err)
	}
	if dirs := e2eStateDirs(e); len(dirs) > 0 {
		t.Errorf("state dirs left in %s: %v", filepath.Join(e.runDir, "sandboxes"), dirs)
	}
	if ms := e2eMountsUnder(e.runDir); len(ms) > 0 {
		t.Errorf("mounts left under %s: %v", e.runDir, ms)
	}
	if cgs := e2eChildCgroups(cgroupParent(e.runDir)); len(cgs) > 0 {
		t.Errorf("cgroups left under the run dir's cgroup parent: %v", cgs)
	}
	// With nothing left under it, sandboxd removed the parent itself.
	v1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", cgroupParent(e.runDir)))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", cgroupParent(e.runDir)))
	if left := append(v1, v2...); len(left) > 0 {
		t.Errorf("the run dir's empty cgroup parent left after a clean stop: %v", left)
	}
}

// wantFloodHeaders checks a 429's Retry-After (whole seconds, at least 1)
// and X-RateLimit-* headers (limit = the bucket size, remaining 0, reset a
// Unix time).
func wantFloodHeaders(t *testing.T, what string, r e2eResponse, burst int) {
	t.Helper()
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("%s: Retry-After %q, want whole seconds >= 1", what, r.header.Get("Retry-After"))
	}
	if l := r.header.Get("X-RateLimit-Limit"); l != strconv.Itoa(burst) {
		t.Errorf("%s: X-RateLimit-Limit %q, want %d", what, l, burst)
	}
	if rem := r.header.Get("X-RateLimit-Remaining"); rem != "0" {
		t.Errorf("%s: X-RateLimit-Remaining %q, want 0", what, rem)
	}
	if reset, err := strconv.ParseInt(r.header.Get("X-RateLimit-Reset"), 10, 64); err != nil || reset <= 0 {
		t.Errorf("%s: X-RateLimit-Reset %q, want a Unix time", what, r.header.Get("X-RateLimit-Reset"))
	}
}

// e2eChildCgroups lists the cgroups below parent in every hierarchy.
func e2eChildCgroups(parent string) []string {
	v1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", parent))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", parent))
	var out []string
	for _, dir := range append(v1, v2...) {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			out = append(out, err.Error())
		}
		for _, ent := range ents {
			if ent.IsDir() {
				out = append(out, filepath.Join(dir, ent.Name()))
			}
		}
	}
	return out
}
