package template

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/internal/faultinject"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Step kinds, as E2B's SDKs send them.
const (
	stepCopy    = "COPY"
	stepEnv     = "ENV"
	stepRun     = "RUN"
	stepWorkdir = "WORKDIR"
	stepUser    = "USER"
)

// The names E2B's SDKs give the phases around the steps in a failure's
// reason (steps are "1", "2", …).
const (
	phaseBase     = "base"
	phaseFinalize = "finalize"
)

// Step is one build instruction.
type Step struct {
	Type      string
	Args      []string
	FilesHash string
	Force     bool
}

// RegistryAuth are credentials for a private registry.
type RegistryAuth struct {
	Kind               string // "registry"; "aws" and "gcp" are refused
	Username, Password string
}

// BuildSpec is what a build is to make: a base and steps on it.
type BuildSpec struct {
	FromImage, FromTemplate string
	Registry                *RegistryAuth
	Force                   bool
	Steps                   []Step
	StartCmd, ReadyCmd      string
}

// LogEntry is one line of a build's log.
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// maxLogEntries bounds what a build keeps of its log; a runaway step's
// output is cut, with a note, rather than held in memory.
const maxLogEntries = 20000

// buildLog is a build in progress: its log, appended by the builder and
// read by status polls.
type buildLog struct {
	tags []string
	mu   sync.Mutex
	ents []LogEntry
	cut  bool
}

func newBuildLog(tags []string) *buildLog { return &buildLog{tags: tags} }

func (l *buildLog) add(level, step, msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ents) >= maxLogEntries {
		if !l.cut {
			l.cut = true
			l.ents = append(l.ents, LogEntry{Timestamp: time.Now().UTC(), Level: "warn", Step: step,
				Message: "build log cut: too many lines"})
		}
		return
	}
	l.ents = append(l.ents, LogEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg, Step: step})
}

func (l *buildLog) entries() []LogEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ents)
}

// lineWriter turns a command's output into log lines.
type lineWriter struct {
	log        *buildLog
	level      string
	step       string
	buf        []byte
	tail       []string // the last lines, for a failure's reason
	tailLimit  int
	onlyInTail bool
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 64<<10 { // a line without end: log it in pieces
		w.line(string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

func (w *lineWriter) line(s string) {
	s = strings.TrimRight(s, "\r")
	if w.tailLimit > 0 {
		w.tail = append(w.tail, s)
		if len(w.tail) > w.tailLimit {
			w.tail = w.tail[1:]
		}
	}
	if !w.onlyInTail {
		w.log.add(w.level, w.step, s)
	}
}

func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.line(string(w.buf))
		w.buf = nil
	}
}

// stepError is a failed build: the reason and the step it names.
type stepError struct {
	step string
	msg  string
}

func (e *stepError) Error() string { return e.msg }

func failStep(step, format string, args ...any) error {
	return &stepError{step: step, msg: fmt.Sprintf(format, args...)}
}

// StartBuild runs build id of tenant t's template ref with spec, in the
// background. The build must be waiting (requested, not started).
func (s *Service) StartBuild(ctx context.Context, t tenant.ID, ref, id string, spec BuildSpec) error {
	tpl, err := s.own(ctx, t, ref)
	if err != nil {
		return err
	}
	b, err := s.cfg.Store.GetBuild(ctx, tpl.ID, id)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("build %q of template %q not found", id, ref))
	}
	if err != nil {
		return err
	}
	if err := validateSpec(spec); err != nil {
		return err
	}
	s.mu.Lock()
	l := s.running[id]
	if b.Status != store.BuildWaiting || l == nil {
		s.mu.Unlock()
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("build %q was started already", id))
	}
	b.Status = store.BuildBuilding
	if err := s.cfg.Store.UpdateBuild(ctx, b, s.cfg.Now()); err != nil {
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	s.log.Info("template build started", "tenant", t, "template_id", tpl.ID, "build_id", id, "steps", len(spec.Steps))
	s.builds.Add(1)
	go func() {
		defer s.builds.Done()
		s.run(tpl, b, spec, l)
	}()
	return nil
}

func validateSpec(spec BuildSpec) error {
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	if spec.FromImage != "" && spec.FromTemplate != "" {
		return bad("give fromImage or fromTemplate, not both")
	}
	if spec.Registry != nil && spec.FromImage == "" {
		return bad("fromImageRegistry needs fromImage")
	}
	for i, st := range spec.Steps {
		n := i + 1
		switch st.Type {
		case stepRun:
			if len(st.Args) < 1 || st.Args[0] == "" {
				return bad("step %d: RUN needs a command", n)
			}
		case stepCopy:
			if len(st.Args) < 2 || st.Args[0] == "" || st.Args[1] == "" {
				return bad("step %d: COPY needs a source and a destination", n)
			}
			if !validHash(st.FilesHash) {
				return bad("step %d: COPY needs filesHash, a SHA-256 in hex", n)
			}
			if path.IsAbs(st.Args[0]) || slices.Contains(strings.Split(st.Args[0], "/"), "..") {
				return bad("step %d: COPY source %q must be relative and inside the context", n, st.Args[0])
			}
			if len(st.Args) > 3 && st.Args[3] != "" {
				if _, err := strconv.ParseUint(st.Args[3], 8, 32); err != nil {
					return bad("step %d: COPY mode %q is not octal", n, st.Args[3])
				}
			}
		case stepEnv:
			if len(st.Args)%2 != 0 || len(st.Args) == 0 {
				return bad("step %d: ENV needs key, value pairs", n)
			}
			for j := 0; j < len(st.Args); j += 2 {
				if st.Args[j] == "" || strings.ContainsAny(st.Args[j], "=\x00") {
					return bad("step %d: ENV key %q", n, st.Args[j])
				}
			}
		case stepWorkdir, stepUser:
			if len(st.Args) != 1 || st.Args[0] == "" {
				return bad("step %d: %s needs one argument", n, st.Type)
			}
		default:
			return bad("step %d: unknown step type %q (COPY, ENV, RUN, WORKDIR or USER)", n, st.Type)
		}
	}
	return nil
}

// run is a build's goroutine: wait for a slot, build, record the outcome.
func (s *Service) run(tpl store.Template, b store.Build, spec BuildSpec, l *buildLog) {
	if len(s.slots) == cap(s.slots) {
		l.add("info", phaseBase, "Waiting for a free build slot")
	}
	var (
		res     Result
		err     error
		start   = s.cfg.Now()
		ctx     = s.stopCtx
		timeout = DefaultBuildTimeout
	)
	if sec := s.cfg.Limits(tpl.Tenant).TimeoutS; sec > 0 {
		timeout = time.Duration(sec) * time.Second
	}
	select {
	case s.slots <- struct{}{}:
		// Until its result is written: no layer collection meanwhile.
		defer s.holdLayersInSlot()()
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(s.stopCtx, timeout)
		defer cancel()
		start = s.cfg.Now()
		res, err = s.build(ctx, tpl, b.ID, spec, l)
	case <-s.stopCtx.Done():
		err = s.stopCtx.Err()
	}
	if err == nil {
		err = s.define(ctx, tpl, b.ID, res)
		if err != nil {
			err = failStep(phaseFinalize, "define the template: %v", err)
		}
	}
	if err == nil {
		raw, _ := json.Marshal(res)
		b.Result = raw
		b.Status = store.BuildReady
		l.add("info", phaseFinalize, fmt.Sprintf("Build finished in %s", s.cfg.Now().Sub(start).Round(time.Millisecond)))
	} else {
		// The stop and the time limit come first: a step cut short by
		// either fails with whatever its RPC saw (a killed process, an
		// exceeded deadline), which would hide the reason.
		var se *stepError
		step := phaseFinalize
		if errors.As(err, &se) {
			step = se.step
		}
		switch {
		case s.stopCtx.Err() != nil:
			se = &stepError{step: step, msg: "sandboxd stopped during the build"}
		case ctx.Err() != nil:
			se = &stepError{step: step, msg: fmt.Sprintf("the build took longer than its limit of %s", timeout)}
		case se == nil:
			se = &stepError{step: phaseFinalize, msg: err.Error()}
		}
		b.Status, b.Reason, b.ReasonStep = store.BuildError, se.msg, se.step
		l.add("error", se.step, "Build failed: "+se.msg)
		if len(res.Layers) > 0 {
			// Only its layers, the cache of its steps until its
			// template goes.
			b.Result, _ = json.Marshal(Result{Layers: res.Layers})
		}
	}
	b.Logs, _ = json.Marshal(l.entries())
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := s.cfg.Store.UpdateBuild(wctx, b, s.cfg.Now()); err != nil {
		// The template was deleted while it built (or the store failed):
		// nothing may start from this build.
		s.log.Error("template build: record outcome", "build_id", b.ID, "err", err)
		if b.Status == store.BuildReady {
			s.mu.Lock()
			delete(s.ready, b.ID)
			s.mu.Unlock()
			b.Status = store.BuildError
		}
		// The delete queued none of this build's layers.
		if err := s.cfg.Store.QueueLayerRemovals(wctx, res.Layers, s.cfg.Now()); err != nil {
			s.log.Warn("template build: queue the removal of its layers", "build_id", b.ID, "err", err)
		}
	}
	if b.Status == store.BuildReady {
		if err := s.cfg.Store.SetTags(wctx, tpl.ID, b.ID, l.tags, s.cfg.Now()); err != nil {
			s.log.Error("template build: tags", "build_id", b.ID, "err", err)
		}
	} else if s.cfg.Layered != nil {
		_ = s.cfg.Layered.UndefineTemplate(wctx, b.ID)
	}
	s.mu.Lock()
	delete(s.running, b.ID)
	clear(s.resolved) // a new ready build, and maybe new tags
	s.mu.Unlock()
	s.log.Info("template build "+string(b.Status), "audit", true, "tenant", tpl.Tenant, "template_id", tpl.ID,
		"build_id", b.ID, "reason", b.Reason, "step", b.ReasonStep, "took_ms", s.cfg.Now().Sub(start).Milliseconds())
}

// state is a build's position: the root so far and the config.
type state struct {
	base    string
	layers  []string
	chain   string // cache key of everything so far
	env     map[string]string
	user    string
	workdir string
}

// builder runs one build's steps.
type builder struct {
	s     *Service
	tpl   store.Template
	id    string
	log   *buildLog
	st    state
	box   string // the scratch sandbox on the current root, "" if none
	boxes int
	// recorded is how many of st.layers the build's row holds: layers only
	// grow once the base is set, so a count tells what is new.
	recorded int
}

func (s *Service) build(ctx context.Context, tpl store.Template, id string, spec BuildSpec, l *buildLog) (Result, error) {
	if s.cfg.Layered == nil {
		return Result{}, failStep(phaseBase, "this sandboxd's backend cannot build templates")
	}
	bd := &builder{s: s, tpl: tpl, id: id, log: l}
	defer bd.dropBox()
	// A failed build's result holds the layers it had, so that its
	// template's delete queues them too.
	if err := bd.from(ctx, spec); err != nil {
		return Result{Layers: bd.st.layers}, err
	}
	bd.recordLayers(ctx)
	n := len(spec.Steps)
	force := spec.Force
	for i, st := range spec.Steps {
		force = force || st.Force // a forced step invalidates what follows
		if err := bd.step(ctx, i+1, n, st, force); err != nil {
			return Result{Layers: bd.st.layers}, err
		}
	}
	res := Result{Base: bd.st.base, Layers: bd.st.layers, Env: bd.st.env, User: bd.st.user,
		Workdir: bd.st.workdir, StartCmd: spec.StartCmd, ReadyCmd: spec.ReadyCmd}
	if err := bd.finalize(ctx, res); err != nil {
		return Result{}, err
	}
	return res, nil
}

// from sets up the base: a template of the tenant's, an image mapped to a
// backend template, or an image pulled from its registry.
func (bd *builder) from(ctx context.Context, spec BuildSpec) error {
	bd.st = state{user: defaultUser, workdir: defaultWorkdir, env: map[string]string{}}
	switch {
	case spec.FromTemplate != "":
		bd.log.add("info", phaseBase, "FROM TEMPLATE "+spec.FromTemplate)
		if bd.s.cfg.Builtin(spec.FromTemplate) {
			return bd.fromBackend(ctx, spec.FromTemplate)
		}
		parent, err := bd.s.Find(ctx, bd.tpl.Tenant, spec.FromTemplate)
		if err != nil {
			return failStep(phaseBase, "base template %q not found", spec.FromTemplate)
		}
		_, tag := splitRef(spec.FromTemplate)
		build, err := bd.s.taggedBuild(ctx, parent, tag)
		if err != nil {
			return failStep(phaseBase, "base template %q: %v", spec.FromTemplate, err)
		}
		b, err := bd.s.cfg.Store.GetBuild(ctx, parent.ID, build)
		if err != nil {
			return failStep(phaseBase, "base template %q: %v", spec.FromTemplate, err)
		}
		var res Result
		if err := json.Unmarshal(b.Result, &res); err != nil {
			return failStep(phaseBase, "base template %q: unreadable build", spec.FromTemplate)
		}
		bd.st.base, bd.st.layers = res.Base, slices.Clone(res.Layers)
		bd.st.env, bd.st.user, bd.st.workdir = copyEnv(res.Env), res.User, res.Workdir
		bd.st.chain = hashKey(append([]string{"stack", res.Base}, res.Layers...)...)
		return nil
	default:
		ref := spec.FromImage
		if ref == "" {
			ref = DefaultBaseImage
		}
		if name, ok := bd.s.cfg.Images[ref]; ok && spec.Registry == nil {
			bd.log.add("info", phaseBase, fmt.Sprintf("FROM %s (sandboxd's %q template)", ref, name))
			return bd.fromBackend(ctx, name)
		}
		if bd.s.cfg.Builtin(ref) && spec.Registry == nil {
			bd.log.add("info", phaseBase, "FROM "+ref)
			return bd.fromBackend(ctx, ref)
		}
		bd.log.add("info", phaseBase, "FROM "+ref)
		im, err := bd.s.resolveImage(ctx, ref, spec.Registry)
		if err != nil {
			return failStep(phaseBase, "image %s: %v", ref, err)
		}
		bd.st.layers, bd.st.chain = []string{im.key}, im.key
		have, err := bd.s.cfg.Layered.HasLayer(ctx, im.key)
		if err != nil {
			return failStep(phaseBase, "layer cache: %v", err)
		}
		if have {
			bd.log.add("info", phaseBase, "CACHED "+ref+"@"+im.digest)
		} else {
			bd.log.add("info", phaseBase, "Pulling "+ref+"@"+im.digest)
			// Recorded before the import, as a step's layer before its
			// commit: a crash in between leaves no layer unnamed.
			bd.recordLayers(ctx)
			if err := bd.s.cfg.Layered.ImportImage(ctx, im.key, im.img); err != nil {
				return failStep(phaseBase, "image %s: %v", ref, registryError(err))
			}
			faultinject.Pause("template-image-imported", im.key)
		}
		for _, kv := range im.env {
			if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
				bd.st.env[k] = v
			}
		}
		return nil
	}
}

// fromBackend starts on one of the backend's own templates. Its content's
// digest is in every key built on it: a new base image (or a changed host
// /usr) is a cache miss, not the old base's layers.
func (bd *builder) fromBackend(ctx context.Context, name string) error {
	digest, err := bd.s.cfg.Layered.BaseDigest(ctx, name)
	if err != nil {
		return failStep(phaseBase, "base template %q: %v", name, err)
	}
	bd.st.base, bd.st.chain = name, hashKey("template", name, digest)
	return nil
}

func copyEnv(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// envKey is the env in a stable order, for cache keys.
func envKey(env map[string]string) string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\x00", k, env[k])
	}
	return b.String()
}

func (bd *builder) step(ctx context.Context, n, total int, st Step, force bool) error {
	name := strconv.Itoa(n)
	desc := fmt.Sprintf("[%d/%d] %s %s", n, total, st.Type, strings.Join(st.Args, " "))
	switch st.Type {
	case stepEnv:
		for j := 0; j+1 < len(st.Args); j += 2 {
			bd.st.env[st.Args[j]] = st.Args[j+1]
		}
		bd.st.chain = hashKey(bd.st.chain, stepEnv, envKey(bd.st.env))
		bd.log.add("info", name, desc)
		return nil
	case stepUser:
		bd.st.user = st.Args[0]
		bd.st.chain = hashKey(bd.st.chain, stepUser, bd.st.user)
		bd.log.add("info", name, desc)
		return nil
	}
	var (
		user    = bd.st.user
		cmd     string
		files   string
		workdir = bd.st.workdir
	)
	switch st.Type {
	case stepWorkdir:
		dir := st.Args[0]
		if !path.IsAbs(dir) {
			dir = path.Join(bd.st.workdir, dir)
		}
		dir = path.Clean(dir)
		bd.st.workdir = dir
		user, workdir = "root", "/"
		cmd = "mkdir -p " + shellQuote(dir) + " && chown " + shellQuote(bd.st.user) + " " + shellQuote(dir) + " 2>/dev/null || mkdir -p " + shellQuote(dir)
	case stepRun:
		cmd = st.Args[0]
		if len(st.Args) > 1 && st.Args[1] != "" {
			user = st.Args[1]
		}
	case stepCopy:
		files = st.FilesHash
		user = "root"
	}
	key := hashKey(bd.st.chain, st.Type, strings.Join(st.Args, "\x00"), files, user, workdir, envKey(bd.st.env), bd.st.user)
	have, err := bd.s.cfg.Layered.HasLayer(ctx, key)
	if err != nil {
		return failStep(name, "layer cache: %v", err)
	}
	made := !have || force
	if !made {
		bd.log.add("info", name, "CACHED "+desc)
		bd.st.layers = append(bd.st.layers, key)
	} else {
		bd.log.add("info", name, desc)
		if err := bd.ensureBox(ctx, name); err != nil {
			return err
		}
		switch st.Type {
		case stepCopy:
			err = bd.copy(ctx, name, st)
		default:
			err = bd.exec(ctx, name, cmd, user, workdir)
		}
		if err != nil {
			return err
		}
		// Recorded before it exists, so that a crash between the commit
		// and the record leaves no layer the store does not name; one
		// named but never made is removed as a no-op. A cached layer is
		// another build's already (its row, or the removal queue).
		bd.st.layers = append(bd.st.layers, key)
		bd.recordLayers(ctx)
		if err := bd.s.cfg.Layered.Commit(ctx, bd.box, key); err != nil {
			return failStep(name, "save the step's layer: %v", err)
		}
		faultinject.Pause("template-layer-committed", key)
		bd.dropBox() // the next step starts on the new stack
	}
	bd.st.chain = key
	return nil
}

// recordLayers writes the layers the build has so far into its row
// (Result.Partial), so that a crash of sandboxd loses none. A failure is
// logged: the build goes on, and only a crash would lose those layers.
// Layers the row holds already are not written again (an image's layer,
// recorded before its import, and then the base's).
func (bd *builder) recordLayers(ctx context.Context) {
	if len(bd.st.layers) == bd.recorded {
		return
	}
	raw, _ := json.Marshal(Result{Layers: bd.st.layers, Partial: true})
	if err := bd.s.cfg.Store.RecordBuildResult(ctx, bd.tpl.ID, bd.id, raw, bd.s.cfg.Now()); err != nil {
		bd.s.log.Warn("template build: record its layers so far", "build_id", bd.id, "err", err)
		return
	}
	bd.recorded = len(bd.st.layers)
}

// ensureBox starts a scratch sandbox on the root built so far.
func (bd *builder) ensureBox(ctx context.Context, step string) error {
	if bd.box != "" {
		return nil
	}
	bd.boxes++
	name := fmt.Sprintf("bld-%s-%d", strings.ReplaceAll(bd.id, "-", "")[:20], bd.boxes)
	if err := bd.s.cfg.Layered.DefineTemplate(ctx, name, bd.st.base, bd.st.layers); err != nil {
		return failStep(step, "prepare the build sandbox: %v", err)
	}
	r := bd.s.buildResources(bd.tpl)
	_, err := bd.s.cfg.Backend.Create(ctx, runtime.Spec{
		ID: name, Template: name, CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, DiskSizeMB: r.DiskSizeMB,
		AllowInternet: true,
	})
	_ = bd.s.cfg.Layered.UndefineTemplate(context.WithoutCancel(ctx), name) // the sandbox keeps its root
	if err != nil {
		return failStep(step, "start the build sandbox: %v", err)
	}
	bd.box = name
	return nil
}

func (bd *builder) dropBox() {
	if bd.box == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := bd.s.cfg.Backend.Destroy(ctx, bd.box); err != nil {
		bd.s.log.Error("template build: destroy build sandbox", "build_id", bd.id, "sandbox_id", bd.box, "err", err)
	}
	bd.box = ""
}

// buildResources are a build sandbox's: the template's CPUs and memory,
// else the tenant's build limits, else the defaults; never above the
// limits.
func (s *Service) buildResources(tpl store.Template) runtime.Resources {
	lim := s.cfg.Limits(tpl.Tenant)
	def := s.cfg.Defaults()
	capped := func(v, limit int) int {
		if limit > 0 && v > limit {
			return limit
		}
		return v
	}
	return runtime.Resources{
		CPUCount:   capped(cmp.Or(tpl.CPUCount, lim.CPU, def.CPUCount), lim.CPU),
		MemoryMB:   capped(cmp.Or(tpl.MemoryMB, lim.MemoryMB, def.MemoryMB), lim.MemoryMB),
		DiskSizeMB: cmp.Or(lim.DiskMB, def.DiskSizeMB),
	}
}

func (bd *builder) client(user string) *envdconn.Client {
	box := bd.box
	return envdconn.NewClient(func(ctx context.Context) (net.Conn, error) {
		return bd.s.cfg.Backend.Dial(ctx, box, runtime.EnvdPort)
	}, "", user)
}

// shell runs cmd with bash where the root has it (E2B's steps are bash),
// else sh.
func shell(cmd string) (string, []string) {
	return "/bin/sh", []string{"-c", `if [ -x /bin/bash ]; then exec /bin/bash -c "$1"; fi; exec /bin/sh -c "$1"`, "sh", cmd}
}

// exec runs a step's command in the scratch sandbox, its output into the
// log; a non-zero exit fails the step with the command, the code and the
// output's last lines.
func (bd *builder) exec(ctx context.Context, step, cmd, user, workdir string) error {
	c := bd.client(user)
	defer c.Close()
	out := &lineWriter{log: bd.log, level: "info", step: step, tailLimit: 20}
	name, args := shell(cmd)
	x, err := c.Run(ctx, envdconn.Command{Cmd: name, Args: args, Env: bd.st.env, Cwd: workdir}, func(o, e []byte) {
		out.Write(o)
		out.Write(e)
	})
	out.flush()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return failStep(step, "command %q as %s: %v", cmd, user, err)
	}
	if x.ExitCode != 0 {
		return failStep(step, "command %q as %s failed with exit code %d (%s): %s", cmd, user, x.ExitCode, x.Status,
			strings.Join(out.tail, "\n"))
	}
	return nil
}

// copy unpacks a COPY step's uploaded archive into the scratch sandbox and
// moves the source's matches to the destination as Docker's COPY would: a
// directory's contents into the destination, files into it when it ends in
// '/' or there are several, else to it.
func (bd *builder) copy(ctx context.Context, step string, st Step) error {
	f, err := bd.s.openFiles(bd.tpl.Tenant, st.FilesHash)
	if errors.Is(err, os.ErrNotExist) {
		return failStep(step, "COPY %s: the files (hash %s) were never uploaded", st.Args[0], st.FilesHash)
	}
	if err != nil {
		return failStep(step, "COPY %s: %v", st.Args[0], err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return failStep(step, "COPY %s: %v", st.Args[0], err)
	}
	gz, err := isGzip(f)
	if err != nil {
		return failStep(step, "COPY %s: %v", st.Args[0], err)
	}
	c := bd.client("root")
	defer c.Close()
	archive := fmt.Sprintf("/tmp/.sandboxd-copy-%s.tar", step)
	resp, err := c.Files(ctx, "POST", archive, f, fi.Size())
	if err != nil {
		return failStep(step, "COPY %s: upload into the build sandbox: %v", st.Args[0], err)
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return failStep(step, "COPY %s: upload into the build sandbox: %s: %s", st.Args[0], resp.Status, msg)
	}
	dest := st.Args[1]
	if !path.IsAbs(dest) {
		slash := strings.HasSuffix(dest, "/") || dest == "." || strings.HasSuffix(dest, "/.")
		dest = path.Join(bd.st.workdir, dest)
		if slash {
			dest += "/"
		}
	}
	owner := bd.st.user
	if len(st.Args) > 2 && st.Args[2] != "" {
		owner = st.Args[2]
	}
	mode := ""
	if len(st.Args) > 3 {
		mode = st.Args[3]
	}
	z := ""
	if gz {
		z = "z"
	}
	script := `set -e
tmp=$(mktemp -d /tmp/.sandboxd-copy.XXXXXX)
trap 'rm -rf "$tmp" "$ARCHIVE"' EXIT
tar -x` + z + `f "$ARCHIVE" -C "$tmp"
cd "$tmp"
IFS=''
set -- $SRC
[ $# -gt 0 ] || { echo "COPY: nothing matches $SRC" >&2; exit 1; }
for s in "$@"; do [ -e "$s" ] || [ -L "$s" ] || { echo "COPY: nothing matches $SRC" >&2; exit 1; }; done
intodir=0
case "$DEST" in */) intodir=1 ;; esac
[ $# -gt 1 ] && intodir=1
[ -d "$DEST" ] && [ ! -L "$DEST" ] && intodir=1
own() {
	[ -n "$OWNER" ] && chown -hR "$OWNER" "$1"
	[ -n "$MODE" ] && chmod -R "$MODE" "$1"
	return 0
}
for s in "$@"; do
	if [ -d "$s" ] && [ ! -L "$s" ]; then
		mkdir -p "$DEST"
		for e in "$s"/* "$s"/.[!.]* "$s"/..?*; do
			[ -e "$e" ] || [ -L "$e" ] || continue
			t="${DEST%/}/${e##*/}"
			rm -rf "$t"
			cp -a "$e" "$t"
			own "$t"
		done
	elif [ $intodir = 1 ]; then
		mkdir -p "$DEST"
		t="${DEST%/}/${s##*/}"
		rm -rf "$t"
		cp -a "$s" "$t"
		own "$t"
	else
		mkdir -p "$(dirname "$DEST")"
		rm -rf "$DEST"
		cp -a "$s" "$DEST"
		own "$DEST"
	fi
done
`
	out := &lineWriter{log: bd.log, level: "info", step: step, tailLimit: 20}
	x, err := c.Run(ctx, envdconn.Command{Cmd: "/bin/sh", Args: []string{"-c", script},
		Env: map[string]string{"ARCHIVE": archive, "SRC": st.Args[0], "DEST": dest, "OWNER": owner, "MODE": mode}, Cwd: "/"},
		func(o, e []byte) { out.Write(o); out.Write(e) })
	out.flush()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return failStep(step, "COPY %s %s: %v", st.Args[0], st.Args[1], err)
	}
	if x.ExitCode != 0 {
		return failStep(step, "COPY %s %s failed with exit code %d: %s", st.Args[0], st.Args[1], x.ExitCode, strings.Join(out.tail, "\n"))
	}
	return nil
}

func isGzip(f *os.File) (bool, error) {
	var magic [2]byte
	n, err := f.ReadAt(magic[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return n == 2 && magic[0] == 0x1f && magic[1] == 0x8b, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// finalize checks the template's start: with a start command, a sandbox of
// the finished root runs it and must become ready (the ready command
// succeeds, or the start command ends) within the build's time.
func (bd *builder) finalize(ctx context.Context, res Result) error {
	if res.StartCmd == "" {
		return nil
	}
	bd.log.add("info", phaseFinalize, "Checking the start command: "+res.StartCmd)
	if err := bd.ensureBox(ctx, phaseFinalize); err != nil {
		return err
	}
	defer bd.dropBox()
	c := bd.client("root")
	defer c.Close()
	out := &lineWriter{log: bd.log, level: "info", step: phaseFinalize, tailLimit: 20}
	startCtx, stopStart := context.WithCancel(ctx)
	defer stopStart()
	ended := make(chan envdconn.Exit, 1)
	go func() {
		name, args := shell(res.StartCmd)
		x, err := c.Run(startCtx, envdconn.Command{Cmd: name, Args: args, Env: res.Env, Cwd: res.Workdir, Tag: sandbox.StartTag},
			func(o, e []byte) { out.Write(o); out.Write(e) })
		if err != nil {
			x = envdconn.Exit{ExitCode: -1, Status: err.Error()}
		}
		ended <- x
	}()
	cfg := sandbox.TemplateConfig{Env: res.Env, Workdir: res.Workdir, StartCmd: res.StartCmd, ReadyCmd: res.ReadyCmd}
	readyCtx, cancel := context.WithTimeout(ctx, sandbox.StartTimeout)
	defer cancel()
	err := sandbox.WaitReady(readyCtx, c, cfg, func(context.Context) bool {
		select {
		case x := <-ended:
			bd.log.add("info", phaseFinalize, fmt.Sprintf("Start command ended (%s)", x.Status))
			return true
		default:
			return false
		}
	})
	out.flush()
	if err != nil {
		return failStep(phaseFinalize, "%v: %s", err, strings.Join(out.tail, "\n"))
	}
	bd.log.add("info", phaseFinalize, "Template is ready")
	return nil
}
