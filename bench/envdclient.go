package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/api/process/processconnect"
)

// envdTarget is one way to reach an envd, with the headers the E2B SDKs
// send on that way.
type envdTarget struct {
	name    string
	baseURL string
	hc      *http.Client
	header  http.Header // added to every request
	proc    processconnect.ProcessClient
}

// sdkHeaders are what commands.run sends besides the path's own headers:
// the user as Basic auth and the keepalive interval.
var sdkHeaders = http.Header{
	"Authorization":           {"Basic dXNlcjo="}, // base64("user:")
	"Keepalive-Ping-Interval": {"50"},
}

type headerRT struct {
	base http.RoundTripper
	h    http.Header
}

func (t headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.h {
		r.Header[k] = v
	}
	return t.base.RoundTrip(r)
}

func newTarget(name, baseURL string, dial func(ctx context.Context, network, addr string) (net.Conn, error), header http.Header) *envdTarget {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         dial,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	if header == nil {
		header = http.Header{}
	}
	hc := &http.Client{Transport: headerRT{base: tr, h: header}}
	return &envdTarget{
		name: name, baseURL: baseURL, hc: hc, header: header,
		// The SDKs speak Connect with the JSON codec and no compression
		// either way (connect-web has none; the Python SDK turns it off);
		// connect-go would accept gzip by default, and envd would then
		// compress every output chunk.
		proc: processconnect.NewProcessClient(hc, baseURL, connect.WithProtoJSON(),
			connect.WithAcceptCompression("gzip", nil, nil)),
	}
}

func (t *envdTarget) close() { t.hc.CloseIdleConnections() }

// proxyTarget reaches sandbox sb's envd through sandboxd's data-plane
// proxy, exactly as an SDK with E2B_SANDBOX_URL=http://HOST:PORT does.
func (h *Harness) proxyTarget(sb *Sandbox) *envdTarget {
	hdr := http.Header{
		"E2b-Sandbox-Id":   {sb.ID},
		"E2b-Sandbox-Port": {fmt.Sprint(envdPort)},
	}
	if sb.Token != "" {
		hdr.Set("X-Access-Token", sb.Token)
	}
	var d net.Dialer
	return newTarget("proxy", "http://"+h.addr, d.DialContext, hdr)
}

// socketTarget reaches the same envd on the unix socket the proxy dials,
// bypassing sandboxd: the difference to proxyTarget is the proxy's cost.
func (h *Harness) socketTarget(sb *Sandbox) (*envdTarget, error) {
	sock, err := h.sandboxSocket(sb.ID)
	if err != nil {
		return nil, err
	}
	hdr := http.Header{}
	if sb.Token != "" {
		hdr.Set("X-Access-Token", sb.Token)
	}
	return newTarget("socket", "http://envd", func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, hdr), nil
}

// tcpTarget reaches a standalone envd over loopback TCP.
func tcpTarget(addr string) *envdTarget {
	var d net.Dialer
	return newTarget("direct", "http://"+addr, d.DialContext, nil)
}

// runResult is what one process run returned.
type runResult struct {
	stdout int    // bytes
	head   []byte // the first 4 KiB of stdout
	exit   int32
	ended  bool
}

// run starts cmd with args as commands.run does (stdin closed, the SDK's
// headers, a 60 s Connect timeout) and reads the stream to its end.
func (t *envdTarget) run(ctx context.Context, cmd string, args ...string) (runResult, error) {
	var res runResult
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: cmd, Args: args, Envs: map[string]string{}},
		Stdin:   new(false),
	})
	for k, v := range sdkHeaders {
		req.Header()[k] = v
	}
	stream, err := t.proc.Start(ctx, req)
	if err != nil {
		return res, err
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out := d.GetStdout()
			res.stdout += len(out)
			res.head = append(res.head, out[:min(len(out), max(0, 4096-len(res.head)))]...)
		}
		if e := ev.GetEnd(); e != nil {
			res.ended, res.exit = true, e.GetExitCode()
		}
	}
	if err := stream.Err(); err != nil {
		return res, err
	}
	if !res.ended {
		return res, errors.New("stream ended without an end event")
	}
	if res.exit != 0 {
		return res, fmt.Errorf("%s exited %d", cmd, res.exit)
	}
	return res, nil
}

// shell runs script the way commands.run(script) does: /bin/bash -l -c.
func (t *envdTarget) shell(ctx context.Context, script string) (runResult, error) {
	return t.run(ctx, "/bin/bash", "-l", "-c", script)
}

func (t *envdTarget) health(ctx context.Context) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, t.baseURL+"/health", nil)
	resp, err := t.hc.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health: %s", resp.Status)
	}
	return nil
}

// upload is files.write(path, bytes) as the SDKs send it for in-memory
// data: POST /files?path=... with a multipart/form-data part "file".
type upload struct {
	body        []byte
	contentType string
}

func newUpload(path string, data []byte) upload {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	w, _ := mw.CreateFormFile("file", path)
	w.Write(data)
	mw.Close()
	return upload{body: buf.Bytes(), contentType: mw.FormDataContentType()}
}

func (t *envdTarget) write(ctx context.Context, path string, u upload) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, t.baseURL+"/files?"+url.Values{"path": {path}}.Encode(), bytes.NewReader(u.body))
	req.Header.Set("Content-Type", u.contentType)
	resp, err := t.hc.Do(req)
	if err != nil {
		return err
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("write %s: %s: %s", path, resp.Status, bytes.TrimSpace(raw))
	}
	return nil
}

// read is files.read(path, format="bytes"): GET /files?path=...
func (t *envdTarget) read(ctx context.Context, path string, want int) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, t.baseURL+"/files?"+url.Values{"path": {path}}.Encode(), nil)
	resp, err := t.hc.Do(req)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("read %s: %s", path, resp.Status)
	}
	if int(n) != want {
		return fmt.Errorf("read %s: %d bytes, want %d", path, n, want)
	}
	return nil
}
