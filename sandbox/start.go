package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// StartTag tags a template's start command among the sandbox's processes.
const StartTag = "e2b-start-cmd"

// DefaultReadyWait is how long after its start a template without a ready
// command is taken to be ready (E2B waits 20 s; a warm pool hides either).
const DefaultReadyWait = 2 * time.Second

// StartTimeout bounds a template's start: its start command launched and
// its ready command succeeding. A template that does not get ready in it
// fails the build that checks it, and the create or warm member that
// starts it.
const StartTimeout = 5 * time.Minute

// readyAttempt bounds one run of a ready command.
const readyAttempt = 10 * time.Second

// WaitReady runs cfg's ready command until it succeeds, or until ended
// reports the start command gone (E2B counts a start command that finished
// as ready), or ctx ends. Without a ready command it waits
// DefaultReadyWait.
func WaitReady(ctx context.Context, c *envdconn.Client, cfg TemplateConfig, ended func(context.Context) bool) error {
	if cfg.ReadyCmd == "" {
		select {
		case <-time.After(DefaultReadyWait):
			return nil
		case <-ctx.Done():
			return fmt.Errorf("ready wait: %w", ctx.Err())
		}
	}
	delay := 20 * time.Millisecond
	var last envdconn.Exit
	for {
		actx, cancel := context.WithTimeout(ctx, readyAttempt)
		x, err := c.Run(actx, envdconn.Command{Cmd: "/bin/sh", Args: []string{"-c", cfg.ReadyCmd}, Env: cfg.Env, Cwd: cfg.Workdir}, nil)
		cancel()
		if err == nil && x.ExitCode == 0 {
			return nil
		}
		if err == nil {
			last = x
		}
		if ended(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the ready command %q did not succeed (last: %s): %w", cfg.ReadyCmd, last.Status, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// startTemplate runs a built template's start command in sandbox id and
// waits until it is ready: a sandbox is handed out only then, so a warm
// pool pays the start, not the create. token is envd's access token once
// /init has set one.
func (m *Manager) startTemplate(ctx context.Context, id, token string, cfg TemplateConfig) error {
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	c := m.envdClient(id, token)
	defer c.Close()
	cmd := envdconn.Command{Cmd: "/bin/sh", Args: []string{"-c", cfg.StartCmd}, Env: cfg.Env, Cwd: cfg.Workdir, Tag: StartTag}
	// envd takes a Start's deadline (Connect-Timeout-Ms, E2B's command
	// timeout) for the process's lifetime: with ctx's, every start command
	// (a code interpreter's Jupyter and server) was killed StartTimeout
	// after the create, in use or waiting in a pool. So the Start carries
	// no deadline; ctx's end cancels it until it has started. Its stream
	// then goes on, the sandbox's follower's, copying the output into the
	// sandbox's log (a warm member's too: its log opens at the claim).
	started := make(chan error, 1)
	ok := m.follow.run(id, func(fctx context.Context) {
		// A client of its own: the stream's connection lives as long as
		// the follower, and c's idle ones go when this returns.
		fc := m.envdClient(id, token)
		sctx, scancel := context.WithCancel(fctx)
		defer scancel()
		detach := context.AfterFunc(ctx, scancel)
		o, err := fc.StartOutput(sctx, cmd)
		if !detach() && err == nil {
			o.Close() // ctx ended meanwhile: the create is failing
			err = ctx.Err()
		}
		started <- err
		if err != nil {
			fc.Close()
			return
		}
		m.followStart(sctx, id, fc, o)
	})
	if !ok {
		return errors.New("template start command: the manager is closed")
	}
	if err := <-started; err != nil {
		return fmt.Errorf("template start command: %w", err)
	}
	ended := func(ctx context.Context) bool {
		running, err := c.Running(ctx, StartTag)
		return err == nil && !running
	}
	if err := WaitReady(ctx, c, cfg, ended); err != nil {
		return fmt.Errorf("template start: %w", err)
	}
	return nil
}

// PrepareMember readies a new, healthy warm member of template: a built
// template's start command runs until the template is ready, so that a
// claim hands out a sandbox that is.
func (m *Manager) PrepareMember(ctx context.Context, id, template string) error {
	cfg, ok := m.templateConfig(template)
	if !ok || cfg.StartCmd == "" {
		return nil
	}
	return m.startTemplate(ctx, id, "", cfg)
}

func (m *Manager) templateConfig(template string) (TemplateConfig, bool) {
	if m.cfg.Templates == nil {
		return TemplateConfig{}, false
	}
	return m.cfg.Templates.Config(template)
}
