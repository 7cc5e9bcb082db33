package local

import "testing"

func TestNested(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"/usr/local/bin", "/run/sandboxd/local/sandboxes", false},
		{"/tmp", "/tmp/TestX/001/state", true},
		{"/tmp/TestX/001/state", "/tmp", true},
		{"/work/main", "/work/main", true},
		{"/work/main/bin", "/work/main/run/sandboxes", false},
		{"/work/ma", "/work/main/sandboxes", false},
		{"/", "/run/sandboxd", true},
		{"/srv/..x", "/srv", true},
	} {
		if got := nested(tc.a, tc.b); got != tc.want {
			t.Errorf("nested(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
