package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// templateScenario: E2B's template builds through the REST API as the SDKs
// drive them — a 5-step template built cold (new content every time) and
// fully cached (the same steps again) — and Sandbox.create() of a template
// whose start command takes 2 s to become ready: from its warm pool (goal:
// base's warm p50, within 1 ms), measured interleaved with base's warm
// claims, and cold (the start paid in the create).
func templateScenario(ctx context.Context, b *Bench) error {
	if !b.flags["max-builds"] || !b.flags["pool"] {
		b.add(unavailable("template", "template builds", "template builds are not implemented in this build"))
		return nil
	}
	extra := append(noLimits(b.flags), "--pool=true", "--min-warm=2")
	h, err := b.startSide(ctx, []string{"bench"}, extra...)
	if err != nil {
		return err
	}
	defer h.Close()

	n := b.iters(1, 20, 3)
	var cold, cached []time.Duration
	errs := 0
	for i := 0; i < n && ctx.Err() == nil; i++ {
		nonce := randHex(6)
		name := "bench-5step-" + nonce
		steps := fiveSteps(nonce)
		t0 := time.Now()
		if _, err := h.buildTemplate(ctx, name, steps, "", ""); err != nil {
			errs++
			b.logf("cold build: %v", err)
			continue
		}
		cold = append(cold, time.Since(t0))
		t0 = time.Now()
		if _, err := h.buildTemplate(ctx, name, steps, "", ""); err != nil {
			errs++
			b.logf("cached build: %v", err)
			continue
		}
		cached = append(cached, time.Since(t0))
	}
	rc := durDist("template", "5-step template build (ENV, WORKDIR, COPY, 2× RUN), cold: request → ready", cold, errs)
	rc.Note = "each run's RUN steps differ (a nonce), so no layer is cached"
	b.add(rc, durDist("template", "the same 5-step build again, every layer cached: request → ready", cached, 0))

	// A template whose start command is ready after 2 s.
	build, err := h.buildTemplate(ctx, "bench-slowstart", nil,
		"sleep 2; touch /tmp/ready; exec sleep 100000", "test -f /tmp/ready")
	if err != nil {
		return fmt.Errorf("slow-start template: %w", err)
	}
	t0 := time.Now()
	sb, err := h.createTemplate(ctx, "bench-slowstart")
	if err != nil {
		return fmt.Errorf("cold create of the slow-start template: %w", err)
	}
	coldCreate := time.Since(t0)
	_ = h.destroy(context.WithoutCancel(ctx), sb.ID)

	m := b.iters(1, 5, 5)
	var tpl, base []time.Duration
	terrs := 0
	b.loop(ctx, m, func(int) {
		// Each claim meets a full pool: wait for the refill of the last.
		h.templateReady(ctx, build, 1, 30*time.Second)
		h.templateReady(ctx, "base", 1, 30*time.Second)
		t0 := time.Now()
		sb, err := h.createTemplate(ctx, "bench-slowstart")
		if err != nil {
			terrs++
			b.logf("warm create of the slow-start template: %v", err)
			return
		}
		tpl = append(tpl, time.Since(t0))
		_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
		t0 = time.Now()
		sb, err = h.createTemplate(ctx, "base")
		if err != nil {
			terrs++
			return
		}
		base = append(base, time.Since(t0))
		_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
	})
	rw := durDist("template", "create of a template whose start command is ready after 2 s, from its warm pool → 201", tpl, terrs)
	rw.Goal = "base's warm p50 + ≤ 1 ms"
	rb := durDist("template", "create of base from its warm pool → 201 (interleaved)", base, 0)
	if rw.P50 != nil && rb.P50 != nil {
		rw.Compare = fmt.Sprintf("p50 %+.1f ms vs base", *rw.P50-*rb.P50)
	}
	rcold := durDist("template", "create of the same template, cold (its start paid in the create) → 201", []time.Duration{coldCreate}, 0)
	b.add(rw, rb, rcold)
	return nil
}

func fiveSteps(nonce string) []map[string]any {
	return []map[string]any{
		{"type": "ENV", "args": []string{"BENCH_NONCE", nonce}},
		{"type": "WORKDIR", "args": []string{"/home/user/app"}},
		{"type": "COPY", "args": []string{"app", "./", "", ""}},
		{"type": "RUN", "args": []string{"echo " + nonce + " > a.txt"}},
		{"type": "RUN", "args": []string{"cat a.txt hello.txt > b.txt"}},
	}
}

// apiCall sends a JSON request to the E2B API and decodes a 2xx answer
// into out (when not nil).
func (h *Harness) apiCall(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequestWithContext(ctx, method, "http://"+h.addr+apiPrefix+path, rd)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", h.key)
	resp, err := h.api.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(raw))
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// buildTemplate builds name from base with steps (a COPY step's files are
// app/hello.txt, uploaded if missing) and returns the build id once ready.
func (h *Harness) buildTemplate(ctx context.Context, name string, steps []map[string]any, start, ready string) (string, error) {
	var req struct{ TemplateID, BuildID string }
	if err := h.apiCall(ctx, http.MethodPost, "/v3/templates", map[string]any{"name": name}, &req); err != nil {
		return "", err
	}
	archive, hash := benchArchive()
	for _, st := range steps {
		if st["type"] != "COPY" {
			continue
		}
		st["filesHash"] = hash
		var link struct {
			Present bool   `json:"present"`
			URL     string `json:"url"`
		}
		if err := h.apiCall(ctx, http.MethodGet, "/templates/"+req.TemplateID+"/files/"+hash, nil, &link); err != nil {
			return "", err
		}
		if !link.Present {
			put, _ := http.NewRequestWithContext(ctx, http.MethodPut, link.URL, bytes.NewReader(archive))
			resp, err := h.api.Do(put)
			if err != nil {
				return "", err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return "", fmt.Errorf("upload: %s", resp.Status)
			}
		}
	}
	spec := map[string]any{"fromImage": "e2bdev/base", "steps": steps}
	if start != "" {
		spec["startCmd"], spec["readyCmd"] = start, ready
	}
	if err := h.apiCall(ctx, http.MethodPost, "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, spec, nil); err != nil {
		return "", err
	}
	for {
		var st struct {
			Status string `json:"status"`
			Reason *struct {
				Message string `json:"message"`
			} `json:"reason"`
		}
		if err := h.apiCall(ctx, http.MethodGet, "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status?logsOffset=100000", nil, &st); err != nil {
			return "", err
		}
		switch st.Status {
		case "ready":
			return req.BuildID, nil
		case "error":
			if st.Reason != nil {
				return "", errors.New(st.Reason.Message)
			}
			return "", errors.New("build failed")
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var benchArchive = func() func() ([]byte, string) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	_ = tw.WriteHeader(&tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "app/hello.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 6})
	_, _ = tw.Write([]byte("hello\n"))
	_ = tw.Close()
	_ = zw.Close()
	sum := sha256.Sum256(buf.Bytes())
	return func() ([]byte, string) { return buf.Bytes(), hex.EncodeToString(sum[:]) }
}()

// createTemplate is POST /v2/sandboxes of template.
func (h *Harness) createTemplate(ctx context.Context, template string) (*Sandbox, error) {
	var body struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := h.apiCall(ctx, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": template, "timeout": 3600}, &body); err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.live[body.SandboxID] = true
	h.mu.Unlock()
	return &Sandbox{ID: body.SandboxID, Token: body.EnvdAccessToken}, nil
}

// templateReady waits until the pools of backend template name hold at
// least want ready members, or within passes.
func (h *Harness) templateReady(ctx context.Context, name string, want int, within time.Duration) {
	deadline := time.Now().Add(within)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		n, _ := h.metricSum(ctx, "sandboxd_pool_members", map[string]string{"state": "ready", "template": name})
		if int(n) >= want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
