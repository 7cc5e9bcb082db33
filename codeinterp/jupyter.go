package codeinterp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Jupyter is a client of a Jupyter Server's documented REST API, which
// starts, restarts, interrupts and stops the kernels; their messages go
// over ZeroMQ straight to the kernels (kernelConn), whose connection
// files are in the server's runtime directory.
type Jupyter struct {
	base       *url.URL
	hc         *http.Client
	runtimeDir string
}

// NewJupyter returns a client of the Jupyter Server at base (no token: it
// listens on the sandbox's loopback only) whose runtime directory
// (JUPYTER_RUNTIME_DIR) is runtimeDir.
func NewJupyter(base, runtimeDir string) (*Jupyter, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil {
		return nil, fmt.Errorf("jupyter url: %w", err)
	}
	if runtimeDir == "" {
		return nil, errors.New("jupyter: no runtime directory (the kernels' connection files)")
	}
	return &Jupyter{base: u, hc: &http.Client{Timeout: 2 * time.Minute}, runtimeDir: runtimeDir}, nil
}

func (j *Jupyter) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, j.base.String()+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := j.hc.Do(req)
	if err != nil {
		return fmt.Errorf("jupyter %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("jupyter %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("jupyter %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(raw))
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("jupyter %s %s: %w", method, path, err)
		}
	}
	return nil
}

// Wait polls the server until it answers.
func (j *Jupyter) Wait(ctx context.Context) error {
	for {
		err := j.do(ctx, http.MethodGet, "/api/status", nil, nil)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("jupyter did not start: %w (last: %w)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// KernelSpecs returns the names of the installed kernels.
func (j *Jupyter) KernelSpecs(ctx context.Context) ([]string, error) {
	var out struct {
		KernelSpecs map[string]json.RawMessage `json:"kernelspecs"`
	}
	if err := j.do(ctx, http.MethodGet, "/api/kernelspecs", nil, &out); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(out.KernelSpecs))
	for n := range out.KernelSpecs {
		names = append(names, n)
	}
	return names, nil
}

// session is a Jupyter session: a kernel bound to a path, whose directory
// is the kernel's working directory.
type session struct {
	ID     string `json:"id"`
	Kernel struct {
		ID string `json:"id"`
	} `json:"kernel"`
}

func (j *Jupyter) createSession(ctx context.Context, path, name, kernel string) (session, error) {
	var s session
	err := j.do(ctx, http.MethodPost, "/api/sessions", map[string]any{
		"path": path, "name": name, "type": "notebook", "kernel": map[string]string{"name": kernel},
	}, &s)
	return s, err
}

func (j *Jupyter) deleteSession(ctx context.Context, id string) error {
	return j.do(ctx, http.MethodDelete, "/api/sessions/"+url.PathEscape(id), nil, nil)
}

func (j *Jupyter) restartKernel(ctx context.Context, id string) error {
	return j.do(ctx, http.MethodPost, "/api/kernels/"+url.PathEscape(id)+"/restart", nil, nil)
}

func (j *Jupyter) interruptKernel(ctx context.Context, id string) error {
	return j.do(ctx, http.MethodPost, "/api/kernels/"+url.PathEscape(id)+"/interrupt", nil, nil)
}
