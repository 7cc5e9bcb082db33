package local_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// mappedRoot is the host id of a user-namespaced sandbox's root (userNSBase).
const mappedRoot = 1_000_000_000

// delegationExpected reports whether b's sandboxes get a delegated cgroup2
// subtree: on cgroup v2 hosts, with a user namespace or, without one, where
// the cgroup2 mount has nsdelegate.
func delegationExpected(b *local.Backend) bool {
	if !cgroups.IsCgroup2UnifiedMode() {
		return false
	}
	_, flags, _, _ := local.Cgroup2Mount()
	return b.UserNS() || slices.Contains(flags, "nsdelegate")
}

// delegationStep is one step of TestCgroupDelegation, in order: a script
// run in the sandbox as user, which must succeed or (fail) must not; or a
// check on the host.
type delegationStep struct {
	name   string
	user   string
	script string
	fail   bool
	host   func(t *testing.T)
	// userNSOnly: the step holds only with a user namespace.
	userNSOnly bool
}

// TestCgroupDelegation: on a cgroup v2 host a sandbox gets its cgroup as a
// delegated subtree at /sys/fs/cgroup (see delegateCgroup): root inside can
// move its processes into child cgroups, enable controllers for them and
// limit them, but not change its own limits, nor make more than the
// descendant and depth caps allow; the user account can change nothing.
// Pause (memory and disk) freezes and resumes the children too, and
// Destroy and Reconcile leave no cgroup of the sandbox behind. On v1 and
// hybrid hosts (and without a user namespace or nsdelegate) the sandbox has
// no cgroup mount, as before delegation.
func TestCgroupDelegation(t *testing.T) {
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			env, b := openEnv(t, m)
			id := mustCreate(t, b, runtime.Spec{MemoryMB: 256, DiskSizeMB: 64})
			if !delegationExpected(b) {
				// Today's behaviour: /sys/fs/cgroup is the empty
				// directory of the read-only sysfs.
				sh(t, b, id, "root", `! grep -q ' /sys/fs/cgroup ' /proc/self/mountinfo && ! mkdir /sys/fs/cgroup/x 2>/dev/null`)
				t.Skipf("no delegation here (cgroup v2 only: %v, user namespace: %v): checked that the sandbox has no cgroup mount",
					cgroups.IsCgroup2UnifiedMode(), b.UserNS())
			}
			runDelegationSteps(t, env, b, id)
		})
	}
	for _, m := range userNSModes {
		t.Run("reconcile/userns="+m.String(), func(t *testing.T) {
			env, b1 := openEnv(t, m)
			if !delegationExpected(b1) {
				t.Skip("no delegation on this host")
			}
			id := mustCreate(t, b1, runtime.Spec{MemoryMB: 256, DiskSizeMB: 64})
			host := filepath.Join("/sys/fs/cgroup", env.cgroupParent, id)
			sh(t, b1, id, "root", nestScript)
			assertNested(t, host)
			// A crash between steps of a create leaves a state directory
			// without meta.json: the next sandboxd's Reconcile kills and
			// removes all of it, the sandbox's own child cgroups included.
			if err := os.Remove(filepath.Join(env.root, "sandboxes", id, "meta.json")); err != nil {
				t.Fatal(err)
			}
			b2 := env.openMode(t, m)
			t.Cleanup(func() { _ = b2.Close() })
			if err := b2.Reconcile(t.Context()); err != nil {
				t.Fatalf("Reconcile() = %v", err)
			}
			assertCgroupGone(t, host)
		})
	}
}

// nestScript moves every process of the sandbox into child cgroups, some
// nested, with processes left running in the deepest and in a pids-limited
// one: what a destroy or a pause has to deal with.
const nestScript = `set -e
cg=/sys/fs/cgroup
mkdir -p $cg/envd
for p in $(cat $cg/cgroup.procs); do echo $p >$cg/envd/cgroup.procs 2>/dev/null || true; done
echo +pids >$cg/cgroup.subtree_control
mkdir -p $cg/c1 $cg/n1/n2/n3/n4
echo 10 >$cg/c1/pids.max
sh -c "echo \$\$ >$cg/c1/cgroup.procs; exec sleep 300" </dev/null >/dev/null 2>&1 &
sh -c "echo \$\$ >$cg/n1/n2/n3/n4/cgroup.procs; exec sleep 300" </dev/null >/dev/null 2>&1 &
` + waitProcs + `
waitprocs $cg/c1 && waitprocs $cg/n1/n2/n3/n4`

// waitProcs defines the shell function waitprocs DIR, which waits up to
// 20 s for a process to have joined the cgroup DIR (a background shell
// moves itself there: on a loaded, emulated guest that took over 0.2 s).
const waitProcs = `waitprocs() {
	i=0
	while [ -z "$(cat $1/cgroup.procs)" ]; do
		i=$((i+1)); [ $i -le 200 ] || return 1
		sleep 0.1
	done
}`

// assertNested checks on the host that nestScript's cgroups hold processes.
func assertNested(t *testing.T, host string) {
	t.Helper()
	for _, c := range []string{"c1", "n1/n2/n3/n4", "envd"} {
		raw, err := os.ReadFile(filepath.Join(host, c, "cgroup.procs"))
		if err != nil || strings.TrimSpace(string(raw)) == "" {
			t.Fatalf("%s/%s holds no process: %q %v", host, c, raw, err)
		}
	}
}

// assertCgroupGone fails unless the sandbox's cgroup directory is gone.
func assertCgroupGone(t *testing.T, host string) {
	t.Helper()
	if _, err := os.Lstat(host); !errors.Is(err, fs.ErrNotExist) {
		left, _ := filepath.Glob(filepath.Join(host, "*", "cgroup.procs"))
		t.Fatalf("cgroup %s left (%v), with children %v", host, err, left)
	}
}

// owner is the uid and gid of path.
func owner(t *testing.T, path string) (uint32, uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

// frozen reports what cgroup.events says of the cgroup at dir.
func frozen(t *testing.T, dir string) bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(raw), "frozen 1")
}

func runDelegationSteps(t *testing.T, env testEnv, b *local.Backend, id string) {
	ctx := t.Context()
	host := filepath.Join("/sys/fs/cgroup", env.cgroupParent, id)
	var root uint32
	if b.UserNS() {
		root = mappedRoot
	}
	checkOwners := func(t *testing.T) {
		for _, f := range []string{"", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"} {
			if u, g := owner(t, filepath.Join(host, f)); u != root || g != root {
				t.Errorf("%s/%s owned by %d:%d; want the sandbox's root %d", host, f, u, g, root)
			}
		}
		for _, f := range []string{"pids.max", "memory.max", "cpu.max", "cgroup.max.descendants", "cgroup.max.depth", "cgroup.freeze", "cgroup.kill", "cgroup.type"} {
			if u, g := owner(t, filepath.Join(host, f)); u != 0 || g != 0 {
				t.Errorf("%s/%s owned by %d:%d; want the host's root", host, f, u, g)
			}
		}
		for f, want := range map[string]string{"cgroup.max.descendants": "256", "cgroup.max.depth": "4", "pids.max": "1024"} {
			raw, err := os.ReadFile(filepath.Join(host, f))
			if got := strings.TrimSpace(string(raw)); err != nil || got != want {
				t.Errorf("%s/%s = %q, %v; want %s", host, f, got, err, want)
			}
		}
	}
	pause := func(kind runtime.PauseKind) func(t *testing.T) {
		return func(t *testing.T) {
			if err := b.Pause(ctx, id, kind); err != nil {
				t.Fatalf("Pause(%v) = %v", kind, err)
			}
			if kind == runtime.PauseMemory {
				for _, c := range []string{"", "c1", "n1/n2/n3/n4", "envd"} {
					if !frozen(t, filepath.Join(host, c)) {
						t.Errorf("paused sandbox's cgroup %s is not frozen", c)
					}
				}
			} else {
				assertCgroupGone(t, host)
			}
			if _, err := b.Resume(ctx, id); err != nil {
				t.Fatalf("Resume after Pause(%v) = %v", kind, err)
			}
			if kind == runtime.PauseMemory {
				for _, c := range []string{"", "c1", "n1/n2/n3/n4"} {
					if frozen(t, filepath.Join(host, c)) {
						t.Errorf("resumed sandbox's cgroup %s is still frozen", c)
					}
				}
			}
		}
	}
	steps := []delegationStep{
		{name: "host: ownership and caps", host: checkOwners},
		// envd (package envd/internal/cgroup) organised the tree before
		// this first command: itself in envd/, each command in a cgroup of
		// its own.
		{name: "a command in a cgroup of its own, envd in its leaf", user: "root",
			script: `grep -Eqx '0::/cmd-[0-9]+' /proc/self/cgroup && grep -qx '0::/envd' /proc/1/cgroup`},
		{name: "cgroup2 mounted rw with the sandbox's cgroup as its root", user: "root",
			script: `grep ' /sys/fs/cgroup ' /proc/self/mountinfo | grep -Eq '^[0-9]+ [0-9]+ [0-9:]+ / /sys/fs/cgroup rw[, ].* - cgroup2 '`},
		{name: "/sys stays read-only", user: "root", script: `grep -Eq '^[0-9]+ [0-9]+ [0-9:]+ / /sys ro[, ]' /proc/self/mountinfo`},
		{name: "user cannot mkdir", user: "user", script: `mkdir /sys/fs/cgroup/u`, fail: true},
		{name: "user cannot move itself", user: "user", script: `echo $$ >/sys/fs/cgroup/cgroup.procs`, fail: true},
		{name: "root cannot raise pids.max", user: "root", script: `echo max >/sys/fs/cgroup/pids.max`, fail: true},
		{name: "root cannot raise memory.max", user: "root", script: `echo max >/sys/fs/cgroup/memory.max`, fail: true},
		{name: "root cannot raise cpu.max", user: "root", script: `echo max >/sys/fs/cgroup/cpu.max`, fail: true},
		{name: "root cannot raise cgroup.max.descendants", user: "root", script: `echo max >/sys/fs/cgroup/cgroup.max.descendants`, fail: true},
		{name: "root cannot raise cgroup.max.depth", user: "root", script: `echo max >/sys/fs/cgroup/cgroup.max.depth`, fail: true},
		// Without a user namespace root inside is the host's (CAP_FOWNER):
		// it can chmod, and nsdelegate still refuses the write.
		{name: "root cannot chmod pids.max", user: "root", script: `chmod 666 /sys/fs/cgroup/pids.max`, fail: true, userNSOnly: true},
		{name: "host: limits unchanged", host: checkOwners},
		// No process is left in the root (the no-internal-processes rule),
		// so root inside can enable a domain controller (memory) too.
		{name: "the root empty, pids enabled, +memory allowed", user: "root", script: `set -e
test -z "$(cat /sys/fs/cgroup/cgroup.procs)"
grep -qw pids /sys/fs/cgroup/cgroup.subtree_control
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
grep -qw memory /sys/fs/cgroup/cgroup.subtree_control`},
		{name: "a command's pids.max keeps envd's reserve", user: "root",
			script: `test "$(cat /sys/fs/cgroup/$(cut -d/ -f2 /proc/self/cgroup)/pids.max)" = 960`},
		{name: "child with pids.max", user: "root", script: `mkdir /sys/fs/cgroup/c1 && echo 10 >/sys/fs/cgroup/c1/pids.max && test "$(cat /sys/fs/cgroup/c1/pids.max)" = 10`},
		{name: "child's pids.max holds", user: "root", script: `
sh -c 'echo $$ >/sys/fs/cgroup/c1/cgroup.procs; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do sleep 300 </dev/null >/dev/null 2>&1 & done' >/dev/null 2>&1
sleep 0.2
n=$(cat /sys/fs/cgroup/c1/pids.current)
echo "pids.current $n"; cat /sys/fs/cgroup/c1/pids.events
[ "$n" -ge 5 ] && [ "$n" -le 10 ] && grep -Eq '^max [1-9]' /sys/fs/cgroup/c1/pids.events`},
		{name: "user cannot move into c1", user: "user", script: `echo $$ >/sys/fs/cgroup/c1/cgroup.procs`, fail: true},
		{name: "depth 4 allowed", user: "root", script: `mkdir -p /sys/fs/cgroup/n1/n2/n3/n4 &&
sh -c 'echo $$ >/sys/fs/cgroup/n1/n2/n3/n4/cgroup.procs; exec sleep 300' </dev/null >/dev/null 2>&1 &
` + waitProcs + `
waitprocs /sys/fs/cgroup/n1/n2/n3/n4`},
		{name: "depth 5 refused", user: "root", script: `mkdir /sys/fs/cgroup/n1/n2/n3/n4/n5`, fail: true},
		{name: "no more than 256 descendants", user: "root", script: `
i=0; while [ $i -lt 400 ] && mkdir /sys/fs/cgroup/d$i 2>/dev/null; do i=$((i+1)); done
n=$(find /sys/fs/cgroup -mindepth 1 -type d | wc -l)
echo "made $i, $n descendants"; [ "$n" -eq 256 ] && [ $i -lt 400 ]`},
		{name: "host: still limited", host: checkOwners},
		{name: "pause and resume freeze the children", host: pause(runtime.PauseMemory)},
		{name: "processes in children survive the pause", user: "root", script: `[ "$(cat /sys/fs/cgroup/c1/pids.current)" -ge 5 ] && test -n "$(cat /sys/fs/cgroup/n1/n2/n3/n4/cgroup.procs)"`},
		{name: "pause to disk removes the subtree, resume delegates anew", host: pause(runtime.PauseDisk)},
		{name: "host: delegated again", host: checkOwners},
		{name: "a fresh subtree inside", user: "root", script: `grep -Eqx '0::/cmd-[0-9]+' /proc/self/cgroup && test ! -e /sys/fs/cgroup/c1`},
		{name: "nest again", user: "root", script: nestScript},
		{name: "host: nested again", host: func(t *testing.T) { assertNested(t, host) }},
		{name: "Destroy removes every cgroup of the sandbox", host: func(t *testing.T) {
			if err := b.Destroy(ctx, id); err != nil {
				t.Fatalf("Destroy = %v", err)
			}
			assertCgroupGone(t, host)
			for _, p := range b.HostPaths(id) {
				if exists(p) {
					t.Errorf("Destroy left %s", p)
				}
			}
		}},
	}
	for _, st := range steps {
		ok := t.Run(st.name, func(t *testing.T) {
			if st.userNSOnly && !b.UserNS() {
				t.Skip("only with a user namespace")
			}
			if st.host != nil {
				st.host(t)
				return
			}
			ctx, cancel := context.WithTimeout(t.Context(), runtimetest.Within(time.Minute))
			defer cancel()
			res, err := runtimetest.Exec(ctx, b, id, st.user, "/bin/sh", "-c", st.script)
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			if got := res.ExitCode != 0; got != st.fail {
				t.Fatalf("as %s: %q exited %d (want failure: %v): stdout %q stderr %q", st.user, st.script, res.ExitCode, st.fail, res.Stdout, res.Stderr)
			}
		})
		if !ok {
			t.FailNow() // the later steps build on this one
		}
	}
}

// TestReconcileNestedStrayCgroup: Reconcile removes a dead sandbox's cgroup
// (one with no state directory left) with the child cgroups the sandbox
// made in it, in every hierarchy of this host's layout.
func TestReconcileNestedStrayCgroup(t *testing.T) {
	env, b := openEnv(t, local.UserNSOff)
	id := runtimetest.NewID()
	var made []string
	for _, h := range local.CgroupRoots() {
		p := filepath.Join(h, env.cgroupParent, id)
		if err := os.MkdirAll(filepath.Join(p, "envd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(p, "n1", "n2", "n3"), 0o755); err != nil {
			t.Fatal(err)
		}
		made = append(made, p)
	}
	t.Cleanup(func() {
		for _, p := range made {
			_ = cgroups.RemovePath(p)
		}
	})
	if err := b.Reconcile(t.Context()); err != nil {
		t.Fatalf("Reconcile() = %v", err)
	}
	for _, p := range made {
		assertCgroupGone(t, p)
	}
}
