package envd

import (
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/pid1"
	"github.com/sandboxd/sandboxd/internal/loopback"
)

// BecomeInit readies this process to be the sandbox's PID 1: it reaps
// orphans from now on, so it must run before anything can fork (see
// envd/internal/pid1), and sets the loopback up. A loopback error leaves
// envd serving on its unix socket, so the caller reports it and goes on.
func BecomeInit() error {
	pid1.Reap()
	return loopback.Up()
}

// SpareInitThreads starts the idle threads that keep envd, as PID 1, serving
// through a fork bomb (pid1.SpareThreads). It is start-up work that no
// request needs: Config.AfterFirstAnswer.
func SpareInitThreads() { pid1.SpareThreads(4) }

// LookupUser fails when name is not a user of the sandbox.
func LookupUser(name string) error {
	_, err := permissions.Lookup(name)
	return err
}
