package tenant

import (
	"context"
	"testing"
)

func TestContext(t *testing.T) {
	tests := []struct {
		name   string
		ctx    context.Context
		wantID ID
		wantOK bool
	}{
		{"absent", context.Background(), "", false},
		{"set", WithContext(context.Background(), "team-a"), "team-a", true},
		{"empty", WithContext(context.Background(), ""), "", false},
		{"overridden", WithContext(WithContext(context.Background(), "a"), "b"), "b", true},
		// A plain string under a look-alike key must not be read as a tenant.
		{"foreign key", context.WithValue(context.Background(), struct{}{}, ID("x")), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, ok := FromContext(tt.ctx)
			if id != tt.wantID || ok != tt.wantOK {
				t.Errorf("FromContext() = %q, %v; want %q, %v", id, ok, tt.wantID, tt.wantOK)
			}
		})
	}
}
