package main

import (
	"strings"
	"testing"
)

// TestTokenCreateTenantName runs token create in-process: a name that
// `keys create` (store.CreateTenant) rejects must not get a token.
func TestTokenCreateTenantName(t *testing.T) {
	tests := []struct {
		tenant string
		ok     bool
	}{
		{"acme", true},
		{"a-1", true},
		{"A", false},
		{"-acme", false},
		{"a_b", false},
		{"a.b", false},
		{strings.Repeat("a", 64), false},
	}
	for _, tt := range tests {
		err := token([]string{"create", "--data-dir", t.TempDir(), "--tenant", tt.tenant})
		if (err == nil) != tt.ok {
			t.Errorf("token create --tenant %q: err = %v; want ok=%v", tt.tenant, err, tt.ok)
		}
	}
}
