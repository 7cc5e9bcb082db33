// Package envd is the agent that runs inside every sandbox. It speaks E2B's
// envd protocol (Connect RPC process.Process and filesystem.Filesystem in JSON,
// plus /files, /health, /init, /envs and /metrics) and tunnels TCP to ports on
// the sandbox's loopback for sandboxd's proxy.
//
// This package assembles the server, for cmd/envd and for tests that run a
// real envd in-process; its parts are in envd/internal. The protocol itself,
// the one part the control plane imports, is envd/api (package envdapi).
package envd

import (
	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/envd/api/process/processconnect"
	"github.com/sandboxd/sandboxd/envd/internal/auth"
	cgtree "github.com/sandboxd/sandboxd/envd/internal/cgroup"
	"github.com/sandboxd/sandboxd/envd/internal/execctx"
	"github.com/sandboxd/sandboxd/envd/internal/files"
	"github.com/sandboxd/sandboxd/envd/internal/filesystem"
	"github.com/sandboxd/sandboxd/envd/internal/logring"
	"github.com/sandboxd/sandboxd/envd/internal/process"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
	"github.com/sandboxd/sandboxd/envd/internal/tunnel"
)

// maxMessageBytes bounds one Connect request message, so a hostile client
// cannot make envd buffer an arbitrarily large frame.
const maxMessageBytes = 32 << 20

// Config configures a Server.
type Config struct {
	Log         *slog.Logger
	DefaultUser string // used when a request names no user and /init set none
	Workdir     string // default working directory; empty = the user's home
	// DiskPath is the filesystem whose usage /metrics reports.
	DiskPath string
	// AfterFirstAnswer, when set, runs on a goroutine of its own once the
	// first request has been answered: start-up work that should not take
	// CPU from that request.
	AfterFirstAnswer func()
	// CgroupRoot, when set, is the sandbox's delegated cgroup2 tree:
	// after the first answer envd moves into a leaf of it and starts each
	// command in a cgroup of its own, PidsReserve pids below the sandbox's
	// limit (package cgroup). Without a usable tree, nothing changes.
	CgroupRoot  string
	PidsReserve int
}

// Server holds envd's state: execution defaults, the access token and the
// RPC services.
type Server struct {
	log        *slog.Logger
	defaults   *execctx.Defaults
	token      auth.Token
	process    *process.Service
	filesystem *filesystem.Service
	tunnel     *tunnel.Handler
	diskPath   string
	cpu        cpuSampler
	handler    http.Handler
	logs       *logring.Ring // envd's recent records, for GET /logs
	warm       func()        // see afterFirstAnswer
	warmOnce   sync.Once
	warmTimer  *time.Timer
}

// New builds a Server; Close releases its processes and watchers.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.DiskPath == "" {
		cfg.DiskPath = "/"
	}
	// Whatever Log writes, its records at info and above also go to the
	// ring the control plane reads into the sandbox's log.
	ring := logring.New(logring.DefaultRecords, logring.DefaultBytes)
	cfg.Log = slog.New(logring.Tee(cfg.Log.Handler(), ring))
	s := &Server{
		logs:     ring,
		log:      cfg.Log,
		defaults: execctx.New(cfg.DefaultUser),
		diskPath: cfg.DiskPath,
	}
	s.defaults.SetWorkdir(cfg.Workdir)
	s.process = process.New(cfg.Log.With("service", "process"), s.defaults)
	if cfg.CgroupRoot != "" {
		s.useCgroups(cfg.CgroupRoot, cfg.PidsReserve)
	}
	s.filesystem = filesystem.New(cfg.Log.With("service", "filesystem"), s.defaults)

	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxMessageBytes)}
	mux := http.NewServeMux()
	// The paths are the ones the services' Handler returns (the generated
	// New*Handler's), known here before the handlers are built.
	processH := &lazyHandler{newHandler: func() http.Handler { _, h := s.process.Handler(opts...); return h }}
	filesystemH := &lazyHandler{newHandler: func() http.Handler { _, h := s.filesystem.Handler(opts...); return h }}
	s.warm = func() {
		processH.build()
		filesystemH.build()
		s.process.Cgroups()
		if cfg.AfterFirstAnswer != nil {
			cfg.AfterFirstAnswer()
		}
	}
	mux.Handle("/"+processconnect.ProcessName+"/", processH)
	mux.Handle("/"+filesystemconnect.FilesystemName+"/", filesystemH)
	mux.Handle("/files", files.New(cfg.Log.With("service", "files"), s.defaults, &s.token))
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("POST /init", s.init)
	mux.HandleFunc("GET /envs", s.envs)
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("GET "+envdapi.LogsPath, s.serveLogs)
	s.tunnel = tunnel.New(cfg.Log.With("service", "tunnel"))
	s.handler = s.afterFirstAnswer(withCORS(s.withAuth(routeConnect(s.tunnel, mux))))
	s.warmTimer = time.AfterFunc(warmBackstop, s.warmNow)
	return s
}

// useCgroups has the tree at root organised on its first use: after the
// first answer (warm), or by a command started before that.
func (s *Server) useCgroups(root string, reserve int) {
	s.process.UseCgroups(sync.OnceValue(func() *cgtree.Tree {
		t, err := cgtree.Open(root, reserve)
		if err != nil {
			s.log.Info("commands share envd's cgroup", "reason", err.Error())
			return nil
		}
		s.log.Info("commands get cgroups of their own", "root", root, "pids_reserve", reserve)
		return t
	}))
}

// Handler serves envd's whole HTTP surface.
func (s *Server) Handler() http.Handler { return s.handler }

// Close kills envd's processes, stops its watchers and closes open tunnels
// (http.Server.Shutdown does not see hijacked connections).
func (s *Server) Close() {
	s.warmTimer.Stop()
	s.tunnel.Close()
	s.process.Close()
	s.filesystem.Close()
}

// lazyHandler is a handler built on first use, or by build, whichever
// comes first. Building a Connect service's handlers resolves its protobuf
// descriptors: 0.4 ms for both at envd's start, which must not delay the
// first request (sandboxd's readiness probe, at every create).
type lazyHandler struct {
	once       sync.Once
	newHandler func() http.Handler
	h          http.Handler
}

func (l *lazyHandler) build() { l.once.Do(func() { l.h = l.newHandler() }) }

func (l *lazyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.build()
	l.h.ServeHTTP(w, r)
}

// afterFirstAnswer runs s's start-up work that no first request needs (the
// Connect handlers' build, Config.AfterFirstAnswer) once the first request
// has been answered. Until then it would share envd's two CPUs with it, and
// the first request is sandboxd's readiness probe: every create waits for it.
func (s *Server) afterFirstAnswer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		s.warmNow()
	})
}

// warmBackstop is when the deferred start-up work starts without a first
// answer: the first request may be a stream that lasts (a client that does
// not post /init first), and PID 1's spare threads must not wait for it.
const warmBackstop = 500 * time.Millisecond

// warmNow starts the deferred start-up work, once.
func (s *Server) warmNow() { s.warmOnce.Do(func() { go s.warm() }) }

// routeConnect sends HTTP CONNECT to the tunnel: ServeMux cannot route it,
// because a CONNECT request has an authority, not a path.
func routeConnect(tun, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			tun.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withAuth enforces the access token once /init has set one. /health stays
// open for liveness probes; /files checks the token or a URL signature itself;
// /init checks it itself, because the first /init is what sets it.
func (s *Server) withAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		exempt := (r.Method == http.MethodGet && r.URL.Path == "/health") ||
			r.URL.Path == "/files" || (r.Method == http.MethodPost && r.URL.Path == "/init")
		if !exempt && s.token.IsSet() && !s.token.Equal(r.Header.Get(envdapi.AccessTokenHeader)) {
			s.log.Warn("request without a valid access token", "method", r.Method, "path", r.URL.Path)
			rpcerr.WriteJSON(w, http.StatusUnauthorized,
				"unauthorized access, please provide a valid access token or method signing if supported")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withCORS lets browser SDKs call envd: any origin, any request header, and
// the Connect headers exposed.
func withCORS(next http.Handler) http.Handler {
	const methods = "HEAD, GET, POST, PUT, PATCH, DELETE"
	const exposed = "Connect-Protocol-Version, Grpc-Status, Grpc-Message, Content-Encoding, Content-Disposition, Content-Length"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if r.Header.Get("Origin") != "" {
			h.Set("Access-Control-Allow-Origin", "*")
			h.Set("Access-Control-Expose-Headers", exposed)
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", methods)
			if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
				h.Set("Access-Control-Allow-Headers", req)
			} else {
				h.Set("Access-Control-Allow-Headers", "*")
			}
			h.Set("Access-Control-Max-Age", "7200")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) envs(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.defaults.Envs())
}
