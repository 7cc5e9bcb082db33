package local

import (
	"slices"
	"testing"

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
