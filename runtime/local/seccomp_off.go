//go:build !seccomp

package local

// seccompEnabled: without -tags seccomp libcontainer cannot apply a
// seccomp profile, so sandboxes run without one. Production builds must use
// the tag (see DEPS.md); Backend.SeccompEnabled reports which this is.
const seccompEnabled = false
