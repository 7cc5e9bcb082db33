package codeinterp

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/codeinterp/zmtp"
)

// errKernelGone ends an execution whose kernel died: its connections
// closed.
var errKernelGone = errors.New("kernel gone")

// connInfo is the part of a kernel's connection file (jupyter_client
// writes it before it starts the kernel) that a client needs.
type connInfo struct {
	Transport       string `json:"transport"`
	IP              string `json:"ip"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
}

func readConnInfo(path string) (connInfo, error) {
	var ci connInfo
	raw, err := os.ReadFile(path)
	if err != nil {
		return ci, fmt.Errorf("kernel connection file: %w", err)
	}
	if err := json.Unmarshal(raw, &ci); err != nil {
		return ci, fmt.Errorf("kernel connection file %s: %w", path, err)
	}
	switch {
	case ci.Transport != "tcp":
		return ci, fmt.Errorf("kernel connection file %s: transport %q, not tcp", path, ci.Transport)
	case ci.Key != "" && ci.SignatureScheme != "hmac-sha256":
		return ci, fmt.Errorf("kernel connection file %s: signature scheme %q, not hmac-sha256", path, ci.SignatureScheme)
	case ci.ShellPort == 0 || ci.IOPubPort == 0:
		return ci, fmt.Errorf("kernel connection file %s: no shell or iopub port", path)
	}
	return ci, nil
}

// delimiter separates a message's routing prefix from its parts on the
// wire (Jupyter's messaging protocol).
var delimiter = []byte("<IDS|MSG>")

// signer signs and checks messages with the kernel's key; without a key,
// messages go unsigned (the spec's empty signature).
type signer []byte

func (s signer) sign(parts ...[]byte) []byte {
	if len(s) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, s)
	for _, p := range parts {
		m.Write(p)
	}
	return hex.AppendEncode(nil, m.Sum(nil))
}

// encode frames a message: delimiter, signature, header, parent header
// (JSON: {} for a request), metadata, content.
func (s signer) encode(h header, parent, content []byte) ([][]byte, error) {
	hdr, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	meta := []byte("{}")
	return [][]byte{delimiter, s.sign(hdr, parent, meta, content), hdr, parent, meta, content}, nil
}

var errSignature = errors.New("bad message signature")

// decode reads a message off the wire, checking its signature. Buffers
// and the metadata are not read: no message the server uses needs them.
func (s signer) decode(frames [][]byte, channel string) (message, error) {
	var m message
	i := 0
	for i < len(frames) && !bytes.Equal(frames[i], delimiter) {
		i++
	}
	if len(frames)-i < 6 {
		return m, fmt.Errorf("a message of %d parts after its delimiter", len(frames)-i-1)
	}
	sig, parts := frames[i+1], frames[i+2:i+6]
	if len(s) > 0 && !hmac.Equal(sig, s.sign(parts...)) {
		return m, errSignature
	}
	if err := json.Unmarshal(parts[0], &m.Header); err != nil {
		return m, fmt.Errorf("header: %w", err)
	}
	// An empty parent header is {}: no msg_id, routed nowhere.
	if err := json.Unmarshal(parts[1], &m.ParentHeader); err != nil {
		return m, fmt.Errorf("parent header: %w", err)
	}
	m.Content = json.RawMessage(parts[3])
	m.Channel = channel
	return m, nil
}

// kernelConn is a client's link to one kernel over ZeroMQ: a DEALER on its
// shell channel and a SUB on iopub. Replies are routed to the request they
// answer (parent msg_id). The kernel dying closes both connections, which
// every request waiting sees (closed).
type kernelConn struct {
	shell, iopub *zmtp.Conn
	key          signer
	session      string
	log          *slog.Logger

	mu     sync.Mutex
	subs   map[string]chan message
	closed chan struct{}
	once   sync.Once
	err    error
}

// dialRetry is how often a connect retries a kernel that does not listen
// yet: a kernel Jupyter just started binds its ports a second or so later.
const dialRetry = 20 * time.Millisecond

// connect reads kernelID's connection file and connects to its shell and
// iopub channels, waiting (within ctx) for a starting kernel to listen.
func (j *Jupyter) connect(ctx context.Context, kernelID string, log *slog.Logger) (*kernelConn, error) {
	ci, err := readConnInfo(filepath.Join(j.runtimeDir, "kernel-"+kernelID+".json"))
	if err != nil {
		return nil, err
	}
	shell, err := dialKernel(ctx, net.JoinHostPort(ci.IP, strconv.Itoa(ci.ShellPort)), zmtp.Dealer)
	if err != nil {
		return nil, fmt.Errorf("kernel %s shell: %w", kernelID, err)
	}
	iopub, err := dialKernel(ctx, net.JoinHostPort(ci.IP, strconv.Itoa(ci.IOPubPort)), zmtp.Sub)
	if err == nil {
		if err = iopub.Subscribe(""); err != nil {
			_ = iopub.Close()
		}
	}
	if err != nil {
		_ = shell.Close()
		return nil, fmt.Errorf("kernel %s iopub: %w", kernelID, err)
	}
	k := &kernelConn{shell: shell, iopub: iopub, key: signer(ci.Key), session: uuid.NewString(), log: log,
		subs: map[string]chan message{}, closed: make(chan struct{})}
	go k.read(shell, "shell")
	go k.read(iopub, "iopub")
	return k, nil
}

func dialKernel(ctx context.Context, addr string, typ zmtp.SocketType) (*zmtp.Conn, error) {
	for {
		c, err := zmtp.Dial(ctx, addr, typ)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the kernel does not listen: %w", ctx.Err())
		case <-time.After(dialRetry):
		}
	}
}

// read routes one channel's messages until its connection ends, which
// ends the kernelConn: a kernel whose process is gone closes both.
func (k *kernelConn) read(c *zmtp.Conn, channel string) {
	for {
		frames, err := c.Recv()
		if err != nil {
			k.fail(err)
			return
		}
		m, err := k.key.decode(frames, channel)
		if err != nil {
			k.log.Warn("kernel message dropped", "channel", channel, "err", err)
			continue
		}
		k.mu.Lock()
		ch := k.subs[m.ParentHeader.MsgID]
		k.mu.Unlock()
		if ch == nil {
			continue
		}
		select {
		case ch <- m:
		case <-k.closed:
			return
		}
	}
}

func (k *kernelConn) fail(err error) {
	k.once.Do(func() {
		k.mu.Lock()
		k.err = fmt.Errorf("%w: %w", errKernelGone, err)
		k.mu.Unlock()
		_ = k.shell.Close()
		_ = k.iopub.Close()
		close(k.closed)
	})
}

// alive reports whether both connections still read.
func (k *kernelConn) alive() bool {
	select {
	case <-k.closed:
		return false
	default:
		return true
	}
}

func (k *kernelConn) close() {
	k.fail(errors.New("closed"))
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
	body, err := json.Marshal(content)
	if err != nil {
		return "", nil, nil, err
	}
	frames, err := k.key.encode(header{MsgID: id, MsgType: msgType, Session: k.session, Username: "sandboxd",
		Date: time.Now().UTC().Format(time.RFC3339Nano), Version: "5.3"}, []byte("{}"), body)
	if err != nil {
		return "", nil, nil, err
	}
	ch := make(chan message, 64)
	k.mu.Lock()
	k.subs[id] = ch
	k.mu.Unlock()
	done := func() {
		k.mu.Lock()
		delete(k.subs, id)
		k.mu.Unlock()
	}
	if err := k.shell.Send(frames...); err != nil {
		done()
		k.fail(err)
		return "", nil, nil, fmt.Errorf("%w: %w", errKernelGone, err)
	}
	return id, ch, done, nil
}

// nudgeTries are the waits for a kernel_info_request's answers, one per
// try: a starting kernel takes a second or more to answer at all.
var nudgeTries = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, time.Second}

// nudge returns once the kernel answers on the shell channel and what it
// publishes on iopub reaches this connection. A new SUB connection joins
// late: what the kernel publishes before the subscription reaches it is
// lost (ZeroMQ's slow joiner), an execution's outputs and the idle status
// it ends on among them. Each try sends a kernel_info_request and waits
// for its reply and an iopub status of it; ctx bounds the whole.
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
