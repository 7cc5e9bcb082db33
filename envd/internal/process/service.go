// Package process implements envd's process.Process Connect service: it
// starts processes as sandbox users, streams their output to any number of
// readers and takes their input, signals and terminal resizes.
package process

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/api/process/processconnect"
	"github.com/sandboxd/sandboxd/envd/internal/cgroup"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// retention is how long an exited process stays connectable, so a client that
// reconnects after the exit (or was never attached when it happened) still
// learns how the process ended.
const retention = 30 * time.Second

// Service owns every process envd started.
type Service struct {
	processconnect.UnimplementedProcessHandler
	log       *slog.Logger
	defaults  *execctx.Defaults
	retention time.Duration

	// base is the parent of every process context. Processes outlive the RPC
	// that started them, so they hang off the service, not the request;
	// Close cancels base to kill them all.
	base     context.Context
	shutdown context.CancelFunc
	// wg counts admitted processes until their end event is published and
	// every goroutine serving them has returned.
	wg sync.WaitGroup

	// cgroups, set before anything is served, gives the tree each command
	// gets a cgroup of its own in (nil: none); it organises the tree on its
	// first call. noCgroups: the kernel refused a clone into one.
	cgroups   func() *cgroup.Tree
	noCgroups atomic.Bool

	mu     sync.Mutex
	closed bool
	procs  map[uint32]*process // running and retained; pid is set once started
	tags   map[string]*process // latest process per tag, including pending starts
}

// New returns the service; Close kills what it still runs.
func New(log *slog.Logger, defaults *execctx.Defaults) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base, shutdown := context.WithCancel(context.Background())
	return &Service{
		log:       log,
		defaults:  defaults,
		retention: retention,
		base:      base,
		shutdown:  shutdown,
		procs:     map[uint32]*process{},
		tags:      map[string]*process{},
	}
}

// Handler returns the Connect route prefix and handler.
func (s *Service) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	return processconnect.NewProcessHandler(s, opts...)
}

// Close kills every process, waits until each has reported its end, and
// makes further Starts fail. Safe to call more than once.
func (s *Service) Close() {
	s.mu.Lock()
	s.closed = true
	for _, p := range s.procs {
		if p.evict != nil {
			p.evict.Stop()
		}
	}
	s.mu.Unlock()
	s.shutdown()
	s.wg.Wait()
}

// admit reserves p's tag and counts p in wg, before anything is spawned, so
// that two Starts cannot claim one tag and Close cannot miss a process.
func (s *Service) admit(p *process) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("envd is shutting down: %w", context.Canceled)
	}
	if p.tag != nil {
		if old := s.tags[*p.tag]; old != nil && !old.finished() {
			return fmt.Errorf("%w: a running process already has tag %q", rpcerr.ErrAlreadyExists, *p.tag)
		}
		// An exited process keeps its retention entry by pid, but its tag now
		// names the new process.
		s.tags[*p.tag] = p
	}
	s.wg.Add(1)
	return nil
}

// abandon undoes admit after a failed spawn.
func (s *Service) abandon(p *process) {
	s.mu.Lock()
	if p.tag != nil && s.tags[*p.tag] == p {
		delete(s.tags, *p.tag)
	}
	s.mu.Unlock()
	s.wg.Done()
}

// register makes a started process visible by pid.
func (s *Service) register(p *process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.pid = uint32(p.cmd.Process.Pid)
	// The kernel reused the pid of a process we still retain: the new one wins.
	if old := s.procs[p.pid]; old != nil {
		s.forgetLocked(old)
	}
	s.procs[p.pid] = p
}

// retire runs once p has published its end event: it keeps p connectable for
// the retention window, then forgets it.
func (s *Service) retire(p *process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	p.evict = time.AfterFunc(s.retention, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.forgetLocked(p)
	})
}

func (s *Service) forgetLocked(p *process) {
	if p.evict != nil {
		p.evict.Stop()
	}
	if s.procs[p.pid] == p {
		delete(s.procs, p.pid)
	}
	if p.tag != nil && s.tags[*p.tag] == p {
		delete(s.tags, *p.tag)
	}
}

// lookup finds a started process, running or retained, by pid or tag.
func (s *Service) lookup(sel *rpc.ProcessSelector) (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *rpc.ProcessSelector_Pid:
		if p := s.procs[v.Pid]; p != nil {
			return p, nil
		}
		return nil, fmt.Errorf("%w: process with pid %d", rpcerr.ErrNotFound, v.Pid)
	case *rpc.ProcessSelector_Tag:
		// A pending start has reserved the tag but has no pid yet; it is not
		// there for clients until its start event is.
		if p := s.tags[v.Tag]; p != nil && s.procs[p.pid] == p {
			return p, nil
		}
		return nil, fmt.Errorf("%w: process with tag %q", rpcerr.ErrNotFound, v.Tag)
	default:
		return nil, fmt.Errorf("%w: process selector needs a pid or a tag", rpcerr.ErrInvalidArgument)
	}
}

// lookupRunning is lookup for RPCs that act on a live process: an exited one
// is not found, as with E2B's envd (the SDK's kill then returns false).
func (s *Service) lookupRunning(sel *rpc.ProcessSelector) (*process, error) {
	p, err := s.lookup(sel)
	if err != nil {
		return nil, err
	}
	if p.finished() {
		return nil, p.errExited()
	}
	return p, nil
}

// running lists the processes that have not ended, ordered by pid.
func (s *Service) running() []*process {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*process
	for _, p := range s.procs {
		if !p.finished() {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *process) int { return cmp.Compare(a.pid, b.pid) })
	return out
}
