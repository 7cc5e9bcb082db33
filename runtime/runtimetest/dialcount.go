package runtimetest

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/sandboxd/sandboxd/runtime"
)

// EnvdDialCounter is a backend that counts the connections opened to its
// sandboxes' envd: for tests of what reuses or spares them.
type EnvdDialCounter struct {
	runtime.Backend
	Dials atomic.Int64
}

func (d *EnvdDialCounter) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	if port == runtime.EnvdPort {
		d.Dials.Add(1)
	}
	return d.Backend.Dial(ctx, id, port)
}
