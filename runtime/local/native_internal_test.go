package local

import (
	"slices"
	"testing"
)

func TestEnvdOnHostArgs(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
		sock     bool
		err      bool
	}{
		{in: []string{"/envd", "--init", "--socket", "/run/envd/envd.sock", "--listen", "127.0.0.1:49983"},
			want: []string{"/envd", "--init", "--socket-fd", "3", "--listen", "127.0.0.1:49983"}, sock: true},
		{in: []string{"/envd", "--listen", "127.0.0.1:49983"}, want: []string{"/envd", "--listen", "127.0.0.1:49983"}},
		{in: []string{"/envd", "--socket"}, err: true},
	} {
		got, sock, err := envdOnHostArgs(tc.in)
		if (err != nil) != tc.err || sock != tc.sock || !slices.Equal(got, tc.want) {
			t.Errorf("envdOnHostArgs(%q) = %q, %v, %v; want %q, %v, error %v", tc.in, got, sock, err, tc.want, tc.sock, tc.err)
		}
	}
}
