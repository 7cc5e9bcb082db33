package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestKinds(t *testing.T) {
	err := fmt.Errorf("kill sandbox abc: %w", New(ErrNotFound, "sandbox abc not found"))
	if !IsNotFound(err) || IsConflict(err) {
		t.Fatalf("kind lost through wrapping: %v", err)
	}
	if msg, ok := Public(err); !ok || msg != "sandbox abc not found" {
		t.Fatalf("Public = %q, %v", msg, ok)
	}
	if _, ok := Public(errors.New("disk on fire")); ok {
		t.Fatal("a plain error must not be public")
	}
}
