package incus_test

import (
	"testing"

	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// TestVolumes: Incus custom volumes pass the volume suite.
func TestVolumes(t *testing.T) {
	b, _ := newBackend(t)
	runtimetest.Volumes(t, b, "vol-"+randHex())
}
