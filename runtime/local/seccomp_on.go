//go:build seccomp

package local

// seccompEnabled: libcontainer was built with seccomp support (-tags
// seccomp, libseccomp), so sandboxes get the profile from seccompProfile.
const seccompEnabled = true
