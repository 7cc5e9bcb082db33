// Package agentbin owns one choice: which in-sandbox agent a directory of
// built binaries offers, so that sandboxd serve and the bench's copies of
// the binaries run the same one.
package agentbin

import (
	"os"
	"path/filepath"
)

// Name is the agent in dir: envd-rs where it was built (envd's protocol
// without a Go runtime: a third of the CPU and a sixth of the memory per
// sandbox, docs/agent-rust.md), else envd. It does not check that envd
// exists: whoever runs it reports a missing one with its path.
func Name(dir string) string {
	if fi, err := os.Stat(filepath.Join(dir, "envd-rs")); err == nil && fi.Mode().IsRegular() {
		return "envd-rs"
	}
	return "envd"
}

// Path is Name's agent with dir joined.
func Path(dir string) string { return filepath.Join(dir, Name(dir)) }
