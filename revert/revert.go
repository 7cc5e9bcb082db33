// Package revert is an undo stack for multi-step operations that acquire
// resources one after another (a mount, a cgroup, a container, a store row):
// register the undo right after each step succeeds, defer Fail, and call
// Success at the end. If the function returns early, Fail runs the undos once,
// newest first.
//
//	r := revert.New()
//	defer r.Fail()
//	if err := mount(...); err != nil {
//		return err
//	}
//	r.Add(func() { unmount(...) })
//	...
//	r.Success()
//
// Undos take no context: one that needs one should use
// context.WithoutCancel of the operation's context, so a cancelled request
// still cleans up.
package revert

import "sync"

// Reverter is an undo stack. Its zero value is ready to use. It is safe for
// concurrent use, though undos are usually added from one goroutine.
type Reverter struct {
	mu    sync.Mutex
	undos []func()
	done  bool
}

// New returns an empty Reverter.
func New() *Reverter { return &Reverter{} }

// Add pushes an undo. Adding after Fail or Success runs nothing later.
func (r *Reverter) Add(undo func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		r.undos = append(r.undos, undo)
	}
}

// Fail runs the undos in reverse order of Add, once. After Success, or a
// first Fail, it does nothing.
func (r *Reverter) Fail() {
	r.mu.Lock()
	undos := r.undos
	r.undos, r.done = nil, true
	r.mu.Unlock()
	for i := len(undos) - 1; i >= 0; i-- {
		undos[i]()
	}
}

// Success drops the undos without running them: the operation keeps what it
// acquired.
func (r *Reverter) Success() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.undos, r.done = nil, true
}

// Clone returns a new Reverter holding the same undos, for handing the
// cleanup of a successful operation to a later teardown.
func (r *Reverter) Clone() *Reverter {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &Reverter{undos: append([]func(){}, r.undos...)}
}
