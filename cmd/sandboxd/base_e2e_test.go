package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestBaseTemplate: base is the Debian root filesystem of --base-rootfs
// (scripts/base-rootfs.sh), with what E2B's base image has, and not the
// host's; the host view is the template host.
func TestBaseTemplate(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s := e.start()
	key := e.keys["alice"]

	sb, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 120})
	id, tok := sb.SandboxID, *sb.EnvdAccessToken
	// As user (envd's default), as an SDK's commands.run runs.
	res := s.mustRun(t, id, tok, `set -e
id -un; echo "$HOME"; getent passwd user | cut -d: -f3,4,7
sudo -n id -u
python --version; python3 -m pip --version >/dev/null; python3 -m venv --help >/dev/null
node --version; npm --version; git --version; curl --version | head -n1
command -v ip ps ss gcc make >/dev/null
. /etc/os-release; echo "$ID $VERSION_CODENAME"
test -s /etc/ssl/certs/ca-certificates.crt && echo ca
`)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	for i, want := range []string{"user", "/home/user", "1000:1000:/bin/bash", "0"} {
		if i >= len(lines) || lines[i] != want {
			t.Fatalf("line %d of %q: want %q (stderr %q)", i, res.stdout, want, res.stderr)
		}
	}
	for _, want := range []string{"Python 3.", "\nv", "git version", "curl ", "debian bookworm\n", "\nca"} {
		if !strings.Contains(res.stdout+"\n", want) {
			t.Errorf("no %q in %q", want, res.stdout)
		}
	}
	// Without a word on stderr (such as sudo's "unable to resolve host").
	if res := s.mustRun(t, id, tok, "sudo -n true"); res.stderr != "" {
		t.Errorf("sudo -n true: stderr %q", res.stderr)
	}
	// Root may change base's /usr (sudo apt-get install works as in E2B):
	// the write lands in this sandbox's layer, not in the template nor on
	// the host.
	probe := "/usr/local/sandboxd-base-probe-" + e2eRandHex(4)
	s.mustRun(t, id, tok, "sudo -n touch "+probe+" && test -e "+probe)
	if _, err := os.Stat(probe); err == nil {
		t.Errorf("%s written in a sandbox appeared on the host", probe)
	}
	other, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 120})
	if res, err := s.run(t.Context(), other.SandboxID, *other.EnvdAccessToken, "test -e "+probe); err != nil || res.exitCode == 0 {
		t.Errorf("another sandbox of base sees %s (err %v)", probe, err)
	}

	// base's /usr is its own; host's is the host's (the same inodes),
	// read-only.
	var st syscall.Stat_t
	if err := syscall.Stat("/usr/bin/env", &st); err != nil {
		t.Fatal(err)
	}
	hostIno := strconv.FormatUint(st.Ino, 10) + "\n"
	if res := s.mustRun(t, id, tok, "stat -Lc %i /usr/bin/env"); res.stdout == hostIno {
		t.Errorf("base's /usr/bin/env is the host's (inode %s)", strings.TrimSpace(hostIno))
	}
	hs, _ := e.create(t, "/v2/sandboxes", key, map[string]any{"timeout": 120, "templateID": "host"})
	if hs.TemplateID != "host" {
		t.Errorf("templateID %q, want host", hs.TemplateID)
	}
	res = s.mustRun(t, hs.SandboxID, *hs.EnvdAccessToken, "stat -Lc %i /usr/bin/env; grep -E '^[^ ]+ /usr ' /proc/self/mounts | grep -qw ro && echo read-only")
	if want := hostIno + "read-only\n"; res.stdout != want {
		t.Errorf("host template: %q, want %q", res.stdout, want)
	}
}
