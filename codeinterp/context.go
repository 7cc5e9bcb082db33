package codeinterp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Languages and the kernels that run them. A language whose kernel is not
// installed is refused with 400. Deno runs both JavaScript and TypeScript
// (E2B's own template runs both on one kernel too).
var kernels = map[string]string{
	"python":     "python3",
	"bash":       "bash",
	"javascript": "deno",
	"typescript": "deno",
	"r":          "ir",
	"java":       "java",
}

// lateOutput are the kernels that may publish an execution's output after
// its idle status: Deno sends the result from its JavaScript thread and
// console output through a queue, both apart from the status it sends
// (a few percent of `1+1` lost their result so).
var lateOutput = map[string]bool{"deno": true}

// normLanguage spells a language as E2B's server does.
func normLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}

// firstReplyWait bounds the wait for a kernel's first message about a
// request (it says busy at once when it runs): past it, the link to the
// kernel is taken for broken rather than leave the client hanging.
const firstReplyWait = 30 * time.Second

// idleWait bounds the wait for an execution's idle status once its
// execute_reply came: the kernel publishes idle right after the reply, so
// a longer silence means iopub lost it, and the execution ends rather than
// hang its client.
var idleWait = 5 * time.Second

// drainWait bounds how long an execution whose client went away may take
// to stop after the interrupt; past it, its kernel is restarted.
const drainWait = 10 * time.Second

// execContext is one E2B context: a Jupyter session with its kernel, and
// the env vars applied to it. Executions in a context run one at a time.
type execContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	j       *Jupyter
	log     *slog.Logger
	session string
	kernel  string
	lock    chan struct{} // held by the running execution

	conn *kernelConn
	// env is what this kernel's environment has of the sandbox's and
	// the calls' env vars.
	env map[string]string
	// broken: the kernel died, or an interrupted execution did not
	// stop; the next call restarts it.
	broken bool
	// unsure: an execution ended without the kernel's idle status; the
	// next call makes sure iopub reaches the connection first.
	unsure bool
}

func (c *execContext) acquire(ctx context.Context) error {
	select {
	case c.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *execContext) release() { <-c.lock }

// ready makes sure the kernel is up and connected; the lock is held.
// Jupyter does not restart kernels on its own here (the template's
// jupyter_server_config.py): a kernel whose connections closed died, and
// is restarted now, before this call runs on it.
func (c *execContext) ready(ctx context.Context) error {
	if c.conn != nil && !c.conn.alive() {
		c.broken = true
	}
	if c.broken {
		if c.conn != nil {
			c.conn.close()
			c.conn = nil
		}
		if err := c.j.restartKernel(ctx, c.kernel); err != nil {
			return fmt.Errorf("restart the kernel: %w", err)
		}
		c.env, c.broken = nil, false
	}
	fresh := c.conn == nil || c.unsure
	if !fresh {
		return nil
	}
	nctx, cancel := context.WithTimeout(ctx, firstReplyWait)
	defer cancel()
	if c.conn == nil {
		conn, err := c.j.connect(nctx, c.kernel, c.log.With("context", c.ID))
		if err != nil {
			return err
		}
		c.conn, c.env = conn, nil
	}
	if err := c.conn.nudge(nctx); err != nil {
		c.broken = true
		return fmt.Errorf("kernel %s: %w", c.kernel, err)
	}
	c.unsure = false
	return nil
}

// restart restarts the kernel: its state is gone.
func (c *execContext) restart(ctx context.Context) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	// The connections end with the old kernel: the next call connects
	// to the new one.
	if c.conn != nil {
		c.conn.close()
		c.conn = nil
	}
	if err := c.j.restartKernel(ctx, c.kernel); err != nil {
		c.broken = true
		return err
	}
	c.env, c.broken = nil, false
	return nil
}

func (c *execContext) shutdown(ctx context.Context) error {
	if c.conn != nil {
		c.conn.close()
	}
	return c.j.deleteSession(ctx, c.session)
}

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// envCode is the code that sets env vars in a kernel of language and
// unsets others; "" when the language has no way or nothing changes.
func envCode(language string, set map[string]string, unset []string) string {
	if len(set) == 0 && len(unset) == 0 {
		return ""
	}
	keys := slices.Sorted(maps.Keys(set))
	switch language {
	case "python":
		// A JSON object of strings is a Python dict literal.
		obj, _ := json.Marshal(set)
		rm, _ := json.Marshal(unset)
		return fmt.Sprintf("import os as _sbx_os\n_sbx_os.environ.update(%s)\n[_sbx_os.environ.pop(_k, None) for _k in %s]\ndel _sbx_os", obj, rm)
	case "bash":
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "export %s='%s'\n", k, strings.ReplaceAll(set[k], "'", `'\''`))
		}
		for _, k := range unset {
			fmt.Fprintf(&b, "unset %s\n", k)
		}
		return b.String()
	case "javascript", "typescript":
		obj, _ := json.Marshal(set)
		rm, _ := json.Marshal(unset)
		return fmt.Sprintf("Object.assign(process.env, %s); for (const k of %s) delete process.env[k];", obj, rm)
	}
	return ""
}

// envDiff is what turns have into want.
func envDiff(have, want map[string]string) (set map[string]string, unset []string) {
	set = map[string]string{}
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			set[k] = v
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			unset = append(unset, k)
		}
	}
	slices.Sort(unset)
	if unset == nil {
		unset = []string{} // a JSON list, not null, in the kernel's code
	}
	return set, unset
}

// setEnv brings the kernel's env vars to want; the lock is held.
func (c *execContext) setEnv(ctx context.Context, want map[string]string) error {
	set, unset := envDiff(c.env, want)
	code := envCode(c.Language, set, unset)
	if code == "" {
		return nil
	}
	var failed Line
	if err := c.run(ctx, code, true, func(l Line) error {
		if l["type"] == typeError {
			failed = l
		}
		return nil
	}); err != nil {
		return err
	}
	if failed != nil {
		return fmt.Errorf("set env vars: %v: %v", failed["name"], failed["value"])
	}
	c.env = maps.Clone(want)
	// The names only: values may be secrets. One line per change (a
	// context's first call, a call's own vars and their undoing) says in
	// the sandbox's log what each kernel was given.
	c.log.Info("env vars set in the kernel", "context", c.ID, "language", c.Language,
		"set", slices.Sorted(maps.Keys(set)), "unset", unset)
	return nil
}

// Execute runs code with the sandbox's env vars (base; nil when unknown)
// and the call's (call, which win) set, streaming its output to emit. The call's own
// vars are undone afterwards. An error before any output is the caller's
// to answer with; after that, failures are error lines.
func (c *execContext) Execute(ctx context.Context, code string, base, call map[string]string, emit func(Line) error) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	if err := c.ready(ctx); err != nil {
		return err
	}
	if base == nil {
		// The sandbox's vars are unknown this time (envd did not
		// answer): keep what the kernel has.
		base = maps.Clone(c.env)
	}
	want := maps.Clone(base)
	if want == nil {
		want = map[string]string{}
	}
	maps.Copy(want, call)
	if err := c.setEnv(ctx, want); err != nil {
		c.log.Warn("env vars", "context", c.ID, "err", err)
	}
	err := c.run(ctx, code, false, emit)
	if len(call) > 0 && !c.broken && c.conn != nil && c.conn.alive() {
		// Undo the call's vars even when its client left.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainWait)
		if uerr := c.setEnv(uctx, base); uerr != nil {
			c.log.Warn("env vars: undo", "context", c.ID, "err", uerr)
			c.broken = true
		}
		cancel()
	}
	return err
}

// run executes code and maps the kernel's replies to emit until the
// kernel is idle again. When ctx ends first (the client left or timed
// out) the kernel is interrupted and the rest is drained unseen.
func (c *execContext) run(ctx context.Context, code string, silent bool, emit func(Line) error) error {
	id, ch, done, err := c.conn.execute(code, silent)
	if err != nil {
		c.broken = true
		return err
	}
	defer done()
	e := &execution{msgID: id}
	interrupted := false
	var drain <-chan time.Time
	cancelled := ctx.Done()
	first := time.NewTimer(firstReplyWait)
	defer first.Stop()
	// Armed by the execute_reply, rearmed by every later message: output
	// queued ahead of the idle status may still be draining.
	idle := time.NewTimer(idleWait)
	idle.Stop()
	defer idle.Stop()
	replied := false
	for !e.done {
		var lines []Line
		select {
		case <-first.C:
			lines = e.kernelGone("the kernel did not answer")
			c.broken = true
		case <-idle.C:
			if len(ch) > 0 {
				// Messages wait while a slow client takes the last
				// ones: the silence is the client's, not the kernel's.
				idle.Reset(idleWait)
				continue
			}
			c.log.Warn("no idle status after the execute_reply: iopub lost it", "context", c.ID)
			c.unsure = true
			e.done = true
		case m := <-ch:
			first.Stop()
			replied = replied || m.Header.MsgType == "execute_reply"
			if replied {
				idle.Reset(idleWait)
			}
			lines = e.handle(m)
		case <-c.conn.closed:
			// Its connections end with the kernel's process.
			lines = e.kernelGone("the kernel died; the context has a new kernel for the next execution")
			c.broken = true
		case <-cancelled:
			cancelled = nil
			if !interrupted {
				interrupted = true
				ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				if err := c.j.interruptKernel(ictx, c.kernel); err != nil {
					c.log.Warn("interrupt", "context", c.ID, "err", err)
				}
				cancel()
				drain = time.After(drainWait)
			}
		case <-drain:
			c.broken = true
			return fmt.Errorf("execution did not stop after an interrupt: %w", ctx.Err())
		}
		if interrupted {
			continue
		}
		for _, l := range lines {
			if err := emit(l); err != nil && cancelled != nil {
				// The client is gone: stop the code like a cancel.
				cancelled = closedChan
			}
		}
	}
	if interrupted {
		return ctx.Err()
	}
	if !silent && lateOutput[kernels[c.Language]] && !c.broken && !c.unsure {
		c.settle(ctx, ch, e, emit)
	}
	return nil
}

// settle passes on what a kernel publishes for an execution after its
// idle status. Deno publishes an execution's result from JavaScript, apart
// from the status and the reply it sends itself, and a publication that
// does not go out at once waits in its event loop, which runs only while
// it evaluates code: until the next execution, whose request Deno then
// tags it with. So the fence is an execution of its own (empty, silent: no
// result, no count): what Deno had pending goes out while it runs, tagged
// with the fence or with the execution. Under load one went out after the
// fence's idle status and reply (a TypeScript result lost in CI), so a
// second fence follows the first: what the first let go after its answers
// comes on the same iopub connection before the second's idle status.
// A kernel_info_request was the fence before, which Deno answers without
// running its event loop: now and then a JavaScript result was lost so,
// under load (its execute_result became the next execution's).
func (c *execContext) settle(ctx context.Context, ch <-chan message, e *execution, emit func(Line) error) {
	pass := func(m message) {
		for _, l := range e.handle(m) {
			_ = emit(l) // a client that left is the caller's to notice
		}
	}
	var before <-chan message
	for range 2 {
		_, fence, done, err := c.conn.execute("", true)
		if err != nil {
			return
		}
		defer done()
		if !c.awaitFence(ctx, ch, before, fence, pass) {
			return
		}
		before = fence
	}
	// The connection reads in order: what came for the execution before
	// the answers is queued already.
	for {
		select {
		case m := <-ch:
			pass(m)
		default:
			return
		}
	}
}

// awaitFence passes on the execution's messages (ch) and the output that
// comes tagged with the fence or the one before it (nil: none; the empty
// code has no output of its own) until the fence's reply and idle status;
// false if the kernel did not answer or went away.
func (c *execContext) awaitFence(ctx context.Context, ch, before, fence <-chan message, pass func(message)) bool {
	t := time.NewTimer(idleWait)
	defer t.Stop()
	for shell, iopub := false, false; !shell || !iopub; {
		select {
		case m := <-ch:
			pass(m)
		case m := <-before:
			if fenceOutput(m) {
				pass(m)
			}
		case m := <-fence:
			switch {
			case fenceOutput(m):
				pass(m)
			case m.Channel == "iopub" && m.Header.MsgType == "status":
				var st statusContent
				_ = json.Unmarshal(m.Content, &st)
				iopub = iopub || st.ExecutionState == "idle"
			case m.Header.MsgType == "execute_reply":
				shell = true
			}
		case <-t.C:
			c.log.Warn("no answer to the fence after an execution", "context", c.ID)
			return false
		case <-c.conn.closed:
			return false
		case <-ctx.Done():
			return false
		}
	}
	// The connection reads in order, and select chooses at random among
	// ready channels: what came tagged with a fence before the answers
	// may still wait in its channel.
	for _, f := range []<-chan message{before, fence} {
		for len(f) > 0 {
			if m := <-f; fenceOutput(m) {
				pass(m)
			}
		}
	}
	return true
}

// lateOutputTypes are the iopub messages of an execution's output that
// settle passes on when they come tagged with its fence.
var lateOutputTypes = map[string]bool{"stream": true, "execute_result": true, "display_data": true, "update_display_data": true}

// fenceOutput reports whether m, tagged with a fence, is output that settle
// passes on.
func fenceOutput(m message) bool { return m.Channel == "iopub" && lateOutputTypes[m.Header.MsgType] }

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// sessionPath is the session path whose directory is cwd, relative to the
// Jupyter Server's root (/).
func sessionPath(cwd, id string) string {
	return strings.TrimPrefix(path.Join(cwd, ".sandboxd-"+id+".ipynb"), "/")
}

var errUnknownLanguage = errors.New("unsupported language")
