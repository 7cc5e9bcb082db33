//go:build faultinject

package faultinject

import (
	"os"
	"strings"
)

// Pause blocks forever at point when SANDBOXD_FAULT_PAUSE names it, after
// writing detail to the file it names.
func Pause(point, detail string) {
	p, file, ok := strings.Cut(os.Getenv("SANDBOXD_FAULT_PAUSE"), ":")
	if !ok || p != point {
		return
	}
	// Whole or absent: the test reads it as soon as it exists.
	if os.WriteFile(file+".tmp", []byte(detail), 0o600) == nil {
		_ = os.Rename(file+".tmp", file)
	}
	select {}
}
