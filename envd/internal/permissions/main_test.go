package permissions

import (
	"testing"

	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
)

// TestMain: against an agent binary (ENVD_TEST_BINARY) nothing here runs.
func TestMain(m *testing.M) {
	agenttest.Main(m, "unit tests of path resolution and Basic-auth parsing")
}
