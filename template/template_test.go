package template

import (
	"strings"
	"testing"
)

func TestSplitRef(t *testing.T) {
	for _, tc := range []struct{ ref, name, tag string }{
		{"app", "app", DefaultTag},
		{"app:v1", "app", "v1"},
		{"team/app:v1", "team/app", "v1"},
		{"app:", "app", DefaultTag},
		{"localhost:5000/app", "localhost:5000/app", DefaultTag},
	} {
		name, tag := splitRef(tc.ref)
		if name != tc.name || tag != tc.tag {
			t.Errorf("splitRef(%q) = %q, %q; want %q, %q", tc.ref, name, tag, tc.name, tc.tag)
		}
	}
}

func TestValidateSpec(t *testing.T) {
	hash := strings.Repeat("a", 64)
	for _, tc := range []struct {
		what string
		spec BuildSpec
		bad  string // "" = valid
	}{
		{"empty", BuildSpec{}, ""},
		{"every kind", BuildSpec{Steps: []Step{
			{Type: "ENV", Args: []string{"A", "1", "B", "2"}},
			{Type: "WORKDIR", Args: []string{"/app"}},
			{Type: "USER", Args: []string{"root"}},
			{Type: "COPY", Args: []string{"src", "/dst", "", "0755"}, FilesHash: hash},
			{Type: "RUN", Args: []string{"true", "root"}},
		}}, ""},
		{"two bases", BuildSpec{FromImage: "a", FromTemplate: "b"}, "not both"},
		{"registry without image", BuildSpec{Registry: &RegistryAuth{Kind: "registry"}}, "needs fromImage"},
		{"unknown", BuildSpec{Steps: []Step{{Type: "ADD"}}}, "unknown step type"},
		{"RUN without command", BuildSpec{Steps: []Step{{Type: "RUN"}}}, "needs a command"},
		{"COPY without hash", BuildSpec{Steps: []Step{{Type: "COPY", Args: []string{"a", "b"}}}}, "filesHash"},
		{"COPY from outside", BuildSpec{Steps: []Step{{Type: "COPY", Args: []string{"../etc", "b"}, FilesHash: hash}}}, "inside the context"},
		{"COPY absolute", BuildSpec{Steps: []Step{{Type: "COPY", Args: []string{"/etc", "b"}, FilesHash: hash}}}, "relative"},
		{"COPY bad mode", BuildSpec{Steps: []Step{{Type: "COPY", Args: []string{"a", "b", "", "rwx"}, FilesHash: hash}}}, "octal"},
		{"ENV odd", BuildSpec{Steps: []Step{{Type: "ENV", Args: []string{"A"}}}}, "pairs"},
		{"ENV bad key", BuildSpec{Steps: []Step{{Type: "ENV", Args: []string{"A=B", "1"}}}}, "ENV key"},
		{"WORKDIR two", BuildSpec{Steps: []Step{{Type: "WORKDIR", Args: []string{"a", "b"}}}}, "one argument"},
	} {
		err := validateSpec(tc.spec)
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%s: %v", tc.what, err)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%s: got %v, want an error with %q", tc.what, err, tc.bad)
		}
	}
}

// A key depends on every part and on their boundaries.
func TestHashKey(t *testing.T) {
	if hashKey("a", "bc") == hashKey("ab", "c") {
		t.Error("hashKey ignores part boundaries")
	}
	if hashKey("a") != hashKey("a") || len(hashKey("a")) != 32 {
		t.Error("hashKey is not a stable 32-hex key")
	}
	env1 := envKey(map[string]string{"A": "1", "B": "2"})
	env2 := envKey(map[string]string{"B": "2", "A": "1"})
	if env1 != env2 {
		t.Error("envKey depends on map order")
	}
}

func TestLineWriter(t *testing.T) {
	l := newBuildLog(nil)
	w := &lineWriter{log: l, level: "info", step: "1", tailLimit: 2}
	w.Write([]byte("one\ntw"))
	w.Write([]byte("o\r\nthree"))
	w.flush()
	var got []string
	for _, e := range l.entries() {
		got = append(got, e.Message)
	}
	if strings.Join(got, "|") != "one|two|three" {
		t.Errorf("lines %q", got)
	}
	if strings.Join(w.tail, "|") != "two|three" {
		t.Errorf("tail %q", w.tail)
	}
}
