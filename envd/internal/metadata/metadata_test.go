package metadata

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		m    map[string]string
		ok   bool
	}{
		{"empty", nil, true},
		{"plain", map[string]string{"owner": "agent-7", "k": ""}, true},
		{"empty key", map[string]string{"": "v"}, false},
		{"long key", map[string]string{strings.Repeat("k", MaxKeyLen+1): "v"}, false},
		{"non-ascii value", map[string]string{"k": "é"}, false},
		{"control char", map[string]string{"k": "a\nb"}, false},
		{"too large", map[string]string{"a": strings.Repeat("v", MaxTotalLen)}, false},
	}
	for _, tt := range tests {
		err := Validate(tt.m)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("%s: Validate = %v; want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func TestReplaceRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Replace(p, map[string]string{"a": "1", "b": "2"}); err != nil {
		t.Skipf("no user xattrs on this filesystem: %v", err)
	}
	if err := Replace(p, map[string]string{"b": "3"}); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"b": "3"}; !maps.Equal(got, want) {
		t.Errorf("Read = %v; want %v", got, want)
	}
	if err := Replace(p, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := Read(p); len(got) != 0 {
		t.Errorf("after clearing, Read = %v; want none", got)
	}
}
