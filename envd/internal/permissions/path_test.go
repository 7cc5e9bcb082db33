package permissions

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestResolvePath(t *testing.T) {
	u := &User{Name: "user", Home: "/home/user"}
	tests := []struct {
		path, defaultDir, want string
		wantErr                error
	}{
		{"", "", "/home/user", nil},
		{"", "/work", "/work", nil},
		{"~", "", "/home/user", nil},
		{"~/a/b", "", "/home/user/a/b", nil},
		{"a.txt", "/work", "/home/user/a.txt", nil},
		{"../etc/passwd", "", "/home/etc/passwd", nil},
		{"/abs//x/../y", "", "/abs/y", nil},
		{"~root/x", "", "", ErrBadPath},
		{"a\x00b", "", "", ErrBadPath},
	}
	for _, tt := range tests {
		got, err := ResolvePath(tt.path, u, tt.defaultDir)
		if !errors.Is(err, tt.wantErr) || got != tt.want {
			t.Errorf("ResolvePath(%q, _, %q) = %q, %v; want %q, %v", tt.path, tt.defaultDir, got, err, tt.want, tt.wantErr)
		}
	}
}

func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{"", "~", "~/x", "a/../../b", "/x", "~x", "\x00"} {
		f.Add(s)
	}
	u := &User{Name: "user", Home: "/home/user"}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := ResolvePath(p, u, "")
		if err != nil {
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("ResolvePath(%q) = %q: not a clean absolute path", p, got)
		}
	})
}

func TestUsernameFromBasicAuth(t *testing.T) {
	tests := []struct {
		header string
		name   string
		ok     bool
		err    bool
	}{
		{"", "", false, false},
		{"Basic dXNlcjo=", "user", true, false},
		{"basic cm9vdDo=", "root", true, false},
		{"Bearer abc", "", false, false},
		{"Basic !!!", "", true, true},
	}
	for _, tt := range tests {
		h := map[string][]string{}
		if tt.header != "" {
			h["Authorization"] = []string{tt.header}
		}
		name, ok, err := UsernameFromBasicAuth(h)
		if name != tt.name || ok != tt.ok || (err != nil) != tt.err {
			t.Errorf("UsernameFromBasicAuth(%q) = %q, %v, %v; want %q, %v, err=%v", tt.header, name, ok, err, tt.name, tt.ok, tt.err)
		}
	}
}

func TestLookup(t *testing.T) {
	u, err := Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	if u.UID != 0 || u.GID != 0 || u.Home == "" || len(u.Groups) == 0 || u.Groups[0] != 0 {
		t.Errorf("Lookup(root) = %+v", u)
	}
	// The message is E2B envd's for an RPC's unknown user.
	if _, err := Lookup("no-such-user-sandboxd"); !errors.Is(err, ErrUnknownUser) || err.Error() != "invalid username: 'no-such-user-sandboxd'" {
		t.Errorf("Lookup(missing) err = %v; want ErrUnknownUser, \"invalid username: 'no-such-user-sandboxd'\"", err)
	}
}
