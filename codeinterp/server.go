package codeinterp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Config configures a Server.
type Config struct {
	// Jupyter is the Jupyter Server's URL (http://127.0.0.1:8888).
	Jupyter string
	// RuntimeDir is the Jupyter Server's runtime directory, where the
	// kernels' connection files are (JUPYTER_RUNTIME_DIR).
	RuntimeDir string
	// Envd is envd's URL inside the sandbox, for the sandbox's env vars
	// (GET /envs).
	Envd string
	// Cwd is where contexts run when a request names no directory.
	Cwd string
	Log *slog.Logger
}

// DefaultCwd is E2B's default working directory of a context.
const DefaultCwd = "/home/user"

// keepaliveEvery is how often an execution without output says it is
// still running, so that proxies keep the stream open.
const keepaliveEvery = 5 * time.Second

// Server is the HTTP surface on port 49999.
type Server struct {
	cfg Config
	j   *Jupyter
	log *slog.Logger
	hc  *http.Client

	ready atomic.Bool
	// langs are the languages whose kernels are installed.
	langs map[string]bool

	mu       sync.Mutex
	contexts map[string]*execContext
	defaults map[string]*execContext // by language; not listed
	creating map[string]chan struct{}
}

// New returns a Server; Start it before it reports healthy.
func New(cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Cwd == "" {
		cfg.Cwd = DefaultCwd
	}
	j, err := NewJupyter(cfg.Jupyter, cfg.RuntimeDir)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, j: j, log: cfg.Log, hc: &http.Client{Timeout: 10 * time.Second},
		contexts: map[string]*execContext{}, defaults: map[string]*execContext{}, creating: map[string]chan struct{}{}}, nil
}

// Start waits for Jupyter, learns its kernels and starts the default
// Python context, so that the first execution finds a running kernel;
// /health says OK from then on.
func (s *Server) Start(ctx context.Context) error {
	if err := s.j.Wait(ctx); err != nil {
		return err
	}
	specs, err := s.j.KernelSpecs(ctx)
	if err != nil {
		return err
	}
	langs := map[string]bool{}
	for l, k := range kernels {
		if slices.Contains(specs, k) {
			langs[l] = true
		}
	}
	s.mu.Lock()
	s.langs = langs
	s.mu.Unlock()
	if _, err := s.defaultContext(ctx, "python"); err != nil {
		return fmt.Errorf("default python context: %w", err)
	}
	s.ready.Store(true)
	s.log.Info("code interpreter ready", "languages", slices.Sorted(maps.Keys(langs)))
	return nil
}

// Handler serves E2B's code-interpreter API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("POST /execute", s.execute)
	mux.HandleFunc("POST /contexts", s.createContext)
	mux.HandleFunc("GET /contexts", s.listContexts)
	mux.HandleFunc("DELETE /contexts/{id}", s.deleteContext)
	mux.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	return mux
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	if !s.ready.Load() {
		http.Error(w, "starting", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `"OK"`)
}

func (s *Server) supported(lang string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.langs[lang]
}

// newContext starts a session for language in cwd.
func (s *Server) newContext(ctx context.Context, language, cwd string) (*execContext, error) {
	if !s.supported(language) {
		return nil, fmt.Errorf("%w: %q", errUnknownLanguage, language)
	}
	id := uuid.NewString()
	sess, err := s.j.createSession(ctx, sessionPath(cwd, id), id, kernels[language])
	if err != nil {
		return nil, err
	}
	c := &execContext{ID: id, Language: language, Cwd: cwd, j: s.j, log: s.log,
		session: sess.ID, kernel: sess.Kernel.ID, lock: make(chan struct{}, 1)}
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	err = c.ready(ctx)
	c.release()
	if err != nil {
		_ = c.shutdown(context.WithoutCancel(ctx))
		return nil, err
	}
	return c, nil
}

// defaultContext is the context of a request that names none, one per
// language, started on first use.
func (s *Server) defaultContext(ctx context.Context, language string) (*execContext, error) {
	for {
		s.mu.Lock()
		if c := s.defaults[language]; c != nil {
			s.mu.Unlock()
			return c, nil
		}
		wait, busy := s.creating[language]
		if !busy {
			wait = make(chan struct{})
			s.creating[language] = wait
		}
		s.mu.Unlock()
		if busy {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		c, err := s.newContext(ctx, language, s.cfg.Cwd)
		s.mu.Lock()
		if err == nil {
			s.defaults[language] = c
		}
		delete(s.creating, language)
		close(wait)
		s.mu.Unlock()
		return c, err
	}
}

type executeRequest struct {
	Code      *string           `json:"code"`
	ContextID *string           `json:"context_id"`
	Language  *string           `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil {
		http.Error(w, "invalid JSON body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.Code == nil {
		http.Error(w, "code is required", http.StatusBadRequest)
		return
	}
	if req.ContextID != nil && req.Language != nil {
		http.Error(w, "Only one of context_id or language can be provided", http.StatusBadRequest)
		return
	}
	for k := range req.EnvVars {
		if !envKeyRE.MatchString(k) {
			http.Error(w, fmt.Sprintf("env var name %q: letters, digits and '_', not starting with a digit", k), http.StatusBadRequest)
			return
		}
	}
	var (
		c   *execContext
		err error
	)
	switch {
	case req.ContextID != nil:
		s.mu.Lock()
		c = s.contexts[*req.ContextID]
		s.mu.Unlock()
		if c == nil {
			http.Error(w, fmt.Sprintf("Context %s not found", *req.ContextID), http.StatusNotFound)
			return
		}
	default:
		lang := "python"
		if req.Language != nil {
			lang = normLanguage(*req.Language)
		}
		if !s.supported(lang) {
			http.Error(w, fmt.Sprintf("Unsupported language: %s", lang), http.StatusBadRequest)
			return
		}
		if c, err = s.defaultContext(r.Context(), lang); err != nil {
			s.fail(w, "start the default context", err)
			return
		}
	}
	base := s.sandboxEnv(r.Context(), r.Header.Get("X-Access-Token"))

	// The stream starts with the first line; an error before it is an
	// HTTP status.
	out := &ndjson{w: w}
	// The response is the handler's only until it returns: the keepalive
	// goroutine may be about to write then.
	defer out.close()
	var lines atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(keepaliveEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if lines.Load() > 0 && out.idleFor() >= keepaliveEvery {
					_ = out.write(Line{"type": typeKeepalive})
				}
			}
		}
	}()
	err = c.Execute(r.Context(), *req.Code, base, req.EnvVars, func(l Line) error {
		lines.Add(1)
		return out.write(l)
	})
	if err != nil && lines.Load() == 0 && r.Context().Err() == nil {
		s.fail(w, "execute", err)
		return
	}
	if r.Context().Err() == nil {
		_ = out.write(Line{"type": typeEnd})
	}
}

func (s *Server) fail(w http.ResponseWriter, what string, err error) {
	if errors.Is(err, errUnknownLanguage) {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.log.Error(what, "err", err)
	http.Error(w, what+": "+err.Error(), http.StatusInternalServerError)
}

// ndjson writes lines, flushing each, one writer at a time, until closed.
type ndjson struct {
	mu     sync.Mutex
	w      http.ResponseWriter
	bw     *bufio.Writer
	last   time.Time
	closed bool
}

var errClosed = errors.New("response closed")

func (o *ndjson) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
}

func (o *ndjson) write(l Line) error {
	raw, err := json.Marshal(l)
	if err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return errClosed
	}
	if o.bw == nil {
		o.w.Header().Set("Content-Type", "application/x-ndjson")
		o.w.WriteHeader(http.StatusOK)
		o.bw = bufio.NewWriterSize(o.w, 32<<10)
	}
	o.last = time.Now()
	raw = append(raw, '\n')
	if _, err := o.bw.Write(raw); err != nil {
		return err
	}
	if err := o.bw.Flush(); err != nil {
		return err
	}
	return http.NewResponseController(o.w).Flush()
}

func (o *ndjson) idleFor() time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return time.Since(o.last)
}

// sandboxEnv reads the sandbox's env vars from envd, with the access
// token the SDK sent (envd refuses without one when the sandbox is
// secure). nil when envd does not answer: the code still runs, with the
// vars the kernel has.
func (s *Server) sandboxEnv(ctx context.Context, token string) map[string]string {
	if s.cfg.Envd == "" {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.Envd+"/envs", nil)
	if err != nil {
		return nil
	}
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		s.log.Warn("envd /envs", "err", err)
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.log.Warn("envd /envs", "status", resp.Status)
		return nil
	}
	env := map[string]string{}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&env); err != nil {
		s.log.Warn("envd /envs", "err", err)
		return nil
	}
	for k := range env {
		if !envKeyRE.MatchString(k) {
			delete(env, k)
		}
	}
	return env
}

type createContextRequest struct {
	Language *string `json:"language"`
	Cwd      *string `json:"cwd"`
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	var req createContextRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		http.Error(w, "invalid JSON body: "+err.Error(), http.StatusBadRequest)
		return
	}
	lang, cwd := "python", s.cfg.Cwd
	if req.Language != nil && *req.Language != "" {
		lang = normLanguage(*req.Language)
	}
	if req.Cwd != nil && *req.Cwd != "" {
		cwd = *req.Cwd
	}
	if len(cwd) == 0 || cwd[0] != '/' {
		http.Error(w, "cwd must be an absolute path", http.StatusBadRequest)
		return
	}
	c, err := s.newContext(r.Context(), lang, cwd)
	if err != nil {
		s.fail(w, "create the context", err)
		return
	}
	s.mu.Lock()
	s.contexts[c.ID] = c
	s.mu.Unlock()
	writeJSON(w, c)
}

func (s *Server) listContexts(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	list := make([]*execContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		list = append(list, c)
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b *execContext) int { return strings.Compare(a.ID, b.ID) })
	writeJSON(w, list)
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) *execContext {
	id := r.PathValue("id")
	s.mu.Lock()
	c := s.contexts[id]
	s.mu.Unlock()
	if c == nil {
		http.Error(w, fmt.Sprintf("Context %s not found", id), http.StatusNotFound)
	}
	return c
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) {
	c := s.lookup(w, r)
	if c == nil {
		return
	}
	s.mu.Lock()
	delete(s.contexts, c.ID)
	s.mu.Unlock()
	if err := c.shutdown(r.Context()); err != nil {
		s.log.Warn("delete context", "context", c.ID, "err", err)
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	c := s.lookup(w, r)
	if c == nil {
		return
	}
	if err := c.restart(r.Context()); err != nil {
		s.fail(w, "restart the context", err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
