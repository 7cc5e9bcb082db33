package local_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// TestBaseRootfsErrors: a BaseRootfs that is missing or holds no root
// filesystem fails New, saying why.
func TestBaseRootfsErrors(t *testing.T) {
	noShell := t.TempDir()
	for _, tc := range []struct{ name, dir, want string }{
		{"missing", filepath.Join(t.TempDir(), "none"), "no such file"},
		{"no shell", noShell, "no /bin/sh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := newEnv(t).options(t)
			opts.BaseRootfs = tc.dir
			b, err := local.New(t.Context(), opts)
			if err == nil {
				_ = b.Close()
				t.Fatalf("New with BaseRootfs %s succeeded", tc.dir)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v; want %q", err, tc.want)
			}
		})
	}
}

// baseRootfs is the Debian root filesystem scripts/base-rootfs.sh builds
// (`make base`); SANDBOXD_TEST_BASE_ROOTFS names another.
func baseRootfs(t *testing.T) string {
	dir := os.Getenv("SANDBOXD_TEST_BASE_ROOTFS")
	if dir == "" {
		dir = "/var/cache/sandboxd/base/rootfs"
	}
	if _, err := os.Stat(filepath.Join(dir, "bin", "sh")); err != nil {
		t.Skipf("no base root filesystem (make base): %v", err)
	}
	return dir
}

// TestBaseRootfs: with BaseRootfs, base is that root filesystem (read
// through idmapped mounts with a user namespace), with setuid sudo working
// for user, and host is the host view beside it.
func TestBaseRootfs(t *testing.T) {
	dir := baseRootfs(t)
	for _, m := range userNSModes {
		t.Run("userns="+m.String(), func(t *testing.T) {
			skipModeWithoutUserNS(t, m)
			opts := newEnv(t).modeOptions(t, m)
			opts.BaseRootfs = dir
			b, err := local.New(t.Context(), opts)
			if err != nil {
				t.Fatalf("local.New: %v", err)
			}
			t.Cleanup(func() { _ = b.Close() })
			names, err := b.Templates(t.Context())
			if err != nil || !slices.Contains(names, local.BaseTemplate) || !slices.Contains(names, local.HostTemplate) {
				t.Fatalf("Templates() = %v, %v; want base and host", names, err)
			}
			for _, tc := range []struct{ template, user, script, want string }{
				{local.BaseTemplate, "user", "sudo -n id -u; python --version", "0\nPython 3."},
				{local.BaseTemplate, "root", "test -w /usr && echo rw", "rw\n"},
				{local.HostTemplate, "root", "test -w /usr || echo ro", "ro\n"},
			} {
				id := mustCreate(t, b, runtime.Spec{Template: tc.template})
				t.Cleanup(func() { _ = b.Destroy(t.Context(), id) })
				res, err := runtimetest.Exec(t.Context(), b, id, tc.user, "/bin/sh", "-c", tc.script)
				if err != nil || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, tc.want) {
					t.Errorf("%s as %s: %q: %+v, %v; want stdout from %q", tc.template, tc.user, tc.script, res, err, tc.want)
				}
			}
		})
	}
}
