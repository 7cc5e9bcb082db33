package runtime

import (
	"context"
	"fmt"
)

// AwaitCreate is how a backend hands out a sandbox whose Create may still
// be running: it waits until ready is closed (the Create ended) and fails
// with ErrNotFound if that Create failed (*created false), or with ctx's
// error. Reading *created is safe once ready is closed: the backend writes
// it before the close.
func AwaitCreate(ctx context.Context, id string, ready <-chan struct{}, created *bool) error {
	select {
	case <-ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !*created {
		return fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	return nil
}
