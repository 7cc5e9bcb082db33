package main

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// e2eGauge reads one series of /metrics (0 when absent).
func (s *e2eServer) gauge(t *testing.T, series string) float64 {
	t.Helper()
	r := s.do(t, http.MethodGet, "/metrics", "", nil)
	for l := range strings.SplitSeq(string(r.body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// waitSpare waits until the spare pool of base holds n ready members.
func waitSpare(t *testing.T, s *e2eServer, n int) {
	t.Helper()
	e2eEventually(t, fmt.Sprintf("%d ready spare members of base", n), time.Minute, 50*time.Millisecond, func() (bool, string) {
		got := s.gauge(t, `sandboxd_spare_members{state="ready",template="base"}`)
		return int(got) == n, fmt.Sprintf("%v ready", got)
	})
}

// TestSparePool: with --spare-min base=2, sandboxd keeps two never-used
// members of base that any tenant's create claims (served_from=spare),
// each getting its tenant's env, metadata and token at claim and nothing
// of another tenant; the pool refills; a tenant's own min_warm pool is
// claimed before it; after a SIGKILL the next sandboxd removes the spare
// members (backend sandboxes without a row) and keeps the tenants'
// sandboxes.
func TestSparePool(t *testing.T) {
	e := newE2EEnv(t, "alice", "bob")
	e.serveArgs = []string{"--spare-min=base=2", "--pool-lead=-1s"}
	s := e.start()
	waitSpare(t, s, 2)
	var spareReady []string
	for _, l := range s.logLines() {
		if l["action"] == "spare_ready" && l["audit"] == true {
			spareReady = append(spareReady, fmt.Sprint(l["member"]))
		}
	}
	if len(spareReady) != 2 {
		t.Fatalf("audit lines of spare members ready: %v, want 2", spareReady)
	}

	var ids []string
	for _, who := range []string{"alice", "bob"} {
		sb, _ := e.create(t, "/v2/sandboxes", e.keys[who], map[string]any{
			"allow_internet_access": true, "secure": true,
			"envVars": map[string]string{"WHO": who}, "metadata": map[string]string{"who": who},
		})
		ids = append(ids, sb.SandboxID)
		if !slices.Contains(spareReady, sb.SandboxID) {
			t.Errorf("%s's sandbox %s is not one of the spare members %v", who, sb.SandboxID, spareReady)
		}
		if l := e2eAuditLine(s, "create", sb.SandboxID); l == nil || l["served_from"] != "spare" || l["tenant"] != who {
			t.Errorf("%s's create audit line: %v, want served_from=spare", who, l)
		}
		out := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "echo $WHO")
		if out.stdout != who+"\n" {
			t.Errorf("%s's spare sandbox runs with %q, want its own env", who, out.stdout)
		}
		if d := s.get(t, e.keys[who], sb.SandboxID); d.Metadata["who"] != who {
			t.Errorf("%s's sandbox metadata %v", who, d.Metadata)
		}
	}
	// Another tenant's key does not reach it (it is alice's from the claim).
	if r := s.api(t, http.MethodGet, "/sandboxes/"+ids[0], e.keys["bob"], nil); r.status != http.StatusNotFound {
		t.Errorf("bob GETs alice's spare-served sandbox: %s, want 404", r)
	}
	waitSpare(t, s, 2) // the claims refilled it
	if hits := s.gauge(t, `sandboxd_spare_claims_total{result="hit",template="base"}`); hits != 2 {
		t.Errorf("spare hits = %v, want 2", hits)
	}
	if got := s.gauge(t, `sandboxd_pool_claims_total{result="spare",template="base",tenant="alice"}`); got != 1 {
		t.Errorf("alice's claims served by the spare pool = %v, want 1", got)
	}

	// A tenant's own min_warm is a reservation claimed before the spare pool.
	e.sandboxdCLI(t, "tenants", "set", "alice", "--data-dir", e.dataDir, "--min-warm", "1")
	e2eEventually(t, "alice's own warm member", time.Minute, 50*time.Millisecond, func() (bool, string) {
		got := s.gauge(t, `sandboxd_pool_members{state="ready",template="base",tenant="alice"}`)
		return got == 1, fmt.Sprintf("%v ready", got)
	})
	own, _ := e.create(t, "/v2/sandboxes", e.keys["alice"], map[string]any{"allow_internet_access": true})
	ids = append(ids, own.SandboxID)
	if l := e2eAuditLine(s, "create", own.SandboxID); l == nil || l["served_from"] != "pool" {
		t.Errorf("alice's create with min_warm 1: %v, want served_from=pool", l)
	}
	e.sandboxdCLI(t, "tenants", "set", "alice", "--data-dir", e.dataDir, "--min-warm", "0")

	// SIGKILL: the spare members are left in the backend without rows.
	waitSpare(t, s, 2)
	before := e2eStateDirs(e)
	if err := s.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s = e.start()
	waitSpare(t, s, 2) // its own, new ones
	var left []string
	for _, id := range before {
		if slices.Contains(e2eStateDirs(e), id) && !slices.Contains(ids, id) {
			left = append(left, id)
		}
	}
	if len(left) > 0 {
		t.Errorf("the spare members of the killed sandboxd are still on the host: %v", left)
	}
	for i, id := range ids[:2] {
		who := []string{"alice", "bob"}[i]
		if d := s.get(t, e.keys[who], id); d.State != "running" {
			t.Errorf("%s's sandbox %s after the restart: %s", who, id, d.State)
		}
	}
}

// TestSpareOff: --spare=false keeps no spare pool, whatever --spare-min
// says; creates are served by the tenant's own pools or cold.
func TestSpareOff(t *testing.T) {
	e := newE2EEnv(t, "alice")
	e.serveArgs = []string{"--spare=false", "--spare-min=base=2"}
	s := e.start()
	sb, _ := e.create(t, "/v2/sandboxes", e.keys["alice"], map[string]any{"allow_internet_access": true})
	if l := e2eAuditLine(s, "create", sb.SandboxID); l == nil || l["served_from"] != "cold" {
		t.Errorf("create with --spare=false: %v, want served_from=cold", l)
	}
	if got := s.gauge(t, `sandboxd_spare_target{template="base"}`); got != 0 {
		t.Errorf("spare target with --spare=false: %v", got)
	}
}

// TestLoneTenantBurstDefaults: with the default settings (no per-tenant
// create rate, the host's capacity shared work-conservingly), a lone
// tenant's burst of 100 concurrent creates all succeed: no 429. An explicit
// per-tenant limit (tenants set --create-rate) still answers 429 with
// Retry-After and E2B's error body.
func TestLoneTenantBurstDefaults(t *testing.T) {
	e := newE2EEnv(t, "a")
	e.launch.unset = []string{"SANDBOXD_CREATE_RATE"} // the flag's default
	e.serveArgs = []string{"--spare-min=base=2"}
	s := e.start()
	key := e.keys["a"]
	burst := func(n int) (created, limited int) {
		type res struct {
			r   e2eResponse
			err error
		}
		out := make(chan res, n)
		for range n {
			go func() { // ends with its request
				r, err := s.tryDo(http.MethodPost, e2eAPIPrefix+"/sandboxes", key,
					map[string]any{"templateID": "base", "allow_internet_access": true, "timeout": 300}, nil)
				out <- res{r, err}
			}()
		}
		for range n {
			x := <-out
			switch {
			case x.err != nil:
				t.Errorf("create: %v", x.err)
			case x.r.status == http.StatusCreated:
				created++
				e.track(wantSandboxBody(t, "create", x.r.body).SandboxID, key)
			case x.r.status == http.StatusTooManyRequests:
				limited++
				wantError(t, "a create over the limit", x.r, http.StatusTooManyRequests)
				if ra := x.r.header.Get("Retry-After"); ra == "" {
					t.Errorf("429 without Retry-After")
				}
			default:
				t.Errorf("create: %s, want 201 or 429", x.r)
			}
		}
		return created, limited
	}
	if created, limited := burst(100); created != 100 || limited != 0 {
		t.Fatalf("a lone tenant's 100 concurrent creates with the defaults: %d created, %d × 429; want 100 and 0", created, limited)
	}

	e.sandboxdCLI(t, "tenants", "set", "a", "--data-dir", e.dataDir, "--create-rate", "1", "--create-burst", "2")
	// The setting applies once sandboxd re-reads it (--settings-poll);
	// then a burst of 6 passes at most the bucket's 2 (and a refill).
	e2eEventually(t, "429s at the explicit limit", time.Minute, 500*time.Millisecond, func() (bool, string) {
		created, limited := burst(6)
		return created <= 3 && limited >= 3, fmt.Sprintf("%d created, %d × 429", created, limited)
	})
}

// TestClaimDefersEnvdInit: a create served from the spare pool answers
// before the member's envd has its /init (audit envd_init=deferred); the
// /init runs in the background, and the sandbox's first requests find its
// token and env vars in force. After a SIGKILL the next sandboxd sends
// /init again with the sandbox's first request, which the real envd takes
// (the same token). With --defer-claim-init=false the create waits for it.
func TestClaimDefersEnvdInit(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // the create's audit envd_init
	}{
		{"default", nil, "deferred"},
		{"off", []string{"--defer-claim-init=false"}, "create"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newE2EEnv(t, "alice")
			e.serveArgs = append([]string{"--spare-min=base=2", "--pool-lead=-1s", "--log-level=debug"}, tc.args...)
			s := e.start()
			waitSpare(t, s, 2)
			key := e.keys["alice"]
			sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{
				"allow_internet_access": true, "secure": true, "timeout": 600, "envVars": map[string]string{"WHO": "alice"},
			})
			id, tok := sb.SandboxID, *sb.EnvdAccessToken
			if l := e2eAuditLine(s, "create", id); l == nil || l["served_from"] != "spare" || l["envd_init"] != tc.want {
				t.Fatalf("create audit line %v; want served_from=spare, envd_init=%s", l, tc.want)
			}
			check := func(s *e2eServer) {
				t.Helper()
				wantStatus(t, "GET /files without the token", s.envd(t, id, "", http.MethodGet, "/files?path=/etc/hostname", nil, ""), http.StatusUnauthorized)
				if out := s.mustRun(t, id, tok, "echo $WHO"); out.stdout != "alice\n" {
					t.Errorf("the claimed sandbox runs with WHO=%q, want its create's env", out.stdout)
				}
			}
			check(s)
			if tc.want != "deferred" {
				return
			}
			// By the claim in the background, unless the first request
			// came before that goroutine ran.
			claimed, dialled := s.gauge(t, `sandboxd_envd_deferred_inits_total{by="claim",result="ok"}`), s.gauge(t, `sandboxd_envd_deferred_inits_total{by="dial",result="ok"}`)
			if claimed+dialled != 1 {
				t.Errorf("deferred /init counted %v times by the claim and %v by a request, want once", claimed, dialled)
			}
			if err := s.stop(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			s2 := e.start()
			check(s2)
			reinit := false
			for _, l := range s2.logLines() {
				reinit = reinit || (l["msg"] == "deferred envd /init" && l["sandbox_id"] == id && l["by"] == "dial" && l["err"] == nil)
			}
			if !reinit {
				t.Error("no deferred /init by the first request after the restart")
			}
			if n := s2.gauge(t, `sandboxd_envd_deferred_inits_total{by="dial",result="ok"}`); n != 1 {
				t.Errorf("deferred /init by a request counted %v times after the restart, want 1", n)
			}
			wantStatus(t, "kill", s2.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
		})
	}
}
