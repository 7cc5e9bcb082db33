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
	// Each case changes one thing of a finished spec.
	finished := func(mod func(*Spec)) Spec {
		s := Spec{ID: "x", Template: "base", CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024}
		mod(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		s    Spec
		ok   bool
	}{
		{"finished", finished(func(*Spec) {}), true},
		{"bad id", finished(func(s *Spec) { s.ID = "../x" }), false},
		{"no template", finished(func(s *Spec) { s.Template = "" }), false},
		{"no cpu", finished(func(s *Spec) { s.CPUCount = 0 }), false},
		{"no memory", finished(func(s *Spec) { s.MemoryMB = 0 }), false},
		{"no disk", finished(func(s *Spec) { s.DiskSizeMB = 0 }), false},
		{"negative cpu", finished(func(s *Spec) { s.CPUCount = -1 }), false},
		{"negative memory", finished(func(s *Spec) { s.MemoryMB = -1 }), false},
		{"negative disk", finished(func(s *Spec) { s.DiskSizeMB = -1 }), false},
		{"env", finished(func(s *Spec) { s.Env = map[string]string{"A": "b=c", "PATH": "/bin"} }), true},
		{"env empty name", finished(func(s *Spec) { s.Env = map[string]string{"": "x"} }), false},
		{"env = in name", finished(func(s *Spec) { s.Env = map[string]string{"A=B": "x"} }), false},
		{"env NUL in value", finished(func(s *Spec) { s.Env = map[string]string{"A": "x\x00y"} }), false},
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

func TestSpecValidateMounts(t *testing.T) {
	base := Spec{ID: "a", Template: "base", CPUCount: 1, MemoryMB: 128, DiskSizeMB: 64}
	for _, tc := range []struct {
		name   string
		mounts []Mount
		ok     bool
	}{
		{"none", nil, true},
		{"one", []Mount{{Volume: "v1", Path: "/mnt/v"}}, true},
		{"one volume twice", []Mount{{Volume: "v1", Path: "/a"}, {Volume: "v1", Path: "/a/b"}}, true},
		{"relative", []Mount{{Volume: "v1", Path: "mnt"}}, false},
		{"root", []Mount{{Volume: "v1", Path: "/"}}, false},
		{"unclean", []Mount{{Volume: "v1", Path: "/a/../etc"}}, false},
		{"path twice", []Mount{{Volume: "v1", Path: "/a"}, {Volume: "v2", Path: "/a"}}, false},
		{"bad volume id", []Mount{{Volume: "../x", Path: "/a"}}, false},
	} {
		s := base
		s.Mounts = tc.mounts
		if err := s.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v; want ok %v", tc.name, err, tc.ok)
		}
	}
}
