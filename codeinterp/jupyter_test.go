package codeinterp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/codeinterp/zmtp"
)

// lateKernel is a kernel on ZeroMQ (shell and iopub, signing with a key)
// whose iopub subscription joins late: the shell channel answers, but what
// the kernel publishes on iopub is lost until lostIopub requests have gone
// by, and with noIdle the idle status of every execution is lost. With
// afterIdle, an execution's result and output come after its idle status,
// as Deno's sometimes do; with streamOnNext, its console output is published
// while the kernel handles the next request, tagged with that one; with
// resultOnNext, its result waits for the next execution, tagged with that
// one, as a publication Deno's event loop did not finish at once does
// (with heldLate, after that execution's idle status, as under load). Empty
// code has no result or output of its own, as in Deno.
type lateKernel struct {
	lostIopub    int
	noIdle       bool
	afterIdle    bool
	streamOnNext bool
	resultOnNext bool
	heldLate     bool // with resultOnNext: the held result comes after the next execution's idle status
	pending      bool // an execution's output waits for the next request
	held         bool // an execution's result waits for the next execution

	mu       sync.Mutex
	requests []string
	pubs     []*zmtp.Conn
}

const lateKey = "the kernel's key"

// serve starts the kernel and writes its connection file, kernel-k.json,
// into a runtime directory it returns.
func (k *lateKernel) serve(t *testing.T) string {
	t.Helper()
	listen := func(typ zmtp.SocketType, serve func(*zmtp.Conn)) int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				nc, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { nc.Close() })
				go func() {
					c, err := zmtp.Handshake(context.Background(), nc, typ)
					if err == nil {
						serve(c)
					}
				}()
			}
		}()
		return ln.Addr().(*net.TCPAddr).Port
	}
	key := signer(lateKey)
	iopub := listen(zmtp.Pub, func(c *zmtp.Conn) {
		if _, err := c.Recv(); err != nil { // the subscription
			return
		}
		k.mu.Lock()
		k.pubs = append(k.pubs, c)
		k.mu.Unlock()
	})
	shell := listen(zmtp.Router, func(c *zmtp.Conn) {
		for {
			frames, err := c.Recv()
			if err != nil {
				return
			}
			req, err := key.decode(frames, "shell")
			if err != nil {
				t.Errorf("the kernel got a bad request: %v", err)
				return
			}
			parent, _ := json.Marshal(req.Header)
			k.mu.Lock()
			k.requests = append(k.requests, req.Header.MsgType)
			iopub := len(k.requests) > k.lostIopub
			pubs := k.pubs
			k.mu.Unlock()
			reply := func(channel, kind, content string) {
				m, _ := key.encode(header{MsgID: kind, MsgType: kind}, parent, []byte(content))
				if channel == "shell" {
					_ = c.Send(m...)
					return
				}
				for _, p := range pubs {
					_ = p.Send(append([][]byte{[]byte("kernel.k." + kind)}, m...)...)
				}
			}
			var content struct{ Code string }
			_ = json.Unmarshal(req.Content, &content)
			code := content.Code
			if iopub {
				reply("iopub", "status", `{"execution_state":"busy"}`)
			}
			k.mu.Lock()
			pending := k.pending
			k.pending = k.streamOnNext && req.Header.MsgType == "execute_request" && code != ""
			k.mu.Unlock()
			if iopub && pending {
				reply("iopub", "stream", `{"name":"stderr","text":"on next\n"}`)
			}
			held := false
			switch req.Header.MsgType {
			case "kernel_info_request":
				reply("shell", "kernel_info_reply", `{"status":"ok"}`)
			case "execute_request":
				k.mu.Lock()
				held = k.held
				k.held = k.resultOnNext && code != ""
				k.mu.Unlock()
				if iopub && held && !k.heldLate {
					reply("iopub", "execute_result", `{"data":{"text/plain":"held"}}`)
				}
				if iopub && !k.afterIdle && !k.resultOnNext && code != "" {
					reply("iopub", "execute_result", `{"data":{"text/plain":"False"}}`)
				}
				reply("shell", "execute_reply", `{"status":"ok"}`)
			}
			if iopub && !k.noIdle {
				reply("iopub", "status", `{"execution_state":"idle"}`)
			}
			if iopub && held && k.heldLate {
				reply("iopub", "execute_result", `{"data":{"text/plain":"held"}}`)
			}
			if iopub && k.afterIdle && req.Header.MsgType == "execute_request" && code != "" {
				reply("iopub", "stream", `{"name":"stdout","text":"late\n"}`)
				reply("iopub", "execute_result", `{"data":{"text/plain":"2"}}`)
			}
		}
	})
	dir := t.TempDir()
	ci, _ := json.Marshal(map[string]any{"transport": "tcp", "ip": "127.0.0.1", "shell_port": shell, "iopub_port": iopub,
		"key": lateKey, "signature_scheme": "hmac-sha256"})
	if err := os.WriteFile(filepath.Join(dir, "kernel-k.json"), ci, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// leadingNudges counts the kernel_info_requests that come first (a new
// connection's, until iopub reaches it: as many as the subscription took)
// and joins the rest.
func leadingNudges(requests []string) (int, string) {
	n := 0
	for n < len(requests) && requests[n] == "kernel_info_request" {
		n++
	}
	return n, strings.Join(requests[n:], ",")
}

func lateContext(t *testing.T, k *lateKernel) *execContext {
	j, err := NewJupyter("http://127.0.0.1:1", k.serve(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &execContext{ID: "c", Language: "python", j: j, kernel: "k", lock: make(chan struct{}, 1),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	t.Cleanup(func() {
		if c.conn != nil {
			c.conn.close()
		}
	})
	return c
}

// A connection first makes sure iopub reaches it, so the first execution's
// result is not lost to a late subscription.
func TestExecuteWaitsForIopub(t *testing.T) {
	k := &lateKernel{lostIopub: 3}
	c := lateContext(t, k)
	var got []Line
	err := c.Execute(context.Background(), `"state" in dir()`, map[string]string{}, nil, func(l Line) error {
		got = append(got, l)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0]["text"] != "False" {
		t.Errorf("lines %v, want the result", got)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	// The fourth kernel_info_request is the first whose status reaches
	// the connection (one more if the subscription took longer).
	if nudges, rest := leadingNudges(k.requests); nudges < 4 || rest != "execute_request" {
		t.Errorf("requests %v, want 4 or more kernel_info_requests, then the execution", k.requests)
	}
}

// An execution whose idle status never comes ends once the kernel has
// been silent for idleWait after its reply, and the next call nudges first.
func TestExecuteWithoutIdleEnds(t *testing.T) {
	defer func(d time.Duration) { idleWait = d }(idleWait)
	idleWait = 200 * time.Millisecond
	k := &lateKernel{noIdle: true}
	c := lateContext(t, k)
	c.conn, _ = c.j.connect(context.Background(), c.kernel, c.log)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.run(ctx, "1", false, func(Line) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !c.unsure {
		t.Error("the context does not know its iopub lost a status")
	}
	if err := c.ready(ctx); err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if got := k.requests[len(k.requests)-1]; got != "kernel_info_request" || c.unsure {
		t.Errorf("after a lost idle: last request %s, unsure %v", got, c.unsure)
	}
}

// A Deno execution's late output still reaches the execution, which waits
// for the answers to an empty execution it sends after the idle: output
// that comes after its idle status, and console output and a result the
// kernel publishes while it handles that request, tagged with it (empty
// code has no output of its own).
func TestExecuteLateOutput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kernel *lateKernel
		want   string
	}{
		{"after the idle status", &lateKernel{afterIdle: true}, "stdout:late\n<nil>,result:2<nil>"},
		{"tagged with the next request", &lateKernel{streamOnNext: true}, "result:False<nil>,stderr:on next\n<nil>"},
		{"the result tagged with the next execution", &lateKernel{resultOnNext: true}, "result:held<nil>"},
		{"the result tagged with the next execution, after its idle status", &lateKernel{resultOnNext: true, heldLate: true}, "result:held<nil>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := lateContext(t, tc.kernel)
			c.Language = "javascript"
			var got []string
			err := c.Execute(context.Background(), "1+1", map[string]string{}, nil, func(l Line) error {
				got = append(got, fmt.Sprintf("%v:%v%v", l["type"], l["text"], l["execution_count"]))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, ",") != tc.want {
				t.Errorf("lines %q, want %q", strings.Join(got, ","), tc.want)
			}
			k := tc.kernel
			k.mu.Lock()
			defer k.mu.Unlock()
			if nudges, rest := leadingNudges(k.requests); nudges < 1 || rest != "execute_request,execute_request,execute_request" {
				t.Errorf("requests %v, want kernel_info_requests until iopub is through, the execution, two fences", k.requests)
			}
		})
	}
}
