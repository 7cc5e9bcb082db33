package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/incus"
	sbxruntime "github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store/pgtest"
)

// The test cluster of scripts/incus-cluster.sh: three Incus members in
// system containers of this host's Incus. Its env file names the cluster
// and sandboxd's certificates; without it the cluster tests skip.
const clusterEnvFile = "/var/lib/sandboxd-cluster/env"

var clusterScript = filepath.Join("..", "..", "scripts", "incus-cluster.sh")

// loadClusterEnv reads the env file's KEY=VALUE lines.
func loadClusterEnv(t *testing.T) map[string]string {
	t.Helper()
	if e2eSkipReason != "" {
		t.Skip(e2eSkipReason)
	}
	f, err := os.Open(clusterEnvFile)
	if err != nil {
		t.Skipf("no test cluster (scripts/incus-cluster.sh up): %v", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if ok && !strings.HasPrefix(k, "#") {
			env[k] = strings.Trim(v, `"`)
		}
	}
	return env
}

// clusterServeArgs are the flags of a sandboxd serving the test cluster.
func clusterServeArgs(env map[string]string) []string {
	return []string{"--backend", "incus",
		"--incus-remote", env["SANDBOXD_INCUS_URL"],
		"--incus-client-cert", env["SANDBOXD_INCUS_CLIENT_CERT"], "--incus-client-key", env["SANDBOXD_INCUS_CLIENT_KEY"],
		"--incus-server-cert", env["SANDBOXD_INCUS_SERVER_CERT"],
		"--incus-simple-quotas",
	}
}

// clusterClient is an Incus client of the test cluster, as sandboxd's.
func clusterClient(t *testing.T, env map[string]string) *incus.Client {
	t.Helper()
	cfg, err := incus.LoadRemoteConfig(env["SANDBOXD_INCUS_URL"], env["SANDBOXD_INCUS_CLIENT_CERT"],
		env["SANDBOXD_INCUS_CLIENT_KEY"], env["SANDBOXD_INCUS_SERVER_CERT"])
	if err != nil {
		t.Fatal(err)
	}
	c, err := incus.NewRemoteClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// clusterLocation returns the member sandbox id's instance is on.
func clusterLocation(t *testing.T, c *incus.Client, id string) string {
	t.Helper()
	in, err := c.Instance(t.Context(), incus.InstanceName("", id))
	if err != nil {
		t.Fatalf("instance of %s: %v", id, err)
	}
	return in.Location
}

// clusterCmd runs scripts/incus-cluster.sh with args.
func clusterCmd(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{clusterScript}, args...)...)
	cmd.Env = append(os.Environ(), "SANDBOXD_BIN="+e2eBinDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("incus-cluster.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestIncusClusterE2E drives the three-member test cluster through
// `sandboxd serve --backend incus --incus-remote`: spare members and
// sandboxes spread over the members, commands through the relays, a member
// killed (its sandboxes answer 502, then are reported gone; creates go on
// elsewhere at once), the member back (its lost instances deleted), and
// sandboxd SIGKILLed and restarted (every sandbox on the live members
// adopted).
func TestIncusClusterE2E(t *testing.T) {
	env := loadClusterEnv(t)
	// This build's envd and relay on every member.
	clusterCmd(t, "push")
	c := clusterClient(t, env)
	ctx := t.Context()
	ms, err := c.ClusterMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Status != "Online" {
			t.Fatalf("cluster member %s is %s before the test", m.Name, m.Status)
		}
	}
	if len(ms) != 3 {
		t.Fatalf("%d cluster members; want 3", len(ms))
	}
	locationOf := func(id string) string { return clusterLocation(t, c, id) }

	e := newSerialE2EEnv(t, "a", "b")
	e.serveArgs = append(clusterServeArgs(env), "--incus-member-lost-after", "3s", "--spare-min", "base=3")
	stopped := false
	t.Cleanup(func() {
		if stopped {
			clusterCmd(t, "start", "2")
		}
	})
	s := e.start()
	ka, kb := e.keys["a"], e.keys["b"]

	// Spare members: one on each member (placement by memory share).
	e2eEventually(t, "3 spare members ready", 2*time.Minute, 200*time.Millisecond, func() (bool, string) {
		n := s.gauge(t, `sandboxd_spare_members{state="ready",template="base"}`)
		return n >= 3, fmt.Sprint(n)
	})
	spares := map[string]int{}
	ins, err := c.Instances(ctx, "user.sandboxd.id")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range ins {
		spares[in.Location]++
	}
	if len(spares) != 3 {
		t.Errorf("spare members by cluster member: %v; want all three", spares)
	}

	// Sandboxes of two tenants, on all three members; each runs a command.
	byMember := map[string][]string{}
	tokens := map[string]string{}
	for i := range 6 {
		key := ka
		if i%2 == 1 {
			key = kb
		}
		sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 600})
		tokens[sb.SandboxID] = *sb.EnvdAccessToken
		loc := locationOf(sb.SandboxID)
		byMember[loc] = append(byMember[loc], sb.SandboxID)
		if r := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "echo on-"+loc); r.stdout != "on-"+loc+"\n" {
			t.Fatalf("command in %s: %q", sb.SandboxID, r.stdout)
		}
	}
	if len(byMember) != 3 {
		t.Fatalf("sandboxes by member: %v; want all three members used", byMember)
	}
	t.Logf("sandboxes by member: %v", byMember)
	keyOf := func(id string) string {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.created[id]
	}

	// m2 dies.
	victims := byMember["m2"]
	if len(victims) == 0 {
		t.Fatal("no sandbox on m2")
	}
	killed := time.Now()
	clusterCmd(t, "stop", "2")
	stopped = true
	// Creates go on elsewhere.
	var firstOK time.Duration
	for time.Since(killed) < time.Minute {
		r, err := s.tryDo(http.MethodPost, e2eAPIPrefix+"/v2/sandboxes", ka, map[string]any{"templateID": "base", "allow_internet_access": false, "timeout": 600}, nil)
		if err == nil && r.status == http.StatusCreated {
			sb := wantSandboxBody(t, "POST /v2/sandboxes", r.body)
			e.track(sb.SandboxID, ka)
			if loc := locationOf(sb.SandboxID); loc == "m2" {
				t.Fatalf("a create after m2 died went to m2")
			}
			firstOK = time.Since(killed)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if firstOK == 0 {
		t.Fatal("no create succeeded within a minute of m2's death")
	}
	t.Logf("first create elsewhere %v after m2 was stopped", firstOK)
	// m2's sandboxes: no command runs, then they are reported gone.
	for _, id := range victims {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		if _, err := s.run(rctx, id, tokens[id], "true"); err == nil {
			t.Errorf("a command ran in %s after its member died", id)
		}
		cancel()
	}
	e2eEventually(t, "m2's sandboxes reported gone", time.Minute, 200*time.Millisecond, func() (bool, string) {
		for _, id := range victims {
			if r := s.api(t, http.MethodGet, "/sandboxes/"+id, keyOf(id), nil); r.status != http.StatusNotFound {
				return false, fmt.Sprintf("%s: %d", id, r.status)
			}
		}
		return true, ""
	})
	t.Logf("m2's sandboxes reported gone %v after it was stopped", time.Since(killed))
	for _, id := range slices.Concat(byMember["m1"], byMember["m3"]) {
		s.mustRun(t, id, tokens[id], "true")
	}

	// m2 returns: its lost instances are deleted.
	clusterCmd(t, "start", "2")
	stopped = false
	e2eEventually(t, "m2's lost instances deleted", 2*time.Minute, 500*time.Millisecond, func() (bool, string) {
		left := incusInstancesOf(t, c, victims)
		return len(left) == 0, fmt.Sprint(left)
	})

	// sandboxd killed and restarted: every live sandbox is adopted.
	if err := s.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s = e.start()
	for _, id := range slices.Concat(byMember["m1"], byMember["m3"]) {
		if d := s.get(t, keyOf(id), id); d.State != "running" {
			t.Errorf("%s after the restart: %s", id, d.State)
		}
		s.mustRun(t, id, tokens[id], "true")
	}
}

// TestIncusClusterHA runs two sandboxd on one PostgreSQL store in front of
// the test cluster, each with its own data dir as on two hosts: sandboxes
// made through the active one on every member answer through the standby
// once it has taken over from the SIGKILLed active one, which creates on
// the cluster in turn.
func TestIncusClusterHA(t *testing.T) {
	env := loadClusterEnv(t)
	dsn := pgtest.DSN(t)
	clusterCmd(t, "push")
	e := newSerialE2EEnv(t)
	const ttl = 2 * time.Second
	e.serveArgs = append(clusterServeArgs(env), "--store", dsn, "--lease-ttl", ttl.String())
	key := e.postgresTenant(t, dsn, "acme")
	a := e.start()
	b := e.standby(t, "b", t.TempDir())
	c := clusterClient(t, env)
	type kept struct{ id, tok string }
	var made []kept
	members := map[string]bool{}
	for range 3 {
		id, tok := e.createKept(t, key)
		made = append(made, kept{id, tok})
		wantCommand(t, a, id, tok)
		members[clusterLocation(t, c, id)] = true
	}
	if len(members) < 2 {
		t.Fatalf("the sandboxes are all on %v; want them spread", members)
	}
	if err := a.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := e.takeOver(t, b, "a killed")
	t.Logf("takeover on the cluster after SIGKILL of the active sandboxd (lease TTL %v): %v", ttl, took)
	for _, k := range made {
		if d := b.get(t, key, k.id); d.State != "running" {
			t.Errorf("%s after the takeover: %s", k.id, d.State)
		}
		wantCommand(t, b, k.id, k.tok)
	}
	id, tok := e.createKept(t, key)
	wantCommand(t, b, id, tok)
}

// TestIncusClusterTemplates: a template built through sandboxd on the
// cluster is built once, on one member, and its layer copied to the
// others (incus/replicas.go): its sandboxes then spread over all three
// members, each with the build's files. Deleting the template removes the
// copies with the layer.
func TestIncusClusterTemplates(t *testing.T) {
	env := loadClusterEnv(t)
	clusterCmd(t, "push")
	c := clusterClient(t, env)
	ctx := t.Context()
	replicasOf := func(layer string) map[string]string { // member → replica
		t.Helper()
		ins, err := c.Instances(ctx, "user.sandboxd.replica-of")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, in := range ins {
			if in.Config["user.sandboxd.replica-of"] == layer && strings.HasPrefix(in.Name, "sbr-") { // not a copy under way
				out[in.Location] = in.Name
			}
		}
		return out
	}
	e := newSerialE2EEnv(t, "a")
	e.serveArgs = clusterServeArgs(env) // replicas are the default
	s := e.start()
	ka := e.keys["a"]

	b := requestBuild(t, s, ka, "replicated", nil)
	t0 := time.Now()
	st := startBuild(t, s, ka, b, map[string]any{
		"fromImage": "e2bdev/base",
		"steps":     []map[string]any{{"type": "RUN", "args": []string{"echo built once > /home/user/r.txt"}}},
	})
	if st.Status != "ready" {
		t.Fatalf("build: %s %+v %q", st.Status, st.Reason, st.Logs)
	}
	t.Logf("build on the cluster: %v", time.Since(t0).Round(time.Millisecond))
	// The template's layer, from what a sandbox of it was cloned from.
	sb, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "replicated", "secure": true})
	in, err := c.Instance(ctx, incus.InstanceName("", sb.SandboxID))
	if err != nil {
		t.Fatal(err)
	}
	layer := in.Config["user.sandboxd.source"]
	wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+sb.SandboxID, ka, nil), http.StatusNoContent)
	li, err := c.Instance(ctx, layer)
	if err != nil {
		t.Fatalf("layer %q of the template: %v", layer, err)
	}
	e2eEventually(t, "the layer copied to the two other members", 5*time.Minute, time.Second, func() (bool, string) {
		on := replicasOf(layer)
		return len(on) == 2 && on[li.Location] == "", fmt.Sprint(on)
	})
	t.Logf("layer %s on %s, replicas %v, %v after the build", layer, li.Location, replicasOf(layer), time.Since(t0).Round(time.Millisecond))

	members := map[string]bool{}
	var ids []string
	for range 3 {
		sb, _ := e.create(t, "/sandboxes", ka, map[string]any{"templateID": "replicated", "secure": true})
		ids = append(ids, sb.SandboxID)
		members[clusterLocation(t, c, sb.SandboxID)] = true
		if out := s.mustRun(t, sb.SandboxID, *sb.EnvdAccessToken, "cat /home/user/r.txt"); out.stdout != "built once\n" {
			t.Fatalf("sandbox %s of the built template: %q", sb.SandboxID, out.stdout)
		}
	}
	if len(members) != 3 {
		t.Fatalf("sandboxes of the built template on %v; want all three members", members)
	}
	for _, id := range ids {
		wantStatus(t, "kill", s.api(t, http.MethodDelete, "/sandboxes/"+id, ka, nil), http.StatusNoContent)
	}

	// Pools short of their reserve (sandboxd restarted with a reserve
	// above the members' free share; their pools share one disk here):
	// the replicas are given up, one a pass, and no sandbox is placed.
	pool, err := c.StoragePoolResources(ctx, "sandboxd", li.Location)
	if err != nil || pool.Space.Total == 0 {
		t.Fatalf("pool space on %s: %+v, %v", li.Location, pool, err)
	}
	// The reserve is far above what is free, not just above: the pools
	// share the disk with whatever else runs (go test's other packages,
	// the VMs), and when that freed more than the margin a pool had room
	// again and a given-up replica was rightly made again (a CI run with
	// a margin of 5 % of the disk).
	const reserve = "0.99"
	free := float64(pool.Space.Total-pool.Space.Used) / float64(pool.Space.Total)
	if free > 0.9 {
		t.Skipf("the pools are %.0f%% free: a reserve above that leaves nothing to test", free*100)
	}
	if err := s.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	e.serveArgs = append(clusterServeArgs(env), "--incus-pool-reserve", reserve)
	s = e.start()
	e2eEventually(t, "the replicas given up with a reserve of "+reserve, 2*time.Minute, time.Second, func() (bool, string) {
		on := replicasOf(layer)
		return len(on) == 0, fmt.Sprint(on)
	})
	resp := s.api(t, http.MethodPost, "/sandboxes", ka, map[string]any{"templateID": "replicated", "secure": true})
	wantStatus(t, "create with every pool short of its reserve", resp, http.StatusServiceUnavailable)
	if _, err := c.Instance(ctx, layer); err != nil {
		t.Fatalf("the layer itself after its replicas were given up: %v", err)
	}
	wantStatus(t, "delete template", s.api(t, http.MethodDelete, "/templates/"+b.TemplateID, ka, nil), http.StatusNoContent)
	e2eEventually(t, "the layer and its replicas removed", 2*time.Minute, time.Second, func() (bool, string) {
		_, err := c.Instance(ctx, layer)
		left := replicasOf(layer)
		return errors.Is(err, sbxruntime.ErrNotFound) && len(left) == 0, fmt.Sprint(err, left)
	})
}
