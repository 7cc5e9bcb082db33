// Command envd is sandboxd's in-sandbox agent. See package envd.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/envd"
	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		listen      = flag.String("listen", "0.0.0.0:49983", "TCP address to serve on; empty to serve only on --socket")
		socket      = flag.String("socket", "", "unix socket path to serve on (sandboxd's control channel)")
		socketFD    = flag.Int("socket-fd", -1, "a listening unix socket handed over as this descriptor, to serve on instead of --socket (sandboxd binds it on the host)")
		initMode    = flag.Bool("init", false, "run as the sandbox's PID 1: reap orphaned zombies")
		defaultUser = flag.String("default-user", "user", "user for requests that name none (falls back to root if missing)")
		workdir     = flag.String("workdir", "", "default working directory (default: the user's home)")
		disk        = flag.String("disk", "/", "filesystem whose usage /metrics reports")
		logLevel    = flag.String("log-level", "info", "debug, info, warn or error")
		version     = flag.Bool("version", false, "print the envd protocol version and exit")
		cgroupRoot  = flag.String("cgroup", "auto", "the sandbox's delegated cgroup2 tree, where each command gets a cgroup of its own: auto (/sys/fs/cgroup with --init), off, or a path")
		pidsReserve = flag.Int("pids-reserve", 64, "pids no single command may take from the sandbox's limit (at most an eighth of it), kept for envd and other commands")
	)
	flag.Parse()
	if *version {
		fmt.Println(envdapi.Version)
		return 0
	}
	// First of all: a process envd starts must not inherit sandboxd's
	// socket, or it could accept sandboxd's connections.
	var inherited net.Listener
	if *socketFD >= 0 {
		l, err := inheritedUnix(*socketFD)
		if err != nil {
			fmt.Fprintf(os.Stderr, "envd: --socket-fd %d: %v\n", *socketFD, err)
			return 2
		}
		inherited = l
	}
	if *initMode {
		// Before anything can fork.
		if err := envd.BecomeInit(); err != nil {
			fmt.Fprintf(os.Stderr, "envd init: loopback: %v\n", err)
		}
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "envd: bad --log-level:", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *listen == "" && *socket == "" && inherited == nil {
		log.Error("nothing to serve on: set --listen, --socket or --socket-fd")
		return 2
	}
	user := *defaultUser
	if err := envd.LookupUser(user); err != nil {
		log.Warn("default user missing, using root", "user", user)
		user = "root"
	}

	cfg := envd.Config{Log: log, DefaultUser: user, Workdir: *workdir, DiskPath: *disk, PidsReserve: *pidsReserve}
	switch *cgroupRoot {
	case "auto":
		if *initMode {
			cfg.CgroupRoot = "/sys/fs/cgroup"
		}
	case "off":
	default:
		cfg.CgroupRoot = *cgroupRoot
	}
	if *initMode {
		// Off the start-up path, which is the way to sandboxd's first request.
		cfg.AfterFirstAnswer = envd.SpareInitThreads
	}
	srv := envd.New(cfg)
	defer srv.Close()
	log = srv.Log() // from here on, GET /logs has its lines too

	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // Node's undici may speak h2c; Python uses HTTP/1.1
	hs := &http.Server{
		Handler:           srv.Handler(),
		Protocols:         &protocols,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}

	// Each listener serves as soon as it exists. The socket comes first: it
	// is sandboxd's channel, and its appearance is what sandboxd's readiness
	// probe waits for, so its first request (/init) is answered while the
	// TCP listener is still being set up.
	errs := make(chan error, 2)
	serve := func(l net.Listener, addr string) {
		log.Info("envd serving", "addr", addr, "version", envdapi.Version, "default_user", user)
		go func() { errs <- hs.Serve(l) }()
	}
	if inherited != nil {
		serve(inherited, fmt.Sprintf("fd %d", *socketFD))
	} else if *socket != "" {
		l, err := listenUnix(*socket)
		if err != nil {
			log.Error("listen", "socket", *socket, "err", err)
			return 1
		}
		defer os.Remove(*socket)
		serve(l, *socket) // bound under a temporary name, then renamed
	}
	if *listen != "" {
		l, err := net.Listen("tcp", *listen)
		if err != nil {
			log.Error("listen", "addr", *listen, "err", err)
			return 1
		}
		serve(l, l.Addr().String())
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	select {
	case <-ctx.Done():
	case err := <-errs:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("serve", "err", err)
			return 1
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(shutdownCtx)
	return 0
}

// listenUnix listens on a unix socket at path that appears there only once
// it accepts: it is bound and listening under a temporary name first, then
// renamed over path (replacing a stale socket of an earlier run). sandboxd
// waits for the name to appear (inotify) and then asks /health once, so a
// socket that existed but refused connections would cost it a poll.
func listenUnix(path string) (net.Listener, error) {
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	_ = os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	// The listener would unlink tmp, the name it was bound to, on Close;
	// the caller removes path instead.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		_ = os.Remove(tmp)
		return nil, err
	}
	return l, nil
}

// inheritedUnix takes the listening unix socket sandboxd bound on the host
// and handed over as descriptor fd (--socket-fd). net.FileListener keeps a
// duplicate closed on exec; fd itself, which is not, is closed here.
func inheritedUnix(fd int) (net.Listener, error) {
	if fd < 3 {
		return nil, fmt.Errorf("descriptor %d is not a handed-over one", fd)
	}
	f := os.NewFile(uintptr(fd), "sandboxd's socket")
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	if _, ok := l.(*net.UnixListener); !ok {
		l.Close()
		return nil, fmt.Errorf("descriptor %d is not a unix socket", fd)
	}
	return l, nil
}
