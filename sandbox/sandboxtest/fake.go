// Package sandboxtest has a minimal in-memory runtime.Backend for unit tests
// of the control plane's logic (lifecycle, quotas, pools, rate limits): its
// sandboxes are map entries, and Dial of the envd port reaches a tiny fake
// envd over net.Pipe that answers /health and records /init. No network,
// so it works inside testing/synctest bubbles.
package sandboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// Backend is the fake. The zero value is not usable; call New.
type Backend struct {
	// CreateDelay is how long Create takes (under synctest: fake time).
	CreateDelay time.Duration
	// FailCreate, when set, is returned by Create.
	FailCreate atomic.Pointer[error]
	// FailInit, when set, makes every envd answer /init with 500.
	FailInit atomic.Bool
	// NoInitProbe, when set, makes Create ignore Spec.EnvdInit, as a
	// backend whose readiness probe is GET /health: the control plane then
	// posts /init itself.
	NoInitProbe atomic.Bool
	// Resources, when set before use, are the templates' declared
	// resources (runtime.TemplateResourcer).
	Resources map[string]runtime.Resources
	// NoDiskPause, when set, makes Pause(PauseDisk) fail with
	// runtime.ErrUnsupported, as a backend that only pauses in memory.
	NoDiskPause atomic.Bool
	// RestartOnDiskPause, when set, makes Pause(PauseDisk) fail with
	// runtime.ErrRestarted, leaving the sandbox running.
	RestartOnDiskPause atomic.Bool
	// FailMemoryPause, when set, makes Pause(PauseMemory) fail, changing
	// nothing.
	FailMemoryPause atomic.Bool

	Creates, Destroys atomic.Int64

	mu    sync.Mutex
	sbx   map[string]*runtime.Sandbox
	disk  map[string]bool // paused to disk: Resume restarts it
	inits map[string][]map[string]any
	// unhealthy ids answer /health with 503.
	unhealthy map[string]bool
	// exited ids' init is gone: Alive and Dial fail.
	exited map[string]bool

	srv *http.Server
	ln  *pipeListener
}

var (
	_ runtime.Backend         = (*Backend)(nil)
	_ runtime.LivenessChecker = (*Backend)(nil)
)

// New returns a fake backend; Close stops its fake envd.
func New() *Backend {
	b := &Backend{sbx: map[string]*runtime.Sandbox{}, disk: map[string]bool{}, inits: map[string][]map[string]any{}, unhealthy: map[string]bool{}, exited: map[string]bool{}}
	b.ln = &pipeListener{ch: make(chan net.Conn), done: make(chan struct{})}
	b.srv = &http.Server{
		Handler: http.HandlerFunc(b.envd),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, idKey{}, c.(*idConn).id)
		},
	}
	go func() { _ = b.srv.Serve(b.ln) }() // exits on Close
	return b
}

// Close stops the fake envd.
func (b *Backend) Close() { _ = b.srv.Close() }

type idKey struct{}

type idConn struct {
	net.Conn
	id string
}

type pipeListener struct {
	ch        chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "fake-envd", Net: "unix"} }

func (b *Backend) envd(w http.ResponseWriter, r *http.Request) {
	id, _ := r.Context().Value(idKey{}).(string)
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/health":
		b.mu.Lock()
		bad := b.unhealthy[id]
		b.mu.Unlock()
		if bad {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && r.URL.Path == "/init":
		raw, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		status, msg := b.init(id, raw)
		b.mu.Unlock()
		if status != http.StatusNoContent {
			http.Error(w, string(msg), status)
			return
		}
		w.WriteHeader(status)
	default:
		http.NotFound(w, r)
	}
}

// init is the fake envd's /init of sandbox id: it records body, or
// refuses it (FailInit, or not JSON). Called with mu held.
func (b *Backend) init(id string, raw []byte) (status int, msg []byte) {
	if b.FailInit.Load() {
		return http.StatusInternalServerError, []byte("init refused")
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		return http.StatusBadRequest, []byte(err.Error())
	}
	b.inits[id] = append(b.inits[id], body)
	return http.StatusNoContent, nil
}

// Inits returns the /init bodies sandbox id received.
func (b *Backend) Inits(id string) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inits[id]
}

// SetUnhealthy makes id's envd answer /health with 503.
func (b *Backend) SetUnhealthy(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unhealthy[id] = true
}

// IDs returns the ids of live sandboxes.
func (b *Backend) IDs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []string
	for id := range b.sbx {
		ids = append(ids, id)
	}
	return ids
}

// Get returns a live sandbox, or nil.
func (b *Backend) Get(id string) *runtime.Sandbox {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sbx[id]
}

// Len is the number of live sandboxes.
func (b *Backend) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sbx)
}

func (b *Backend) Create(ctx context.Context, s runtime.Spec) (*runtime.Sandbox, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if p := b.FailCreate.Load(); p != nil && *p != nil {
		return nil, *p
	}
	if s.ForkOf != "" {
		// It holds no files to copy: a fork would be a fresh sandbox.
		return nil, fmt.Errorf("fork: %w", runtime.ErrUnsupported)
	}
	if b.CreateDelay > 0 {
		t := time.NewTimer(b.CreateDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.sbx[s.ID]; ok {
		return nil, fmt.Errorf("%s: %w", s.ID, runtime.ErrAlreadyExists)
	}
	// As the real backends do, the create's readiness probe is the /init
	// it is given: the fake envd records it, or refuses it (FailInit), and
	// then the create fails.
	if b.NoInitProbe.Load() {
		s.EnvdInit = nil
	}
	if s.EnvdInit != nil {
		status, msg := b.init(s.ID, s.EnvdInit)
		if err := envdconn.Answered("/init", status, msg); err != nil {
			return nil, fmt.Errorf("create %s: %w", s.ID, err)
		}
	}
	initialized := s.EnvdInit != nil
	s.EnvdInit = nil // not kept, as by the real backends
	sb := &runtime.Sandbox{ID: s.ID, Template: s.Template, State: runtime.StateRunning, Spec: s, CreatedAt: time.Now()}
	b.sbx[s.ID] = sb
	b.Creates.Add(1)
	cp := *sb
	cp.EnvdInitialized = initialized
	return &cp, nil
}

func (b *Backend) Destroy(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.sbx[id]; ok {
		delete(b.sbx, id)
		delete(b.disk, id)
		delete(b.exited, id)
		b.Destroys.Add(1)
	}
	return nil
}

func (b *Backend) setState(id string, st runtime.State) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb, ok := b.sbx[id]
	if !ok {
		return fmt.Errorf("%s: %w", id, runtime.ErrNotFound)
	}
	sb.State = st
	return nil
}

// TemplateResources returns Resources[template].
func (b *Backend) TemplateResources(template string) (runtime.Resources, bool) {
	r, ok := b.Resources[template]
	return r, ok
}

// Pause marks the sandbox paused; one paused to disk "restarts" on Resume.
func (b *Backend) Pause(_ context.Context, id string, kind runtime.PauseKind) error {
	if kind == runtime.PauseDisk && b.NoDiskPause.Load() {
		return fmt.Errorf("%s: %w", id, runtime.ErrUnsupported)
	}
	if kind == runtime.PauseDisk && b.RestartOnDiskPause.Load() {
		return fmt.Errorf("%s: %w", id, runtime.ErrRestarted)
	}
	if kind == runtime.PauseMemory && b.FailMemoryPause.Load() {
		return fmt.Errorf("fake backend: pause %s in memory refused", id)
	}
	if err := b.setState(id, runtime.StatePaused); err != nil {
		return err
	}
	if kind == runtime.PauseDisk {
		b.mu.Lock()
		b.disk[id] = true
		b.mu.Unlock()
	}
	return nil
}

// PausedToDisk reports whether id is paused to disk.
func (b *Backend) PausedToDisk(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.disk[id]
}

func (b *Backend) Resume(_ context.Context, id string) (bool, error) {
	if err := b.setState(id, runtime.StateRunning); err != nil {
		return false, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	restarted := b.disk[id]
	delete(b.disk, id)
	return restarted, nil
}

// Exit ends sandbox id's init, as a crash inside it would: Alive and Dial
// fail with runtime.ErrNotRunning until it is destroyed.
func (b *Backend) Exit(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.exited[id] = true
}

// Alive reports sandbox id's state as the backend holds it (Exit, Pause).
func (b *Backend) Alive(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.aliveLocked(id)
}

func (b *Backend) aliveLocked(id string) error {
	sb, ok := b.sbx[id]
	switch {
	case !ok:
		return fmt.Errorf("%s: %w", id, runtime.ErrNotFound)
	case b.exited[id]:
		return fmt.Errorf("%s: %w", id, runtime.ErrNotRunning)
	case sb.State == runtime.StatePaused:
		return fmt.Errorf("%s: %w", id, runtime.ErrPaused)
	}
	return nil
}

// Dial reaches the fake envd for runtime.EnvdPort; other ports are refused.
func (b *Backend) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	b.mu.Lock()
	err := b.aliveLocked(id)
	b.mu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case port != runtime.EnvdPort:
		return nil, errors.New("fake backend: only the envd port")
	}
	client, server := net.Pipe()
	select {
	case b.ln.ch <- &idConn{Conn: server, id: id}:
		return client, nil
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	case <-b.ln.done:
		return nil, net.ErrClosed
	}
}

func (b *Backend) Stats(_ context.Context, id string) (runtime.Stats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sb, ok := b.sbx[id]
	if !ok {
		return runtime.Stats{}, fmt.Errorf("%s: %w", id, runtime.ErrNotFound)
	}
	return runtime.Stats{CPUCount: sb.Spec.CPUCount, MemoryLimitBytes: uint64(sb.Spec.MemoryMB) << 20}, nil
}

func (b *Backend) List(context.Context) ([]*runtime.Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*runtime.Sandbox, 0, len(b.sbx))
	for id, sb := range b.sbx {
		cp := *sb
		cp.OnDisk = b.disk[id]
		out = append(out, &cp)
	}
	return out, nil
}
