package local

import (
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/opencontainers/runc/libcontainer/configs"
)

// TestEnvdOnHost: a start that hands envd its socket passes the descriptor
// in place of the path and drops the socket directory's mount, from a copy
// of the config: the one given stays whole for libcontainer's start.
func TestEnvdOnHost(t *testing.T) {
	mounts := func(dsts ...string) []*configs.Mount {
		var out []*configs.Mount
		for _, d := range dsts {
			out = append(out, &configs.Mount{Destination: d, Source: "/host" + d, Device: "bind"})
		}
		return out
	}
	dsts := func(ms []*configs.Mount) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Destination)
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		in, want   []string
		mounts     []string
		wantMounts []string
		sock       bool
		err        bool
	}{
		{
			name:   "socket",
			in:     []string{"/envd", "--init", "--socket", envdSocketDir + "/envd.sock", "--listen", "127.0.0.1:49983"},
			want:   []string{"/envd", "--init", "--socket-fd", "3", "--listen", "127.0.0.1:49983"},
			mounts: []string{"/proc", envdSocketDir, "/etc/resolv.conf"}, wantMounts: []string{"/proc", "/etc/resolv.conf"},
			sock: true,
		},
		{
			name:   "no socket",
			in:     []string{"/envd", "--listen", "127.0.0.1:49983"},
			want:   []string{"/envd", "--listen", "127.0.0.1:49983"},
			mounts: []string{"/proc", envdSocketDir}, wantMounts: []string{"/proc", envdSocketDir},
		},
		{name: "socket without a path", in: []string{"/envd", "--socket"}, mounts: []string{envdSocketDir}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &configs.Config{Hostname: "h", Mounts: mounts(tc.mounts...)}
			got, args, sock, err := envdOnHost(cfg, tc.in)
			if (err != nil) != tc.err || sock != tc.sock || !slices.Equal(args, tc.want) {
				t.Fatalf("envdOnHost(%q) = %q, %v, %v; want %q, %v, error %v", tc.in, args, sock, err, tc.want, tc.sock, tc.err)
			}
			if err != nil {
				return
			}
			if !slices.Equal(dsts(got.Mounts), tc.wantMounts) || got.Hostname != "h" {
				t.Errorf("config's mounts %q, hostname %q; want %q, h", dsts(got.Mounts), got.Hostname, tc.wantMounts)
			}
			if !slices.Equal(dsts(cfg.Mounts), tc.mounts) {
				t.Errorf("the given config's mounts became %q; want them as they were, %q", dsts(cfg.Mounts), tc.mounts)
			}
		})
	}
}

// TestReapChildKill: the kill reapChild returns ends the child, and once the
// child is reaped is a no-op (its pidfd copy closed, so it can reach no
// other process or file).
func TestReapChildKill(t *testing.T) {
	wait := func(t *testing.T, done <-chan struct{}) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the child was not reaped")
		}
	}
	start := func(t *testing.T, args ...string) int {
		t.Helper()
		// Started, never waited for through os/exec: reapChild reaps it.
		cmd := exec.Command(args[0], args[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd.Process.Pid
	}
	t.Run("running", func(t *testing.T) {
		done, kill := reapChild(start(t, "sleep", "60"))
		if kill == nil {
			t.Skip("no pidfd here")
		}
		if err := kill(); err != nil {
			t.Fatal(err)
		}
		wait(t, done)
		if err := kill(); err != nil {
			t.Errorf("a kill after the reap: %v; want nil", err)
		}
	})
	t.Run("exited", func(t *testing.T) {
		done, kill := reapChild(start(t, "true"))
		if kill == nil {
			t.Skip("no pidfd here")
		}
		wait(t, done) // the copy is closed before the reap
		if err := kill(); err != nil {
			t.Errorf("a kill after the exit: %v; want nil", err)
		}
	})
}
