package native

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/server/httpx"
)

const (
	execDefaultTimeout = 60 * time.Second
	execMaxTimeout     = 24 * time.Hour
	execDefaultOutput  = 1 << 20
	execMaxOutput      = 16 << 20
	// killTimeout bounds the SIGKILL sent after a client went away.
	killTimeout = 5 * time.Second
	// drainTimeout bounds the read of a process stream past its exit event.
	drainTimeout = time.Second
)

// processSpec is a command to start, from either surface (REST or websocket).
type processSpec struct {
	cmd  string
	argv []string
	env  map[string]string
	cwd  string
}

// config validates the spec and turns it into envd's ProcessConfig: cmd runs
// under /bin/sh -c, argv as is.
func (s processSpec) config() (*process.ProcessConfig, error) {
	var pc process.ProcessConfig
	switch {
	case s.cmd != "" && len(s.argv) > 0:
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "give cmd or argv, not both")
	case s.cmd != "":
		pc.Cmd, pc.Args = "/bin/sh", []string{"-c", s.cmd}
	case len(s.argv) > 0 && s.argv[0] != "":
		pc.Cmd, pc.Args = s.argv[0], s.argv[1:]
	default:
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "missing cmd or argv")
	}
	pc.Envs = s.env
	if s.cwd != "" {
		pc.Cwd = &s.cwd
	}
	return &pc, nil
}

func (c *envdConn) selector(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

// kill sends SIGKILL to a process's group, on a context of its own: it runs
// when the request's context is already done.
func (c *envdConn) kill(ctx context.Context, pid uint32) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	defer cancel()
	return c.Kill(ctx, pid)
}

// endSignal is the signal name in an end event's status ("signal: killed"),
// or "".
func endSignal(end *process.ProcessEvent_EndEvent) string {
	if end.GetExited() {
		return ""
	}
	s, ok := strings.CutPrefix(end.GetStatus(), "signal: ")
	if !ok {
		return ""
	}
	return s
}

// startErr keeps a failed start from reading as a missing sandbox: envd
// answers not_found for a missing binary, which is the caller's bad
// argument, not a 404 of the route.
func startErr(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() == connect.CodeNotFound {
		return errdefs.New(errdefs.ErrInvalidArgument, ce.Message())
	}
	return err
}

// endError is an end event's error, unless it only restates the exit
// status or the signal ("exit status 1", "signal: killed"), which the
// other fields carry.
func endError(end *process.ProcessEvent_EndEvent) string {
	if e := end.GetError(); e != end.GetStatus() {
		return e
	}
	return ""
}

// capped keeps the first max bytes written to it.
type capped struct {
	buf       []byte
	max       int
	truncated bool
}

func (c *capped) write(p []byte) {
	if room := c.max - len(c.buf); room < len(p) {
		p = p[:max(room, 0)]
		c.truncated = true
	}
	c.buf = append(c.buf, p...)
}

// Exec runs a command to completion and answers its output, each stream
// capped at max_output_bytes (reported as truncated). The process is killed
// when the timeout passes or the client goes away.
func (a *API) Exec(w http.ResponseWriter, r *http.Request, id string) {
	var b nativeapi.ExecPost
	if err := httpx.DecodeJSON(r, &b); err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	res, err := a.exec(r.Context(), id, b)
	if err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	httpx.WriteJSON(w, http.StatusOK, res)
}

func (a *API) exec(ctx context.Context, id string, b nativeapi.ExecPost) (*nativeapi.ExecResult, error) {
	spec := processSpec{cmd: httpx.Deref(b.Cmd), argv: httpx.Deref(b.Argv), env: httpx.Deref(b.Env), cwd: httpx.Deref(b.Cwd)}
	pc, err := spec.config()
	if err != nil {
		return nil, err
	}
	timeout, limit, err := execBounds(b)
	if err != nil {
		return nil, err
	}

	c, err := a.envd(ctx, id, httpx.Deref(b.User))
	if err != nil {
		return nil, err
	}
	defer c.close()

	start := time.Now()
	// The stream's deadline becomes envd's Connect-Timeout-Ms, which bounds
	// the process's life inside the sandbox as well.
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req := connect.NewRequest(&process.StartRequest{Process: pc, Stdin: ptr(b.Stdin != nil)})
	c.Auth(req.Header())
	stream, err := c.Process().Start(sctx, req)
	if err != nil {
		return nil, startErr(err)
	}
	defer stream.Close()

	out, errOut := &capped{max: limit}, &capped{max: limit}
	var (
		pid uint32
		end *process.ProcessEvent_EndEvent
	)
	for end == nil && stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			pid = ev.GetStart().GetPid()
			if b.Stdin != nil {
				// A process that exits or closes stdin before reading it
				// all is not an error, as with a shell pipe: its exit
				// status tells.
				if err := c.writeStdin(sctx, pid, []byte(*b.Stdin), true); err != nil {
					a.log.Debug("exec: stdin not delivered", "sandbox_id", id, "pid", pid, "err", err)
				}
			}
		case ev.GetData() != nil:
			d := ev.GetData()
			out.write(d.GetStdout())
			out.write(d.GetPty())
			errOut.write(d.GetStderr())
		case ev.GetEnd() != nil:
			end = ev.GetEnd()
		}
	}
	if end != nil {
		drain(stream, cancel)
	}
	res := &nativeapi.ExecResult{
		Stdout:    string(out.buf),
		Stderr:    string(errOut.buf),
		Truncated: out.truncated || errOut.truncated,
		ExitCode:  -1,
	}
	if end == nil {
		serr := stream.Err()
		if pid != 0 {
			if kerr := c.kill(ctx, pid); kerr != nil {
				a.log.Warn("exec: kill after stream end", "sandbox_id", id, "pid", pid, "err", kerr)
			}
		}
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err() // the client is gone; nobody reads this
		case errors.Is(sctx.Err(), context.DeadlineExceeded) || connect.CodeOf(serr) == connect.CodeDeadlineExceeded:
			res.TimedOut = true
			res.Signal = ptr("killed")
		case serr != nil && pid == 0:
			return nil, startErr(serr)
		case serr != nil:
			return nil, serr
		default:
			return nil, errdefs.New(errdefs.ErrUnavailable, "envd ended the stream without an exit event")
		}
	} else {
		setExit(res, end)
	}
	res.DurationMs = time.Since(start).Milliseconds()
	return res, nil
}

// drain reads a process stream to its end, so that its connection goes back
// to the pool: envd ends it right after the exit event, and cancel (the
// stream's) bounds one that does not.
func drain(stream *connect.ServerStreamForClient[process.StartResponse], cancel context.CancelFunc) {
	t := time.AfterFunc(drainTimeout, cancel)
	defer t.Stop()
	for stream.Receive() {
	}
}

// setExit reports how the process ended.
func setExit(res *nativeapi.ExecResult, end *process.ProcessEvent_EndEvent) {
	res.ExitCode = int(end.GetExitCode())
	if s := endSignal(end); s != "" {
		res.Signal = &s
	}
	if e := endError(end); e != "" {
		res.Error = &e
	}
}

// execBounds is an exec's timeout and output cap, defaults and maxima
// applied.
func execBounds(b nativeapi.ExecPost) (timeout time.Duration, limit int, err error) {
	timeout = time.Duration(httpx.Deref(b.Timeout)) * time.Second
	switch {
	case timeout < 0:
		return 0, 0, errdefs.New(errdefs.ErrInvalidArgument, "timeout must not be negative")
	case timeout == 0:
		timeout = execDefaultTimeout
	}
	limit = httpx.Deref(b.MaxOutputBytes)
	switch {
	case limit < 0:
		return 0, 0, errdefs.New(errdefs.ErrInvalidArgument, "max_output_bytes must not be negative")
	case limit == 0:
		limit = execDefaultOutput
	}
	return min(timeout, execMaxTimeout), min(limit, execMaxOutput), nil
}

// writeStdin sends data to a process's stdin, then EOF if closeAfter.
func (c *envdConn) writeStdin(ctx context.Context, pid uint32, data []byte, closeAfter bool) error {
	if len(data) > 0 {
		req := connect.NewRequest(&process.SendInputRequest{
			Process: c.selector(pid),
			Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: data}},
		})
		c.Auth(req.Header())
		if _, err := c.Process().SendInput(ctx, req); err != nil {
			return err
		}
	}
	if !closeAfter {
		return nil
	}
	req := connect.NewRequest(&process.CloseStdinRequest{Process: c.selector(pid)})
	c.Auth(req.Header())
	_, err := c.Process().CloseStdin(ctx, req)
	return err
}
