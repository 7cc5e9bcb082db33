package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/codeinterp"
	"github.com/sandboxd/sandboxd/template"
)

// codeInterpreterTemplate is E2B's code-interpreter-v1 as sandboxd builds
// it: a venv with Jupyter from PyPI, Deno from npm for JavaScript and
// TypeScript, then the static code-interpreter
// server (bin/code-interpreter, beside sandboxd) with its start script.
func codeInterpreterTemplate(server []byte) (template.SystemTemplate, error) {
	archive, err := codeinterp.Archive(server)
	if err != nil {
		return template.SystemTemplate{}, err
	}
	hash := template.FilesHash(archive)
	return template.SystemTemplate{
		Name: codeinterp.TemplateName,
		Spec: template.BuildSpec{
			FromImage: template.DefaultBaseImage,
			Steps: []template.Step{
				{Type: "RUN", Args: []string{codeinterp.InstallCmd(), "root"}},
				{Type: "RUN", Args: []string{codeinterp.DenoInstallCmd(), "root"}},
				{Type: "COPY", Args: []string{"code-interpreter", codeinterp.Dir + "/", "root", ""}, FilesHash: hash},
			},
			StartCmd: codeinterp.StartCmd,
			ReadyCmd: codeinterp.ReadyCmd,
		},
		Files: map[string][]byte{hash: archive},
		// Jupyter, a kernel with pandas and matplotlib loaded and a
		// plot's buffers do not fit the default 512 MiB comfortably.
		MemoryMB: 1024,
	}, nil
}

// ensureCodeInterpreter builds code-interpreter-v1 in the background
// unless its current version is built, logging its progress.
func ensureCodeInterpreter(ctx context.Context, builds *template.Service, binPath string, log *slog.Logger) {
	log = log.With("component", "code-interpreter", "template", codeinterp.TemplateName)
	server, err := os.ReadFile(binPath)
	if err != nil {
		log.Error("code interpreter template: no server binary (make build puts it beside sandboxd); E2B's code-interpreter SDKs will not find their template", "err", err)
		return
	}
	tpl, err := codeInterpreterTemplate(server)
	if err != nil {
		log.Error("code interpreter template", "err", err)
		return
	}
	start := time.Now()
	last := time.Now()
	log.Info("code interpreter template: checking, building if needed (a build installs Jupyter, numpy, pandas and matplotlib from PyPI and Deno from npm: a few minutes)")
	built, err := builds.EnsureSystem(ctx, tpl, func(e template.LogEntry) {
		// Step lines always; pip's chatter every 20 s at most.
		step := strings.HasPrefix(e.Message, "[") || strings.HasPrefix(e.Message, "CACHED [")
		if step || e.Level == "error" || time.Since(last) > 20*time.Second {
			last = time.Now()
			log.Info("code interpreter template: building", "step", e.Step, "log", e.Message, "elapsed_s", int(time.Since(start).Seconds()))
		}
	})
	switch {
	case err != nil && ctx.Err() != nil:
		log.Info("code interpreter template: build stopped with sandboxd; it starts again at the next start")
	case err != nil:
		log.Error("code interpreter template: build failed; sandboxd retries at its next start", "err", err, "elapsed_s", int(time.Since(start).Seconds()))
	case built:
		log.Info("code interpreter template ready", "took_s", int(time.Since(start).Seconds()))
	default:
		log.Info("code interpreter template ready (built before)")
	}
}

// codeInterpreterMode checks --code-interpreter.
func codeInterpreterMode(v string) error {
	switch v {
	case "build", "off":
		return nil
	}
	return fmt.Errorf("--code-interpreter %q: want build or off", v)
}

func codeInterpreterBin(exe string) string {
	return filepath.Join(filepath.Dir(exe), "code-interpreter")
}
