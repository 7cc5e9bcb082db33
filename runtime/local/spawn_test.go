package local_test

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
	"golang.org/x/sys/unix"
)

// sandboxProbe prints what a sandbox's processes can see of how it was set
// up: credentials, capabilities, seccomp and signal state (its own and its
// init's), mounts and their options, /dev, limits, namespaces and id maps,
// and the masked and read-only paths. It leaves out PID 1's SigBlk and
// SigPnd: envd's Go runtime blocks every signal on a thread while it clones
// another, so a probe that reads /proc/1/status at that moment sees a full
// mask under either starter (a CI flake of 2026-12-05). What the starters
// set is the mask envd inherits, which the probe's own shell shows.
const sandboxProbe = `id; umask; pwd; env | grep -v '^E2B_SANDBOX_ID=' | sort
grep -E '^(Sig|Cap|NoNewPrivs|Seccomp)' /proc/self/status
grep -E '^(SigQ|SigIgn|SigCgt|Cap|NoNewPrivs|Seccomp|Uid|Gid|Groups)' /proc/1/status
cut -d' ' -f4- /proc/self/mountinfo
ls -la /dev /dev/pts /dev/shm /dev/mqueue | cut -c1-11,15-34,47-
cat /proc/self/limits /proc/self/uid_map /proc/self/gid_map /proc/1/oom_score_adj
ls /proc/self/ns; ls -l /proc/1/fd | tail -n +2 | cut -c1-10,47-
for f in /proc/kcore /proc/keys /proc/timer_list /proc/acpi /sys/firmware /proc/sys/kernel/hostname; do stat -c '%n %F %s %a' $f 2>&1; done
touch /proc/sys/kernel/hostname 2>&1; hostname | wc -c; cat /sys/class/net/lo/operstate /sys/class/net/lo/flags`

// probeNoise are the parts of sandboxProbe's output that differ between
// any two sandboxes: ids, the tests' random directories, boot id files,
// mount and device numbers, pipe and socket inodes.
var probeNoise = regexp.MustCompile(`rt-[0-9a-f]{12}|/run/sandboxd-test/[0-9a-f]{8}|boot_id-[0-9]+|^\d+:\d+ |\[\d+\]`)

// TestSpawnMatchesLibcontainer: a sandbox sandboxd-spawn starts looks, from
// inside, as one libcontainer starts: the same probe prints the same lines
// (mountinfo's order aside: sandboxd-spawn makes its bind mounts' copies
// first), in both user namespace modes, but for the socket directory's
// mount at /run/envd, which only libcontainer's start has: sandboxd-spawn
// hands envd its socket.
func TestSpawnMatchesLibcontainer(t *testing.T) {
	if spawnBin == "" {
		t.Skip("SANDBOXD_SPAWN=none")
	}
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			skipModeWithoutUserNS(t, m)
			probe := map[string][]string{}
			for _, starter := range []string{"sandboxd-spawn", "libcontainer"} {
				env := newEnv(t)
				b := openWithStarter(t, env.modeOptions(t, m), starter)
				id := mustCreate(t, b, runtime.Spec{})
				res, err := runtimetest.Exec(t.Context(), b, id, "user", "/bin/sh", "-c", sandboxProbe)
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("%s: probe: %+v %v", starter, res, err)
				}
				var lines []string
				for l := range strings.Lines(res.Stdout) {
					lines = append(lines, probeNoise.ReplaceAllString(strings.TrimSpace(l), "N"))
				}
				slices.Sort(lines)
				probe[starter] = lines
				if err := b.Destroy(t.Context(), id); err != nil {
					t.Fatal(err)
				}
			}
			a, b := probe["sandboxd-spawn"], probe["libcontainer"]
			if len(a) < 100 {
				t.Fatalf("the probe printed %d lines: %q", len(a), a)
			}
			for _, l := range a {
				if !slices.Contains(b, l) {
					t.Errorf("only with sandboxd-spawn: %s", l)
				}
			}
			for _, l := range b {
				if !slices.Contains(a, l) && !strings.Contains(l, " /run/envd ") {
					t.Errorf("only with libcontainer:   %s", l)
				}
			}
		})
	}
}

// TestSpawnMountNamespace: sandboxd-spawn clones each sandbox's mount
// namespace from one that holds none of the sandboxes' mounts, so that what
// a create copies does not grow with the sandboxes beside it, and none of
// the host's mounts but the root, /proc, /sys, the cgroup hierarchies and
// those on the way to the sandboxes' directory, so that it keeps alive no
// mount the host takes away later (a tmpfs here, or a sandbox's when it is
// destroyed).
func TestSpawnMountNamespace(t *testing.T) {
	if spawnBin == "" {
		t.Skip("SANDBOXD_SPAWN=none")
	}
	hostMount := t.TempDir()
	if err := unix.Mount("tmpfs", hostMount, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(hostMount, unix.MNT_DETACH) })
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			skipModeWithoutUserNS(t, m)
			env := newEnv(t)
			// A sandbox whose mounts exist when the namespace is made: an
			// earlier process's, which this one adopts.
			ids := []string{mustCreate(t, env.openMode(t, m), runtime.Spec{})}
			b := env.openMode(t, m)
			// Each sandbox starts from the namespace: its root was handed
			// over, as none of the others' is there.
			for range 2 {
				ids = append(ids, mustCreate(t, b, runtime.Spec{}))
			}
			for _, id := range ids {
				if res, err := runtimetest.Exec(t.Context(), b, id, "user", "/bin/sh", "-c", "test -x /bin/sh && grep -c ' / / ' /proc/self/mountinfo"); err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "1" {
					t.Fatalf("sandbox %s: its root: %+v %v", id, res, err)
				}
			}
			sandboxes, err := filepath.EvalSymlinks(filepath.Join(env.root, "sandboxes"))
			if err != nil {
				t.Fatal(err)
			}
			mps, err := b.SpawnMountPoints()
			if err != nil {
				t.Fatal(err)
			}
			for _, mp := range mps {
				onTheWay := mp == "/" || mp == sandboxes || strings.HasPrefix(sandboxes, mp+"/")
				system := mp == "/proc" || mp == "/sys" || mp == "/sys/fs/cgroup" || filepath.Dir(mp) == "/sys/fs/cgroup"
				if !onTheWay && !system {
					t.Errorf("the spawn namespace holds %s", mp)
				}
			}
			if !slices.Contains(mps, "/proc") {
				t.Errorf("the spawn namespace has no /proc: %q", mps)
			}
		})
	}
}

// openWithStarter opens a backend with opts whose sandboxes starter starts:
// "sandboxd-spawn" (as opts say) or "libcontainer".
func openWithStarter(t *testing.T, opts local.Options, starter string) *local.Backend {
	t.Helper()
	if starter == "libcontainer" {
		opts.SpawnPath = ""
	}
	b, err := local.New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}
