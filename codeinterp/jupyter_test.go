package codeinterp

import (
	"context"
	"encoding/json"
	"fmt"
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
// execution is lost. With afterIdle, an execution's result and output
// come after its idle status, as Deno's sometimes do.
type lateKernel struct {
	lostIopub int
	noIdle    bool
	afterIdle bool

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
				if iopub && !k.afterIdle {
					reply("iopub", "execute_result", `{"data":{"text/plain":"False"}}`)
				}
				reply("shell", "execute_reply", `{"status":"ok"}`)
			}
			if iopub && !k.noIdle {
				reply("iopub", "status", `{"execution_state":"idle"}`)
			}
			if iopub && k.afterIdle && req.Header.MsgType == "execute_request" {
				reply("iopub", "stream", `{"name":"stdout","text":"late\n"}`)
				reply("iopub", "execute_result", `{"data":{"text/plain":"2"}}`)
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

// A Deno execution's output that comes after its idle status still
// reaches the execution: it waits for the answer to a kernel_info_request
// it sends after the idle.
func TestExecuteOutputAfterIdle(t *testing.T) {
	k := &lateKernel{afterIdle: true}
	c := lateContext(t, k)
	c.Language = "javascript"
	var got []string
	err := c.Execute(context.Background(), "1+1", map[string]string{}, nil, func(l Line) error {
		got = append(got, fmt.Sprintf("%v:%v%v", l["type"], l["text"], l["execution_count"]))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "stdout:late\n<nil>,result:2<nil>"; strings.Join(got, ",") != want {
		t.Errorf("lines %q, want %q", strings.Join(got, ","), want)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if want := "kernel_info_request,execute_request,kernel_info_request"; strings.Join(k.requests, ",") != want {
		t.Errorf("requests %v, want %s", k.requests, want)
	}
}
