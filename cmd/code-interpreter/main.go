// Command code-interpreter is the server on port 49999 of sandboxd's
// code-interpreter-v1 template that E2B's code-interpreter SDKs talk to
// (package codeinterp), beside a Jupyter Server on the sandbox's loopback
// that starts and restarts the kernels; it talks to the kernels over
// ZeroMQ, with their connection files from the server's runtime directory.
// It is static, so that it runs in any template.
//
//	code-interpreter [--listen 0.0.0.0:49999] [--jupyter http://127.0.0.1:8888] [--jupyter-runtime-dir $JUPYTER_RUNTIME_DIR] [--envd http://127.0.0.1:49983]
//	code-interpreter --check [--listen ...]   # exit 0 once /health says OK: the template's ready command
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
	"runtime/debug"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/codeinterp"
)

func main() {
	var (
		listen  = flag.String("listen", "0.0.0.0:49999", "address to serve E2B's code-interpreter API on")
		jupyter = flag.String("jupyter", "http://127.0.0.1:8888", "the Jupyter Server (no token)")
		runtime = flag.String("jupyter-runtime-dir", os.Getenv("JUPYTER_RUNTIME_DIR"), "the Jupyter Server's runtime directory, with the kernels' connection files")
		envd    = flag.String("envd", "http://127.0.0.1:49983", "envd, for the sandbox's env vars; empty for none")
		cwd     = flag.String("cwd", codeinterp.DefaultCwd, "working directory of contexts that name none")
		check   = flag.Bool("check", false, "probe /health on --listen and exit 0 when it says OK")
		startTO = flag.Duration("start-timeout", 5*time.Minute, "how long Jupyter and the default kernel may take to start")
	)
	flag.Parse()
	// One 50 MB print is a 50 MB kernel message decoded and encoded
	// again: a soft limit makes the GC give that back before the sandbox's
	// memory limit is near.
	debug.SetMemoryLimit(96 << 20)
	if *check {
		os.Exit(probe(*listen))
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(*listen, codeinterp.Config{Jupyter: *jupyter, RuntimeDir: *runtime, Envd: *envd, Cwd: *cwd, Log: log}, *startTO); err != nil {
		log.Error("code-interpreter", "err", err)
		os.Exit(1)
	}
}

func run(listen string, cfg codeinterp.Config, startTimeout time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv, err := codeinterp.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	// /health answers 503 until Jupyter and the default kernel are up.
	started := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, startTimeout)
		defer cancel()
		started <- srv.Start(sctx)
	}()
	select {
	case err = <-started:
		if err != nil {
			_ = hs.Close()
			return fmt.Errorf("start: %w", err)
		}
	case err = <-served:
		return err
	case <-ctx.Done():
	}
	select {
	case err = <-served:
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func probe(listen string) int {
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + port + "/health")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, resp.Status)
		return 1
	}
	return 0
}
