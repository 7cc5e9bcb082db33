package runtime

import (
	"errors"
	"strings"
	"testing"
)

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"a", true},
		{"i3kz9x0w1b2c", true},
		{"rt-abc_DEF-9", true},
		{strings.Repeat("x", 63), true},
		{strings.Repeat("x", 64), false},
		{"", false},
		{"-a", false},
		{"_a", false},
		{"a/b", false},
		{"..", false},
		{"a.b", false},
		{"a b", false},
		{"a\x00", false},
		{"é", false},
	} {
		if got := ValidID(tc.id); got != tc.want {
			t.Errorf("ValidID(%q) = %v; want %v", tc.id, got, tc.want)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Spec
		ok   bool
	}{
		{"defaults", Spec{ID: "x"}, true},
		{"resources", Spec{ID: "x", CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024}, true},
		{"bad id", Spec{ID: "../x"}, false},
		{"negative cpu", Spec{ID: "x", CPUCount: -1}, false},
		{"negative memory", Spec{ID: "x", MemoryMB: -1}, false},
		{"negative disk", Spec{ID: "x", DiskSizeMB: -1}, false},
		{"env", Spec{ID: "x", Env: map[string]string{"A": "b=c", "PATH": "/bin"}}, true},
		{"env empty name", Spec{ID: "x", Env: map[string]string{"": "x"}}, false},
		{"env = in name", Spec{ID: "x", Env: map[string]string{"A=B": "x"}}, false},
		{"env NUL in value", Spec{ID: "x", Env: map[string]string{"A": "x\x00y"}}, false},
	} {
		err := tc.s.Validate()
		if tc.ok && err != nil {
			t.Errorf("%s: Validate() = %v; want nil", tc.name, err)
		}
		if !tc.ok && !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: Validate() = %v; want ErrInvalidSpec", tc.name, err)
		}
	}
}
