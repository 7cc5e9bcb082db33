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
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"
)

// Jupyter is a client of a Jupyter Server's documented REST API and kernel
// websocket channels.
type Jupyter struct {
	base *url.URL
	hc   *http.Client
}

// NewJupyter returns a client of the Jupyter Server at base (no token: it
// listens on the sandbox's loopback only).
func NewJupyter(base string) (*Jupyter, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil {
		return nil, fmt.Errorf("jupyter url: %w", err)
	}
	return &Jupyter{base: u, hc: &http.Client{Timeout: 2 * time.Minute}}, nil
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

// errKernelGone ends an execution whose kernel died or whose websocket
// dropped.
var errKernelGone = errors.New("kernel gone")

// kernelConn is one websocket to a kernel's channels. Replies are routed
// to the request they answer (parent msg_id); a restart or death the
// server announces reaches every request waiting.
type kernelConn struct {
	ws      *websocket.Conn
	session string
	wmu     sync.Mutex

	mu     sync.Mutex
	subs   map[string]chan message
	closed chan struct{}
	err    error
	// restarted counts the kernel restarts seen: state (env vars set)
	// is gone after one.
	restarted int
}

func (j *Jupyter) connect(ctx context.Context, kernelID string) (*kernelConn, error) {
	u := *j.base
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	sess := uuid.NewString()
	u.Path += "/api/kernels/" + url.PathEscape(kernelID) + "/channels"
	u.RawQuery = url.Values{"session_id": {sess}}.Encode()
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second, ReadBufferSize: 64 << 10, WriteBufferSize: 64 << 10}
	ws, _, err := d.DialContext(ctx, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("kernel %s channels: %w", kernelID, err)
	}
	k := &kernelConn{ws: ws, session: sess, subs: map[string]chan message{}, closed: make(chan struct{})}
	go k.read()
	return k, nil
}

func (k *kernelConn) read() {
	var err error
	for {
		var m message
		if err = k.ws.ReadJSON(&m); err != nil {
			break
		}
		k.mu.Lock()
		ch := k.subs[m.ParentHeader.MsgID]
		k.mu.Unlock()
		if ch != nil {
			select {
			case ch <- m:
			case <-k.closed:
			}
			continue
		}
		if m.Header.MsgType == "status" {
			var c statusContent
			_ = json.Unmarshal(m.Content, &c)
			if c.ExecutionState == "restarting" || c.ExecutionState == "dead" {
				k.kernelDied(c.ExecutionState)
			}
		}
	}
	k.mu.Lock()
	k.err = fmt.Errorf("%w: %w", errKernelGone, err)
	k.mu.Unlock()
	close(k.closed)
}

// kernelDied tells every waiting request that its kernel is gone.
func (k *kernelConn) kernelDied(state string) {
	k.mu.Lock()
	k.restarted++
	subs := make([]chan message, 0, len(k.subs))
	for _, ch := range k.subs {
		subs = append(subs, ch)
	}
	k.mu.Unlock()
	died := message{Header: header{MsgType: "sandboxd_kernel_" + state}}
	for _, ch := range subs {
		select {
		case ch <- died:
		case <-k.closed:
			return
		}
	}
}

func (k *kernelConn) restarts() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.restarted
}

// alive reports whether the websocket still reads.
func (k *kernelConn) alive() bool {
	select {
	case <-k.closed:
		return false
	default:
		return true
	}
}

func (k *kernelConn) close() {
	_ = k.ws.Close()
}

// execute sends an execute_request and returns the channel its replies
// arrive on; done unsubscribes.
func (k *kernelConn) execute(code string, silent bool) (string, <-chan message, func(), error) {
	return k.send("execute_request", map[string]any{
		"code": code, "silent": silent, "store_history": !silent,
		"user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": true,
	})
}

// send sends a request on the shell channel and returns the channel its
// replies (shell and iopub) arrive on; done unsubscribes.
func (k *kernelConn) send(msgType string, content any) (string, <-chan message, func(), error) {
	id := uuid.NewString()
	ch := make(chan message, 64)
	k.mu.Lock()
	k.subs[id] = ch
	k.mu.Unlock()
	done := func() {
		k.mu.Lock()
		delete(k.subs, id)
		k.mu.Unlock()
	}
	body, err := json.Marshal(content)
	if err != nil {
		done()
		return "", nil, nil, err
	}
	raw, err := json.Marshal(struct {
		Header       header          `json:"header"`
		ParentHeader struct{}        `json:"parent_header"`
		Metadata     struct{}        `json:"metadata"`
		Content      json.RawMessage `json:"content"`
		Channel      string          `json:"channel"`
	}{
		Header: header{MsgID: id, MsgType: msgType, Session: k.session, Username: "sandboxd",
			Date: time.Now().UTC().Format(time.RFC3339Nano), Version: "5.3"},
		Content: body, Channel: "shell",
	})
	if err != nil {
		done()
		return "", nil, nil, err
	}
	k.wmu.Lock()
	err = k.ws.WriteMessage(websocket.TextMessage, raw)
	k.wmu.Unlock()
	if err != nil {
		done()
		return "", nil, nil, fmt.Errorf("%w: %w", errKernelGone, err)
	}
	return id, ch, done, nil
}

// nudgeTries are the waits for a kernel_info_request's answers, one per
// try: a starting kernel takes a second or more to answer at all.
var nudgeTries = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, time.Second}

// nudge returns once the kernel answers on the shell channel and what it
// publishes on iopub reaches this connection. After a kernel (re)starts,
// the server's iopub subscription to it joins late, and what the kernel
// publishes before that is lost (ZeroMQ's slow joiner): an execution's
// outputs and the idle status it ends on among them. jupyter_server nudges
// a new websocket so, but not one that lives through an automatic restart.
// Each try sends a kernel_info_request and waits for its reply and an
// iopub status of it; ctx bounds the whole.
func (k *kernelConn) nudge(ctx context.Context) error {
	for try := 0; ; try++ {
		_, ch, done, err := k.send("kernel_info_request", struct{}{})
		if err != nil {
			return err
		}
		ok, err := k.nudged(ctx, ch, nudgeTries[min(try, len(nudgeTries)-1)])
		done()
		if ok || err != nil {
			return err
		}
	}
}

// nudged waits up to wait for a kernel_info_request's shell reply and an
// iopub message about it.
func (k *kernelConn) nudged(ctx context.Context, ch <-chan message, wait time.Duration) (bool, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	shell, iopub := false, false
	for !shell || !iopub {
		select {
		case m := <-ch:
			switch {
			case strings.HasPrefix(m.Header.MsgType, "sandboxd_kernel_"):
				return false, nil // restarting (again): try anew
			case m.Channel == "iopub":
				iopub = true
			case m.Header.MsgType == "kernel_info_reply":
				shell = true
			}
		case <-t.C:
			return false, nil
		case <-k.closed:
			return false, k.failure()
		case <-ctx.Done():
			return false, fmt.Errorf("the kernel did not answer: %w", ctx.Err())
		}
	}
	return true, nil
}

func (k *kernelConn) failure() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}
