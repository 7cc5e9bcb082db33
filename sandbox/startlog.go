package sandbox

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// followers are the goroutines that copy templates' start command output
// into sandbox logs, at most one per sandbox. The Manager owns them: a
// sandbox's stops when it is paused or killed (a stream into a frozen
// sandbox would hang, not fail), or when its process or envd ends; Close
// stops them all and waits.
type followers struct {
	mu     sync.Mutex
	cancel map[string]*context.CancelFunc
	wg     sync.WaitGroup
	closed bool
}

// run starts fn as sandbox id's follower, ending the one it had; false
// once closed. fn returns when its ctx ends, if not before.
func (f *followers) run(id string, fn func(ctx context.Context)) bool {
	ctx, cancel := context.WithCancel(context.Background())
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		cancel()
		return false
	}
	if f.cancel == nil {
		f.cancel = map[string]*context.CancelFunc{}
	}
	if old := f.cancel[id]; old != nil {
		(*old)()
	}
	mine := &cancel
	f.cancel[id] = mine
	f.wg.Add(1)
	f.mu.Unlock()
	go func() { // exits when fn does: its stream ended or ctx was cancelled
		defer f.wg.Done()
		defer cancel()
		fn(ctx)
		f.mu.Lock()
		if f.cancel[id] == mine {
			delete(f.cancel, id)
		}
		f.mu.Unlock()
	}()
	return true
}

// stop ends sandbox id's follower, if any.
func (f *followers) stop(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.cancel[id]; c != nil {
		(*c)()
		delete(f.cancel, id)
	}
}

// close ends every follower and waits for them; none starts after.
func (f *followers) close() {
	f.mu.Lock()
	f.closed = true
	for id, c := range f.cancel {
		(*c)()
		delete(f.cancel, id)
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// Close stops the Manager's background work on sandboxes (the start
// command followers) and waits for it. Sandboxes run on.
func (m *Manager) Close() {
	m.follow.close()
	m.bg.Wait() // the destroys of failed claims
	m.envd.Close()
}

// startLines turns a start command's output into log entries of sandbox
// id: a line each, stdout at info and stderr at error.
type startLines struct {
	m        *Manager
	id       string
	out, err []byte // partial lines
}

func (s *startLines) write(stdout, stderr []byte) {
	s.out = s.split(append(s.out, stdout...), "stdout", LogInfo)
	s.err = s.split(append(s.err, stderr...), "stderr", LogError)
}

// split logs the complete lines of b and returns the rest; a line longer
// than maxLogLine is logged in pieces.
func (s *startLines) split(b []byte, stream string, level LogLevel) []byte {
	for {
		i := bytes.IndexByte(b, '\n')
		switch {
		case i >= 0 && i <= maxLogLine:
			s.line(b[:i], stream, level)
			b = b[i+1:]
		case len(b) > maxLogLine:
			s.line(b[:maxLogLine], stream, level)
			b = b[maxLogLine:]
		default:
			return b
		}
	}
}

func (s *startLines) flush() {
	if len(s.out) > 0 {
		s.line(s.out, "stdout", LogInfo)
	}
	if len(s.err) > 0 {
		s.line(s.err, "stderr", LogError)
	}
	s.out, s.err = nil, nil
}

func (s *startLines) line(b []byte, stream string, level LogLevel) {
	s.m.logs.add(s.id, LogEntry{
		At: s.m.now().UTC(), Level: level, Message: strings.TrimRight(string(b), "\r"),
		Fields: map[string]string{"source": "start-cmd", "stream": stream},
	})
}

// followStart copies o's output into sandbox id's log until the start
// command ends (its exit is logged) or ctx does.
func (m *Manager) followStart(ctx context.Context, id string, c *envdconn.Client, o *envdconn.Output) {
	defer c.Close()
	defer o.Close()
	stop := context.AfterFunc(ctx, o.Close)
	defer stop()
	lines := &startLines{m: m, id: id}
	x, err := o.Follow(lines.write)
	lines.flush()
	if err != nil {
		return // the sandbox stopped or went, or sandboxd is closing
	}
	level := LogInfo
	if x.ExitCode != 0 {
		level = LogWarn
	}
	m.logs.add(id, LogEntry{At: m.now().UTC(), Level: level, Message: "start command ended: " + x.Status,
		Fields: map[string]string{"source": "sandboxd", "action": "start_cmd_end"}})
}

// attachStart follows sandbox id's start command again (after a resume, or
// a restart of sandboxd), if its template has one and it still runs.
func (m *Manager) attachStart(id, template, token string) {
	if cfg, ok := m.templateConfig(template); !ok || cfg.StartCmd == "" {
		return
	}
	m.follow.run(id, func(ctx context.Context) {
		c := m.envdClient(id, token)
		o, err := c.Attach(ctx, StartTag)
		if err != nil {
			c.Close()
			if connect.CodeOf(err) != connect.CodeNotFound && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				m.log.Warn("follow start command", "sandbox_id", id, "err", err)
			}
			return
		}
		m.followStart(ctx, id, c, o)
	})
}

// envdClient is a client of sandbox id's envd as root, with its own
// connections through the backend.
func (m *Manager) envdClient(id, token string) *envdconn.Client {
	return envdconn.NewClient(func(ctx context.Context) (net.Conn, error) {
		return m.backend.Dial(ctx, id, runtime.EnvdPort)
	}, token, "root")
}
