// Package execctx holds the sandbox-wide execution defaults that POST /init
// sets and every process and file request reads: environment variables, the
// default user and the default working directory.
package execctx

import (
	"maps"
	"sync"
)

// Defaults is safe for concurrent use.
type Defaults struct {
	mu      sync.RWMutex
	envs    map[string]string
	user    string
	workdir string
}

// New returns defaults with the given default user and no env vars.
func New(defaultUser string) *Defaults {
	return &Defaults{user: defaultUser, envs: map[string]string{}}
}

// Envs returns a copy of the sandbox-wide env vars.
func (d *Defaults) Envs() map[string]string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return maps.Clone(d.envs)
}

// User is the account used when a request names none.
func (d *Defaults) User() string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.user
}

// Workdir is the directory used when a request gives no path or cwd; empty
// means the user's home.
func (d *Defaults) Workdir() string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.workdir
}

// MergeEnvs adds env vars; later values win.
func (d *Defaults) MergeEnvs(envs map[string]string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	maps.Copy(d.envs, envs)
}

// SetUser sets the default user; empty is ignored.
func (d *Defaults) SetUser(name string) {
	if name == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.user = name
}

// SetWorkdir sets the default working directory; empty is ignored.
func (d *Defaults) SetWorkdir(dir string) {
	if dir == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.workdir = dir
}
