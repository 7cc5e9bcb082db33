package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/certs"
	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/incus"
	"github.com/sandboxd/sandboxd/internal/agentbin"
	"github.com/sandboxd/sandboxd/leader"
	sbxruntime "github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/local"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/server"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/telemetry"
	"github.com/sandboxd/sandboxd/template"
	"github.com/sandboxd/sandboxd/tenant"
	"github.com/sandboxd/sandboxd/volume"
)

const defaultRunDir = "/run/sandboxd/local"

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var (
		listen       = fs.String("listen", "127.0.0.1:3000", "address for the API and the data-plane proxy")
		dataDir      = fs.String("data-dir", "./data", "state directory (the SQLite store unless --store names PostgreSQL)")
		storeURL     = fs.String("store", "", storeUsage)
		leaseTTL     = fs.Duration("lease-ttl", leader.DefaultTTL, "with a PostgreSQL --store: how long the active sandboxd's lease lasts unrenewed, so how soon a standby takes over from an active one that died")
		backend      = fs.String("backend", "local", "isolation backend: local or incus")
		incusSocket  = fs.String("incus-socket", "", "Incus unix socket (--backend incus; default /var/lib/incus/unix.socket)")
		domain       = fs.String("domain", "", "sandbox domain for host routing (<port>-<id>.<domain>)")
		envdPath     = fs.String("envd", "", "host path of the static in-sandbox agent (default: envd-rs beside this binary, else envd)")
		runRoot      = fs.String("run-dir", defaultRunDir, "host state of the local backend")
		pauseDir     = fs.String("pause-dir", "", "where the local backend keeps the files of sandboxes paused with memory=false (default <data-dir>/paused)")
		maxTimeout   = fs.Duration("max-timeout", 24*time.Hour, "longest sandbox timeout a client may ask for")
		logLevel     = fs.String("log-level", "info", "debug, info, warn or error")
		tlsCert      = fs.String("tls-cert", "", "PEM certificate (chain): serve HTTPS, HTTP/1.1 and h2 (with --tls-key; see sandboxd tls init); both files are read again when they change (checked every 30 s), so an external renewal needs no restart")
		tlsKey       = fs.String("tls-key", "", "PEM private key of --tls-cert")
		maxBuilds    = fs.Int("max-builds", 2, "template builds run at once; more wait their turn")
		maxSnaps     = fs.Int("max-snapshots", 50, "snapshots a tenant may keep (0: no limit)")
		maxSnapMB    = fs.Int("max-snapshot-mb", 10240, "MiB of snapshot layers a tenant may keep (0: no limit); on the local backend they live under --run-dir")
		maxPubPaths  = fs.Int("max-publish-paths", template.DefaultMaxPublishPaths, "paths one workspace publish may change; a publish over it is refused (400) and makes nothing")
		maxPubMB     = fs.Int("max-publish-mb", template.DefaultMaxPublishMB, "MiB of files one workspace publish may change; a publish over it is refused (400) and makes nothing")
		buildTime    = fs.Duration("build-timeout", time.Hour, "longest a template build may run (queueing excluded); per tenant: tenants set --build-timeout-s")
		collectEvery = fs.Duration("layer-collect-interval", time.Minute, "how often the removal of a deleted template's layers that a sandbox still used is tried again")
		buildCPU     = fs.Int("build-cpu", 0, "most CPUs of a template build's sandbox (0: the default sandbox CPUs); per tenant: tenants set --build-cpu")
		buildMemMB   = fs.Int("build-memory-mb", 2048, "most memory of a template build's sandbox, MiB; per tenant: tenants set --build-memory-mb")
		buildDiskMB  = fs.Int("build-disk-mb", 4096, "disk of a template build's sandbox, MiB; per tenant: tenants set --build-disk-mb")
		plainHTTP    = fs.String("plain-http-registries", "", "comma-separated registry hosts (host:port) pulled over plain HTTP, e.g. one on loopback")
		metricsEvery = fs.Duration("metrics-interval", sandbox.DefaultMetricsInterval, "how often every running sandbox's resource use is sampled for its metrics history (getMetrics)")
		metricsKeep  = fs.Int("metrics-history", sandbox.DefaultMetricsHistory, "metrics samples kept per sandbox, in memory (720 at 5 s: the last hour)")
		otelEndpoint = fs.String("otel-endpoint", "", "OTLP/HTTP endpoint (e.g. http://localhost:4318) for traces of the API, the creates and the data-plane proxy; empty: OTEL_EXPORTER_OTLP_ENDPOINT if set, else no tracing")
		otelRatio    = fs.Float64("otel-sample-ratio", 1, "share of new traces sampled, 0..1 (a caller's sampled traceparent is always followed)")
		debugAddr    = fs.String("debug-addr", "", "loopback address (e.g. 127.0.0.1:6060) serving Go's profiles at /debug/pprof/: CPU, heap, goroutines, the execution trace, and mutex and blocking profiles, which are sampled only while it is set; empty: none")
		codeInterp   = fs.String("code-interpreter", "build", "build: build E2B's code-interpreter-v1 template (public, owned by tenant sandboxd) in the background at start unless built; off: do not")
	)
	templates := templateFlag{}
	fs.Var(templates, "template", "extra local template NAME=PATH[,cpu=N][,memory=MiB][,disk=MiB]: a root filesystem directory, a docker-save tarball or an OCI layout directory (LAYOUT:REF picks an image), with the resources its sandboxes get when a create names none; NAME may be base or host (resources only); repeatable")
	var lim limitOpts
	lim.register(fs)
	var bo backendOpts
	bo.register(fs)
	var acmeO acmeOpts
	acmeO.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		// A bare boolean-style flag stops at its name: "--local-userns off"
		// would mean on, and an ignored "off".
		return fmt.Errorf("serve: unexpected argument %q (give flag values with =, e.g. --local-userns=off)", fs.Arg(0))
	}
	if err := codeInterpreterMode(*codeInterp); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if err := acmeO.validate(*domain, *tlsCert, *tlsKey); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// The serving certificate: a static pair, reloaded when its files
	// change, or one from an ACME CA, obtained here (serving starts only
	// with a certificate) and renewed in the background.
	var certMgr *certs.Manager
	switch {
	case *tlsCert != "":
		m, err := certs.NewStatic(*tlsCert, *tlsKey, log)
		if err != nil {
			return fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		certMgr = m
	case acmeO.enabled():
		m, err := acmeO.manager(ctx, *dataDir, log)
		if err != nil {
			return err
		}
		certMgr = m
	}
	var tlsConfig *tls.Config
	if certMgr != nil {
		tlsConfig = &tls.Config{GetCertificate: certMgr.GetCertificate, MinVersion: tls.VersionTLS12}
		stopCerts := background(ctx, certMgr.Run)
		defer stopCerts()
	}
	stopTracing, err := telemetry.Setup(ctx, telemetry.Options{Endpoint: *otelEndpoint, SampleRatio: *otelRatio,
		ServiceName: "sandboxd", Version: version, BatchTimeout: time.Second})
	if err != nil {
		return fmt.Errorf("--otel-endpoint: %w", err)
	}
	defer func() {
		// Spans of the last requests still go out.
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(flushCtx); err != nil {
			log.Warn("tracing: flush at exit", "err", err)
		}
	}()

	_, stopDebug, err := serveDebug(*debugAddr, log)
	if err != nil {
		return err
	}
	defer stopDebug()

	metrics := server.NewMetrics()
	if certMgr != nil {
		metrics.Registry().MustRegister(certMgr.Collector())
	}
	// The listener opens first: a standby, and a sandboxd still starting,
	// answer 503 and say why (server.Front), and the address is taken at
	// once rather than after the lease.
	front := server.NewFront(metrics)
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // h2c in plaintext
	protocols.SetHTTP2(true)            // h2 by ALPN with TLS
	hs := &http.Server{
		Handler:           front,
		Protocols:         &protocols,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	// A 400 for a request net/http cannot parse must reach a client still
	// sending its body (see httpx.LingerListener).
	ln = httpx.LingerListener(ln)
	serveErr := make(chan error, 1)
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		go func() { serveErr <- hs.ServeTLS(ln, "", "") }()
	} else {
		go func() { serveErr <- hs.Serve(ln) }()
	}
	defer hs.Close() // a return before the graceful shutdown below

	if *envdPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		*envdPath = agentbin.Path(filepath.Dir(exe))
	}
	jwtVerifier, err := nativeJWT(*dataDir)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, *dataDir, *storeURL)
	if err != nil {
		return err
	}
	defer st.Close()
	// With a shared store, only the lease holder acts; the others wait
	// here, as standbys. The lease is released last (defers run in
	// reverse), once the sandboxes' manager and the backend have stopped.
	if isPostgres(*storeURL) {
		release, err := holdLease(ctx, *storeURL, *leaseTTL, front, metrics, log)
		if err != nil || release == nil {
			return err
		}
		defer release()
	}

	if *pauseDir == "" {
		*pauseDir = filepath.Join(*dataDir, "paused")
	}
	bo.registerer = metrics.Registry()
	bo.volumeDir = filepath.Join(*dataDir, "volumes")
	be, err := openBackend(ctx, *backend, *runRoot, *pauseDir, *envdPath, *incusSocket, bo, templates, log)
	if err != nil {
		return err
	}
	if lb, ok := be.(*local.Backend); ok && bo.ownCPUGroup && lb.CPUGrouped() && givenGOMAXPROCS == "" {
		goruntime.GOMAXPROCS(procsPerCPU * goruntime.GOMAXPROCS(0))
	}
	// Sandboxes outlive a sandboxd restart: they are re-adopted at the next
	// start, and the sweeper then enforces their end times. What the
	// backend holds besides them goes, on any return from here (the local
	// backend's empty cgroup parent and state tmpfs; Incus' deletions under
	// way are waited for).
	if c, ok := be.(io.Closer); ok {
		defer func() {
			if cerr := c.Close(); cerr != nil {
				log.Warn("close the backend", "err", cerr)
			}
		}()
	}

	defaults := lim.defaults()
	defaults.Build = tenant.BuildBudget{CPU: *buildCPU, MemoryMB: *buildMemMB, DiskMB: *buildDiskMB, TimeoutS: int(buildTime.Seconds())}
	defaults.Volumes = tenant.VolumeBudget{Max: lim.maxVolumes, MaxMB: lim.maxVolumesMB, SizeMB: lim.volumeSizeMB}
	settings := sandbox.NewSettings(st, defaults, log.With("component", "settings"))
	if err := settings.Refresh(ctx); err != nil {
		return fmt.Errorf("tenant settings: %w", err)
	}
	var mgr *sandbox.Manager
	builds, err := newTemplates(st, be, *dataDir, *maxBuilds, *collectEvery, settings.Build, snapshotLimits{*maxSnaps, *maxSnapMB, *maxPubPaths, *maxPubMB}, *plainHTTP,
		func() sbxruntime.Resources { return mgr.TemplateResources("") }, log)
	if err != nil {
		return err
	}
	availMB := availableMB() // at start: the spare pools' default floors and cap
	mgr = sandbox.New(sandbox.Config{
		Templates: builds,
		Store:     st, Backend: be, BackendName: *backend, Log: log.With("component", "sandbox"),
		EnvdVersion: envdapi.Version, MaxTimeout: *maxTimeout,
		OnCreateFrom:    metrics.ObserveCreate,
		OnClaimFallback: metrics.ClaimFallback, DeferClaimInit: lim.deferClaimInit, OnDeferredInit: metrics.DeferredInit,
		Settings: settings, HostMemoryMB: lim.hostMemoryMB, HostReserveMB: lim.hostReserveMB,
		ColdParallel: lim.coldParallel, ColdQueue: lim.coldQueue,
		Spare: lim.pool && lim.spare, SpareMin: lim.spareFloors(*codeInterp == "build", availMB, *backend),
		MaxCPU: lim.maxCPU, MaxDiskMB: lim.maxDiskMB,
		DiskInMemory:   *backend == "local", // its disk is a tmpfs
		MetricsHistory: *metricsKeep, OnMetricsPass: metrics.ObserveMetricsPass,
		OnLogDrop: metrics.LogsDropped,
	})
	defer mgr.Close() // after the HTTP server, pools and builds (deferred later)
	pools := lim.newPools(mgr, be, lim.spareCap(availMB, *backend), log)
	if pools != nil {
		builds.OnForget(pools.Drop)
	}
	volStore, _ := be.(sbxruntime.VolumeStore)
	vols := volume.New(st, volStore, settings.Volumes, log.With("component", "volume"))
	ipLimiter, ipLimit := lim.ipLimiter()
	var ready atomic.Bool
	front.Serve(server.New(server.Config{
		Manager: mgr, Store: st, Templates: be, Builds: builds, Differ: differOf(be), Volumes: vols, Metrics: metrics, Log: log,
		EnvdVersion: envdapi.Version, Domain: *domain, Ready: ready.Load, JWT: jwtVerifier,
		Limits: lim.tenantLimiter(settings), IPLimiter: ipLimiter, IPLimit: ipLimit, Pools: poolStats(pools),
		NativeIdleTTL: lim.nativeIdleTTL, Version: version,
	}))

	// Reconcile before taking API traffic: sandboxes from an earlier run are
	// re-adopted, what a crash left half-made is removed.
	if err := mgr.Reconcile(ctx); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	// Volumes a crash left without a record are removed.
	if err := vols.Prune(ctx); err != nil {
		log.Warn("prune volumes", "err", err)
	}
	// Builds a crash interrupted are failed; ready ones are defined on the
	// backend again, before any create can name them.
	if err := builds.Start(ctx); err != nil {
		return err
	}
	// Settings are polled so `sandboxd tenants set` applies without a
	// restart. Warm pools start after Reconcile (which destroys members a
	// previous process left: backend sandboxes without a row) and are
	// drained after the HTTP server has shut down.
	stopSettings := background(context.Background(), func(ctx context.Context) { settings.Run(ctx, lim.settingsPoll) })
	defer stopSettings()
	if *codeInterp == "build" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		stopCI := background(ctx, func(ctx context.Context) { ensureCodeInterpreter(ctx, builds, codeInterpreterBin(exe), log) })
		defer stopCI()
	}
	stopPools := func() {}
	if pools != nil {
		stopPools = background(context.Background(), pools.Run)
	}
	ready.Store(true)
	sweepCtx, stopSweep := context.WithCancel(ctx)
	sweepDone := make(chan struct{})
	go func() { defer close(sweepDone); mgr.Run(sweepCtx, time.Second) }()
	stopSampler := background(ctx, func(ctx context.Context) { mgr.RunMetrics(ctx, *metricsEvery) })
	defer stopSampler()
	attrs := []any{"addr", ln.Addr().String(), "backend", *backend, "data_dir", *dataDir,
		"e2b_api_url", scheme + "://" + ln.Addr().String() + server.E2BPrefix, "version", version, "tracing", telemetry.Enabled(), "gomaxprocs", goruntime.GOMAXPROCS(0)}
	if lb, ok := be.(*local.Backend); ok {
		attrs = append(attrs, "envd", *envdPath, "userns", lb.UserNS())
	}
	if ib, ok := be.(*incus.Backend); ok {
		attrs = append(attrs, "envd", ib.EnvdPath()) // a cluster's members hold their own
	}
	log.Info("sandboxd serving", attrs...)

	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	stopSweep()
	<-sweepDone
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = hs.Shutdown(shutdownCtx)
	// Builds in progress fail, and their build sandboxes go, before the
	// backend closes.
	builds.Close()
	stopPools()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	log.Info("sandboxd stopped")
	return err
}

// givenGOMAXPROCS is the variable as this process got it, read before
// local.Init sets it for the backend's children.
var givenGOMAXPROCS = os.Getenv("GOMAXPROCS")

// procsPerCPU is the Go processors sandboxd runs a CPU once in a cpu cgroup
// (--local-cpu-group). With one a CPU a thread the kernel preempts while it
// holds a processor stalls the others' requests behind it. On 2 CPUs, 4 a
// CPU took another tenant's claim during a flood from 13-18 to 3.1-4.4 ms
// at p50; 2 a CPU to 4.0-5.6 ms, 8 a CPU no further than 4 (issue 24).
const procsPerCPU = 4

// cgroupParent gives every run dir its own cgroup parent: the local
// backend's Reconcile removes cgroups under its parent that its run dir does
// not know, so two sandboxd instances (tests, benchmarks) sharing a parent
// would tear down each other's sandboxes.
func cgroupParent(runDir string) string {
	if filepath.Clean(runDir) == defaultRunDir {
		return "/sandboxd"
	}
	sum := sha256.Sum256([]byte(filepath.Clean(runDir)))
	return "/sandboxd-" + hex.EncodeToString(sum[:6])
}

// openRunParent lets the sandboxes' root traverse /run/sandboxd, sandboxd's
// own directory, when the run dir is in it: user namespaces need every
// ancestor of the run dir traversable by others, the local backend changes
// none it did not create, and sandboxd before user namespaces by default
// made this one 0700. Only the search bit is added, never the read bit.
func openRunParent(runDir string) {
	parent := filepath.Dir(defaultRunDir)
	if abs, err := filepath.Abs(runDir); err != nil || filepath.Dir(abs) != parent {
		return
	}
	if fi, err := os.Stat(parent); err == nil && fi.IsDir() && fi.Mode().Perm()&0o001 == 0 {
		_ = os.Chmod(parent, fi.Mode()&(os.ModePerm|os.ModeSetgid|os.ModeSticky)|0o011)
	}
}

// backend is what serve needs of a backend: the lifecycle contract plus the
// template list the API answers from.
type backend interface {
	sbxruntime.Backend
	sbxruntime.TemplateLister
}

// openBackend is the one place a backend is chosen.
func openBackend(ctx context.Context, name, runDir, pauseDir, envdPath, incusSocket string, bo backendOpts, templates templateFlag, log *slog.Logger) (backend, error) {
	if len(templates) > 0 && name != "local" {
		return nil, fmt.Errorf("--template: only for --backend local")
	}
	if bo.userNS.mode != local.UserNSAuto && name != "local" {
		return nil, fmt.Errorf("--local-userns: only for --backend local")
	}
	if bo.trackWriters && name != "local" {
		return nil, fmt.Errorf("--local-track-writers: only for --backend local")
	}
	if len(bo.incusImages) > 0 && name != "incus" {
		return nil, fmt.Errorf("--incus-image: only for --backend incus")
	}
	egressSubnet, err := bo.subnet()
	if err != nil {
		return nil, err
	}
	switch name {
	case "local":
		if bo.userNS.mode != local.UserNSOff {
			openRunParent(runDir)
		}
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		baseRootfs, err := bo.localBase()
		if err != nil {
			return nil, err
		}
		initPath := bo.localInit(exe)
		if initPath == "" {
			log.Info("local backend: no sandboxd-init; sandboxes start from this process (1-2 ms more per create)", "local_init", bo.initPath)
		}
		spawnPath := bo.localSpawn(exe)
		if spawnPath == "" {
			log.Info("local backend: no sandboxd-spawn; libcontainer starts every sandbox (about twice the CPU of a create)", "local_spawn", bo.spawnPath)
		}
		be, err := local.New(ctx, local.Options{
			InitPath: initPath, SpawnPath: spawnPath,
			Root: runDir, SaveDir: pauseDir, VolumeDir: bo.volumeDir, SaveReserveMB: bo.pauseReserve, CgroupParent: cgroupParent(runDir), EnvdPath: envdPath,
			Templates: templates.paths(), TemplateResources: templates.resources(), BaseRootfs: baseRootfs,
			EgressSubnet: egressSubnet, EgressAllow: bo.egressAllow, EgressDNS: bo.egressDNS, Registerer: bo.registerer, UserNS: bo.userNS.mode, LeaveCgroupMount: !bo.favorDynMods,
			OwnCPUGroup:  bo.ownCPUGroup,
			TrackWriters: bo.trackWriters,
			Log:          log.With("component", "local"),
		})
		if err != nil {
			return nil, fmt.Errorf("local backend: %w", err)
		}
		return be, nil
	case "incus":
		opts := incus.Options{EnvdPath: envdPath, Socket: incusSocket, EgressSubnet: egressSubnet, EgressAllow: bo.egressAllow, EgressDNS: bo.egressDNS, Registerer: bo.registerer,
			Images: bo.images(), Log: log.With("component", "incus")}
		if runDir != defaultRunDir {
			opts.Root = runDir
		}
		if bo.incusRemote.url != "" {
			if opts.Client, opts.Cluster, err = bo.incusRemote.open(); err != nil {
				return nil, err
			}
			if len(bo.egressAllow) > 0 || len(bo.egressDNS) > 0 || bo.egressSubnet != "" {
				return nil, fmt.Errorf("--egress-*: not with --incus-remote (the members' relays keep the sandboxes' network: their --egress-allow)")
			}
		}
		be, err := incus.New(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("incus backend (run scripts/incus-setup.sh first): %w", err)
		}
		return be, nil
	}
	return nil, fmt.Errorf("--backend %q: want local or incus", name)
}

// templateFlag collects repeated --template NAME=PATH[,KEY=N]... flags.
type templateFlag map[string]templateArg

type templateArg struct {
	path string // "" for base, which is built in
	res  sbxruntime.Resources
}

func (t templateFlag) String() string { return fmt.Sprint(map[string]templateArg(t)) }

// Set parses one flag. Trailing ",cpu=N", ",memory=MiB" and ",disk=MiB"
// are the template's resources; anything else after a comma is part of
// the path.
func (t templateFlag) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=PATH[,cpu=N][,memory=MiB][,disk=MiB], got %q", v)
	}
	var arg templateArg
	for {
		i := strings.LastIndexByte(rest, ',')
		if i < 0 {
			break
		}
		key, val, _ := strings.Cut(rest[i+1:], "=")
		var dst *int
		switch key {
		case "cpu":
			dst = &arg.res.CPUCount
		case "memory":
			dst = &arg.res.MemoryMB
		case "disk":
			dst = &arg.res.DiskSizeMB
		}
		if dst == nil {
			break
		}
		n, err := strconv.Atoi(val)
		if err != nil || n <= 0 {
			return fmt.Errorf("template %s: %s=%q: want a positive integer", name, key, val)
		}
		if *dst != 0 {
			return fmt.Errorf("template %s: %s given twice", name, key)
		}
		*dst = n
		rest = rest[:i]
	}
	arg.path = rest
	switch {
	case (name == local.BaseTemplate || name == local.HostTemplate) && arg.path != "":
		return fmt.Errorf("template %s is built in: give it resources only (%s=,cpu=N...)", name, name)
	case name != local.BaseTemplate && name != local.HostTemplate && arg.path == "":
		return fmt.Errorf("template %s: want NAME=PATH, got %q", name, v)
	}
	if _, dup := t[name]; dup {
		return fmt.Errorf("template %q given twice", name)
	}
	t[name] = arg
	return nil
}

// paths returns the templates to import, by name.
func (t templateFlag) paths() map[string]string {
	out := map[string]string{}
	for name, a := range t {
		if a.path != "" {
			out[name] = a.path
		}
	}
	return out
}

// resources returns the templates' declared resources, by name.
func (t templateFlag) resources() map[string]sbxruntime.Resources {
	out := map[string]sbxruntime.Resources{}
	for name, a := range t {
		if a.res != (sbxruntime.Resources{}) {
			out[name] = a.res
		}
	}
	return out
}

// differOf is the backend's runtime.Differ, or nil.
func differOf(be sbxruntime.Backend) sbxruntime.Differ {
	d, _ := be.(sbxruntime.Differ)
	return d
}
