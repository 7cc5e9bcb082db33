package codeinterp

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// lateKernel is a kernel's websocket as jupyter_server serves it right after
// an automatic restart: the shell channel answers, but what the kernel
// publishes on iopub is lost until lostIopub requests have gone by (the
// iopub subscription joins late), and with noIdle the idle status of every
// execution is lost.
type lateKernel struct {
	lostIopub int
	noIdle    bool

	mu       sync.Mutex
	requests []string
}

func (k *lateKernel) serve(t *testing.T) *httptest.Server {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		for {
			var req message
			if ws.ReadJSON(&req) != nil {
				return
			}
			k.mu.Lock()
			k.requests = append(k.requests, req.Header.MsgType)
			iopub := len(k.requests) > k.lostIopub
			k.mu.Unlock()
			reply := func(channel, kind, content string) {
				_ = ws.WriteJSON(message{Header: header{MsgID: kind, MsgType: kind}, ParentHeader: req.Header,
					Content: json.RawMessage(content), Channel: channel})
			}
			if iopub {
				reply("iopub", "status", `{"execution_state":"busy"}`)
			}
			switch req.Header.MsgType {
			case "kernel_info_request":
				reply("shell", "kernel_info_reply", `{"status":"ok"}`)
			case "execute_request":
				if iopub {
					reply("iopub", "execute_result", `{"data":{"text/plain":"False"}}`)
				}
				reply("shell", "execute_reply", `{"status":"ok"}`)
			}
			if iopub && !k.noIdle {
				reply("iopub", "status", `{"execution_state":"idle"}`)
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func lateContext(t *testing.T, k *lateKernel) *execContext {
	j, err := NewJupyter(k.serve(t).URL)
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
	if want := "kernel_info_request,kernel_info_request,kernel_info_request,kernel_info_request,execute_request"; strings.Join(k.requests, ",") != want {
		t.Errorf("requests %v, want %s", k.requests, want)
	}
}

// An execution whose idle status never comes ends once the kernel has
// been silent for idleWait after its reply, and the next call nudges first.
func TestExecuteWithoutIdleEnds(t *testing.T) {
	defer func(d time.Duration) { idleWait = d }(idleWait)
	idleWait = 200 * time.Millisecond
	k := &lateKernel{noIdle: true}
	c := lateContext(t, k)
	c.conn, _ = c.j.connect(context.Background(), c.kernel)
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
