package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

const (
	execDefaultTimeout = 60 * time.Second
	execMaxTimeout     = 24 * time.Hour
	// killTimeout bounds the SIGKILL sent after the caller cancelled.
	killTimeout = 5 * time.Second
	// progressTick is how often a running command's progress is looked
	// at: new output is reported at this pace at most, and silence is
	// reported every heartbeat.
	progressTick = 250 * time.Millisecond
	heartbeat    = 2 * time.Second
	// progressOutput bounds the output one progress notification carries
	// (its last bytes).
	progressOutput = 2 << 10
)

var execTool = &sdk.Tool{
	Name: "sandbox_exec",
	Description: "Run a shell command in a sandbox and wait for it to end; returns its stdout, stderr and exit code. " +
		"The command runs with /bin/bash -l -c, so pipes, redirections, && and environment expansion work. " +
		"Each stream keeps its first 16 KiB and last 48 KiB: more output is cut in the middle, with a note saying how " +
		"many bytes were cut (redirect to a file and use sandbox_read_file for all of it). The command is killed when " +
		"its timeout passes (timed_out: true) or when the call is cancelled. Progress notifications carry new output " +
		"while it runs.",
	Annotations: &sdk.ToolAnnotations{OpenWorldHint: ptr(true)},
}

type execIn struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"the sandbox's id, from sandbox_create or sandbox_list"`
	Command   string            `json:"command" jsonschema:"the shell command, run as /bin/bash -l -c COMMAND"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory; default the user's home (/home/user)"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables for this command, on top of the sandbox's"`
	User      string            `json:"user,omitempty" jsonschema:"user to run as: user (default) or root"`
	Timeout   int               `json:"timeout,omitempty" jsonschema:"seconds before the command is killed; default 60, at most 86400"`
}

func (in execIn) sandbox() string { return in.SandboxID }

type execOut struct {
	Stdout      string `json:"stdout"`
	Stderr      string `json:"stderr"`
	ExitCode    int    `json:"exit_code" jsonschema:"the command's exit status; -1 when it was killed by a signal"`
	Signal      string `json:"signal,omitempty" jsonschema:"the signal that killed it, e.g. killed"`
	TimedOut    bool   `json:"timed_out,omitempty" jsonschema:"true when the timeout killed it"`
	StdoutBytes int64  `json:"stdout_bytes" jsonschema:"bytes the command wrote to stdout, including any cut"`
	StderrBytes int64  `json:"stderr_bytes" jsonschema:"bytes the command wrote to stderr, including any cut"`
	DurationMs  int64  `json:"duration_ms"`
}

func (s *Server) exec(ctx context.Context, req *sdk.CallToolRequest, in execIn) (execOut, error) {
	if err := requireID(in.SandboxID); err != nil {
		return execOut{}, err
	}
	if strings.TrimSpace(in.Command) == "" {
		return execOut{}, errdefs.New(errdefs.ErrInvalidArgument, "missing command")
	}
	timeout := time.Duration(in.Timeout) * time.Second
	switch {
	case timeout < 0:
		return execOut{}, errdefs.New(errdefs.ErrInvalidArgument, "timeout must not be negative")
	case timeout == 0:
		timeout = execDefaultTimeout
	}
	timeout = min(timeout, execMaxTimeout)
	c, done, err := s.cfg.Envd.Envd(ctx, in.SandboxID, in.User)
	if err != nil {
		return execOut{}, err
	}
	defer done()

	var (
		mu             sync.Mutex // the streams; the progress reporter reads them
		stdout, stderr clipped
		pid            uint32
	)
	var rep *reporter
	if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
		rep = startReporter(ctx, req.Session, tok, timeout, &mu, &stdout, &stderr)
		defer rep.stop()
	}
	start := time.Now()
	// The stream's deadline becomes envd's Connect-Timeout-Ms, which
	// bounds the process's life inside the sandbox too.
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	exit, err := c.Run(sctx, envdconn.Command{
		Cmd: "/bin/bash", Args: []string{"-l", "-c", in.Command}, Env: in.Env, Cwd: in.Cwd,
		Started: func(p uint32) { pid = p },
	}, func(o, e []byte) {
		mu.Lock()
		defer mu.Unlock()
		stdout.write(o)
		stderr.write(e)
		if rep != nil {
			rep.pending(o, e)
		}
	})
	if err != nil && pid != 0 {
		// envd does not end a process whose client went away: the caller
		// cancelled, or the timeout passed and envd may not have acted yet.
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
		if kerr := c.Kill(kctx, pid); kerr != nil {
			s.cfg.Log.WarnContext(ctx, "mcp exec: kill", "sandbox_id", in.SandboxID, "pid", pid, "err", kerr)
		}
		kcancel()
	}
	if rep != nil {
		rep.stop() // no notification after the result
	}
	mu.Lock()
	defer mu.Unlock()
	out := execOut{
		Stdout: stdout.String("stdout"), Stderr: stderr.String("stderr"),
		StdoutBytes: stdout.total, StderrBytes: stderr.total,
		DurationMs: time.Since(start).Milliseconds(),
	}
	switch {
	case ctx.Err() != nil:
		return execOut{}, ctx.Err()
	case err != nil && errors.Is(sctx.Err(), context.DeadlineExceeded):
		out.TimedOut, out.ExitCode, out.Signal = true, -1, "killed"
		return out, nil
	case err != nil && pid == 0:
		return execOut{}, startErr(err)
	case err != nil:
		return execOut{}, err
	}
	out.ExitCode = exit.ExitCode
	if sig, ok := strings.CutPrefix(exit.Status, "signal: "); ok {
		out.Signal = sig
		out.TimedOut = errors.Is(sctx.Err(), context.DeadlineExceeded)
	}
	return out, nil
}

// Output a command wrote is kept in part: its head and its tail.
const (
	headMax = 16 << 10
	tailMax = 48 << 10
)

// clipped keeps the first headMax and the last tailMax bytes written to it,
// and counts them all.
type clipped struct {
	head, tail []byte
	total      int64
}

func (c *clipped) write(p []byte) {
	c.total += int64(len(p))
	if room := headMax - len(c.head); room > 0 {
		n := min(room, len(p))
		c.head = append(c.head, p[:n]...)
		p = p[n:]
	}
	c.tail = append(c.tail, p...)
	if len(c.tail) > 2*tailMax { // amortized: move the tail down now and then
		n := copy(c.tail, c.tail[len(c.tail)-tailMax:])
		c.tail = c.tail[:n]
	}
}

// String is the kept output; where bytes were cut, a note names the
// stream and says how many. A cut never splits a UTF-8 sequence.
func (c *clipped) String(stream string) string {
	tail := c.tail
	if len(tail) > tailMax {
		tail = tail[len(tail)-tailMax:]
	}
	if int64(len(c.head)+len(tail)) == c.total {
		return string(c.head) + string(tail)
	}
	head, tail := trimRuneEnd(c.head), trimRuneStart(tail)
	cut := c.total - int64(len(head)+len(tail))
	return fmt.Sprintf("%s\n[sandboxd: %d bytes of %s cut here; it wrote %d bytes, of which the first %d and the last %d are shown]\n%s",
		head, cut, stream, c.total, len(head), len(tail), tail)
}

// trimRuneEnd drops an incomplete UTF-8 sequence at the end of b.
func trimRuneEnd(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-4; i-- {
		c := b[i]
		if c < 0x80 {
			return b // ASCII: complete
		}
		if c >= 0xC0 { // a lead byte: complete if its sequence fits
			n := 2
			if c >= 0xE0 {
				n = 3
			}
			if c >= 0xF0 {
				n = 4
			}
			if len(b)-i < n {
				return b[:i]
			}
			return b
		}
	}
	return b
}

// trimRuneStart drops continuation bytes at the start of b.
func trimRuneStart(b []byte) []byte {
	for i := 0; i < len(b) && i < 4; i++ {
		if b[i]&0xC0 != 0x80 {
			return b[i:]
		}
	}
	return b
}

// startErr keeps a command that could not start from reading as a missing
// sandbox: envd answers not_found for a missing cwd or binary.
func startErr(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() == connect.CodeNotFound {
		return errdefs.New(errdefs.ErrInvalidArgument, "could not start the command: "+ce.Message())
	}
	return err
}

// reporter sends a running command's progress notifications: new output
// as it comes (at most every progressTick), and a heartbeat through
// silences. Progress is the seconds the command has run, Total its timeout.
type reporter struct {
	ctx      context.Context
	session  *sdk.ServerSession
	token    any
	start    time.Time
	timeout  time.Duration
	mu       *sync.Mutex // guards out and the streams
	out      []byte      // output not reported yet, its last progressOutput bytes
	streams  [2]*clipped
	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}
}

func startReporter(ctx context.Context, ss *sdk.ServerSession, token any, timeout time.Duration, mu *sync.Mutex, stdout, stderr *clipped) *reporter {
	r := &reporter{ctx: ctx, session: ss, token: token, start: time.Now(), timeout: timeout, mu: mu,
		streams: [2]*clipped{stdout, stderr}, quit: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// pending adds output to the next notification; r.mu is held.
func (r *reporter) pending(stdout, stderr []byte) {
	r.out = append(append(r.out, stdout...), stderr...)
	if len(r.out) > 2*progressOutput {
		n := copy(r.out, r.out[len(r.out)-progressOutput:])
		r.out = r.out[:n]
	}
}

func (r *reporter) run() {
	defer close(r.done)
	t := time.NewTicker(progressTick)
	defer t.Stop()
	last := r.start
	for {
		select {
		case <-r.quit:
			return
		case <-r.ctx.Done():
			return
		case now := <-t.C:
			r.mu.Lock()
			out := r.out
			if len(out) > progressOutput {
				out = out[len(out)-progressOutput:]
			}
			msg := string(trimRuneStart(out))
			r.out = nil
			total := r.streams[0].total + r.streams[1].total
			r.mu.Unlock()
			if msg == "" {
				if now.Sub(last) < heartbeat {
					continue
				}
				msg = fmt.Sprintf("running for %s; %d bytes of output so far", now.Sub(r.start).Round(time.Second), total)
			}
			last = now
			err := r.session.NotifyProgress(r.ctx, &sdk.ProgressNotificationParams{
				ProgressToken: r.token,
				Progress:      now.Sub(r.start).Seconds(),
				Total:         r.timeout.Seconds(),
				Message:       msg,
			})
			if err != nil {
				return // the client is gone; the call ends with it
			}
		}
	}
}

// stop ends the reporter and waits for it, so that no notification
// follows the call's result.
func (r *reporter) stop() {
	r.stopOnce.Do(func() { close(r.quit) })
	<-r.done
}
