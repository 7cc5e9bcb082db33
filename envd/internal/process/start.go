package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/internal/cgroup"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// timeoutHeader is the Connect deadline header. On Start, E2B's envd (and so
// its SDKs, whose commands.run defaults to 60 s) also uses it as the lifetime
// of the process, background or not.
const timeoutHeader = "Connect-Timeout-Ms"

// Start runs a process and streams its events: start, data..., end.
func (s *Service) Start(ctx context.Context, req *connect.Request[rpc.StartRequest], stream *connect.ServerStream[rpc.StartResponse]) error {
	p, sub, err := s.start(req.Msg, req.Header())
	if err != nil {
		return rpcerr.Connect(err)
	}
	return s.stream(ctx, req.Header(), p, sub, func(ev *rpc.ProcessEvent) error {
		return stream.Send(&rpc.StartResponse{Event: ev})
	})
}

// start spawns the process of msg and returns it with a subscription that
// has seen nothing yet, so the caller's stream misses none of the output.
func (s *Service) start(msg *rpc.StartRequest, h http.Header) (*process, *subscription[*rpc.ProcessEvent], error) {
	spec, err := s.spawnSpec(msg, h)
	if err != nil {
		return nil, nil, err
	}
	timeout, err := lifetime(h)
	if err != nil {
		return nil, nil, err
	}

	p := newProcess(s.base, timeout, spec)
	if err := s.admit(p); err != nil {
		p.cancel()
		return nil, nil, err
	}
	// Before the child exists: nothing is missed. The starting client applies
	// backpressure: while it is attached and behind, the process waits for it.
	sub, _ := p.events.subscribeBlocking()
	leftovers.check()
	p.cg = s.newCgroup()
	outs, err := p.spawn(spec)
	if errors.Is(err, cgroup.ErrRetry) {
		outs, err = p.spawn(spec) // clone3 is refused: the other way in
	}
	if errors.Is(err, syscall.EAGAIN) && leftovers.sweep() > 0 {
		// Out of pids: what ended commands left running (a fork bomb's
		// survivors, most likely) goes, and envd can start commands again.
		outs, err = p.spawn(spec)
	}
	if err != nil && p.cg != nil && !errors.Is(err, syscall.EAGAIN) {
		// Once more without the cgroup: if that works, the kernel refused
		// the clone into it (no clone3, say), and commands run without
		// cgroups from now on; if not, the error is the command's.
		cg := p.cg
		p.cg = nil
		if outs, err = p.spawn(spec); err == nil {
			s.log.Warn("commands get no cgroup of their own: the kernel refused the clone into one")
			s.noCgroups.Store(true)
		}
		cg.Discard()
	}
	if err != nil {
		if p.cg != nil {
			p.cg.Discard()
		}
		sub.cancel()
		p.cancel()
		s.abandon(p)
		return nil, nil, err
	}
	if p.cg != nil {
		p.cg.Started()
	}
	s.register(p)
	leftovers.forget(int(p.pid))
	// The command line is the user's own and shows in ps(1) anyway; the
	// env, which may hold secrets, is never logged.
	s.log.Info("process started", "pid", p.pid, "cmd", spec.cfg.GetCmd(), "args", fmt.Sprintf("%q", spec.cfg.GetArgs()),
		"user", spec.user.Name, "cwd", spec.dir, "pty", spec.pty != nil, "tag", msg.GetTag(), "timeout", timeout)

	go func() {
		defer s.wg.Done()
		// Logged before the end event goes out: a client that reads
		// envd's log once its command returned finds the line there.
		p.run(outs, func() {
			s.log.Info("process ended", "pid", p.pid, "tag", msg.GetTag(), "exit_code", p.end.GetExitCode(),
				"exited", p.end.GetExited(), "status", p.end.GetStatus())
		})
		s.retire(p)
	}()
	return p, sub, nil
}

// newCgroup is a cgroup for a command about to start, nil without a tree
// or when none can be made (the backend's cap on the sandbox's cgroups):
// the command then runs in envd's, as it would without cgroups.
func (s *Service) newCgroup() *cgroup.Cgroup {
	if s.cgroups == nil || s.noCgroups.Load() {
		return nil
	}
	t := s.cgroups()
	if t == nil {
		return nil
	}
	cg, err := t.New()
	if err != nil {
		s.log.Warn("a command without a cgroup of its own", "err", err)
		return nil
	}
	return cg
}

// UseCgroups starts each command in a cgroup of its own in the tree that
// tree returns (nil: none); it is called before anything is served. Its
// first call organises the tree; a start that comes first waits for it
// (sync.OnceValue), so no command escapes.
func (s *Service) UseCgroups(tree func() *cgroup.Tree) { s.cgroups = tree }

// Cgroups organises the tree now, if UseCgroups gave one: off the way of
// the first command.
func (s *Service) Cgroups() {
	if s.cgroups != nil {
		s.cgroups()
	}
}

// spawnSpec validates msg and resolves who runs what, where, with which
// environment.
func (s *Service) spawnSpec(msg *rpc.StartRequest, h http.Header) (*spawnSpec, error) {
	cfg := msg.GetProcess()
	if cfg == nil {
		return nil, fmt.Errorf("%w: process config is required", rpcerr.ErrInvalidArgument)
	}
	if cfg.GetCmd() == "" {
		return nil, fmt.Errorf("%w: process cmd is required", rpcerr.ErrInvalidArgument)
	}
	for _, a := range cfg.GetArgs() {
		if strings.ContainsRune(a, 0) {
			return nil, fmt.Errorf("%w: argument contains a NUL byte", rpcerr.ErrInvalidArgument)
		}
	}
	u, err := permissions.RequestUser(h, s.defaults)
	if err != nil {
		return nil, err
	}
	dir, err := permissions.ResolvePath(cfg.GetCwd(), u, s.defaults.Workdir())
	if err != nil {
		return nil, err
	}
	switch fi, err := os.Stat(dir); {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w: cwd %q does not exist", rpcerr.ErrInvalidArgument, dir)
	case err != nil:
		return nil, fmt.Errorf("cwd %q: %w", dir, err)
	case !fi.IsDir():
		return nil, fmt.Errorf("%w: cwd %q is not a directory", rpcerr.ErrInvalidArgument, dir)
	}
	env, err := buildEnv(u, s.defaults.Envs(), cfg.GetEnvs())
	if err != nil {
		return nil, err
	}
	path, err := lookPath(cfg.GetCmd(), envValue(env, "PATH"), dir)
	if err != nil {
		return nil, err
	}
	spec := &spawnSpec{
		cfg:  cfg,
		path: path,
		env:  env,
		dir:  dir,
		user: u,
		pty:  msg.GetPty(),
		// Absent means true: clients older than envd 0.3.0 expect an open stdin.
		stdin: msg.Stdin == nil || msg.GetStdin(),
	}
	if msg.GetTag() != "" {
		tag := msg.GetTag()
		spec.tag = &tag
	}
	return spec, nil
}

// lifetime reads the process lifetime from Connect-Timeout-Ms; zero means
// unlimited.
func lifetime(h http.Header) (time.Duration, error) {
	v := h.Get(timeoutHeader)
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || ms > int64(time.Duration(1<<63-1)/time.Millisecond) {
		return 0, fmt.Errorf("%w: %s %q", rpcerr.ErrInvalidArgument, timeoutHeader, v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
