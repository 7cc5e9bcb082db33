//go:build !faultinject

package faultinject

// Pause does nothing: this build has no fault injection.
func Pause(point, detail string) {}
