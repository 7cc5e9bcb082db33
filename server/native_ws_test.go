package server

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/server/nativews"
)

type wsClient struct {
	t    testing.TB
	conn *websocket.Conn
}

func (e *nativeEnv) dialWS(id, tok string) (*wsClient, *http.Response, error) {
	e.t.Helper()
	url := "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/v1/sandboxes/" + id + "/exec/ws"
	h := http.Header{}
	if tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	conn, resp, err := websocket.DefaultDialer.Dial(url, h)
	if err != nil {
		return nil, resp, err
	}
	e.t.Cleanup(func() { conn.Close() })
	return &wsClient{t: e.t, conn: conn}, resp, nil
}

func (c *wsClient) send(f nativews.Frame) {
	c.t.Helper()
	if err := c.conn.WriteJSON(f); err != nil {
		c.t.Fatalf("send %s: %v", f.Type, err)
	}
}

func (c *wsClient) recv() nativews.Frame {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var f nativews.Frame
	if err := c.conn.ReadJSON(&f); err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	return f
}

// until reads frames until one of type typ, collecting stdout and stderr
// in arrival order as "o:..." and "e:..." items.
func (c *wsClient) until(typ string) (nativews.Frame, []string) {
	c.t.Helper()
	var seq []string
	for {
		f := c.recv()
		switch f.Type {
		case typ:
			return f, seq
		case "stdout":
			seq = append(seq, "o:"+string(f.Data))
		case "stderr":
			seq = append(seq, "e:"+string(f.Data))
		case "error":
			c.t.Fatalf("error frame while waiting for %s: %+v", typ, f)
		}
	}
}

func (c *wsClient) start(f nativews.Frame) uint32 {
	c.t.Helper()
	f.Type = "start"
	c.send(f)
	got := c.recv()
	if got.Type != "started" || got.PID == 0 {
		c.t.Fatalf("after start: %+v; want started with a pid", got)
	}
	return got.PID
}

func exitCode(f nativews.Frame) int {
	if f.ExitCode == nil {
		return -999
	}
	return *f.ExitCode
}

func TestNativeExecWebsocket(t *testing.T) {
	e := newNativeEnv(t, true)
	tok := e.full()
	sb := e.create(tok, nil)

	t.Run("interleaved order", func(t *testing.T) {
		c, _, err := e.dialWS(sb.Id, tok)
		if err != nil {
			t.Fatal(err)
		}
		c.start(nativews.Frame{Cmd: `for i in 1 2 3 4 5 6; do echo out$i; sleep 0.05; echo err$i >&2; sleep 0.05; done; exit 7`})
		end, seq := c.until("exit")
		var want []string
		for i := 1; i <= 6; i++ {
			want = append(want, fmt.Sprintf("o:out%d\n", i), fmt.Sprintf("e:err%d\n", i))
		}
		if !slices.Equal(seq, want) {
			t.Errorf("frames %q; want %q", seq, want)
		}
		if exitCode(end) != 7 {
			t.Errorf("exit %+v; want code 7", end)
		}
		// After exit the server closes the websocket.
		_ = c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, _, err := c.conn.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
			t.Errorf("after exit: %v; want a normal close", err)
		}
	})

	t.Run("stdin round trip", func(t *testing.T) {
		c, _, err := e.dialWS(sb.Id, tok)
		if err != nil {
			t.Fatal(err)
		}
		c.start(nativews.Frame{Argv: []string{"cat"}})
		for _, line := range []string{"one\n", "two\n", "three\n"} {
			c.send(nativews.Frame{Type: "stdin", Data: []byte(line)})
			f := c.recv()
			if f.Type != "stdout" || string(f.Data) != line {
				t.Fatalf("echo of %q = %+v", line, f)
			}
		}
		c.send(nativews.Frame{Type: "close_stdin"})
		if end, _ := c.until("exit"); exitCode(end) != 0 {
			t.Errorf("cat after close_stdin: %+v; want exit 0", end)
		}
	})

	t.Run("pty and resize", func(t *testing.T) {
		c, _, err := e.dialWS(sb.Id, tok)
		if err != nil {
			t.Fatal(err)
		}
		c.start(nativews.Frame{Cmd: `stty size; read x; stty size`, PTY: &nativews.Size{Cols: 80, Rows: 24}})
		var out strings.Builder
		for !strings.Contains(out.String(), "24 80") {
			f := c.recv()
			if f.Type != "stdout" {
				t.Fatalf("before resize: %+v; want stdout", f)
			}
			out.Write(f.Data)
		}
		c.send(nativews.Frame{Type: "resize", Cols: 100, Rows: 40})
		c.send(nativews.Frame{Type: "stdin", Data: []byte("\n")})
		end, seq := c.until("exit")
		if got := strings.Join(seq, ""); !strings.Contains(got, "40 100") {
			t.Errorf("after resize: %q; want 40 100", got)
		}
		if exitCode(end) != 0 {
			t.Errorf("exit %+v; want 0", end)
		}
	})

	t.Run("signal", func(t *testing.T) {
		c, _, err := e.dialWS(sb.Id, tok)
		if err != nil {
			t.Fatal(err)
		}
		c.start(nativews.Frame{Argv: []string{"sleep", "300"}})
		c.send(nativews.Frame{Type: "signal", Signal: "SIGUSR1"})
		if f := c.recv(); f.Type != "error" || f.Fatal || f.Code != "invalid_argument" {
			t.Errorf("unsupported signal: %+v; want a non-fatal invalid_argument error", f)
		}
		c.send(nativews.Frame{Type: "signal", Signal: "SIGTERM"})
		end, _ := c.until("exit")
		if exitCode(end) != -1 || end.Signal != "terminated" {
			t.Errorf("after SIGTERM: %+v; want exit -1, signal terminated", end)
		}
	})

	t.Run("disconnect kills", func(t *testing.T) {
		c, _, err := e.dialWS(sb.Id, tok)
		if err != nil {
			t.Fatal(err)
		}
		c.start(nativews.Frame{Argv: []string{"sleep", "301"}})
		if n := countProcs(t, e, sb.Id, tok, "sleep 301"); n != 1 {
			t.Fatalf("%d sleep 301 running; want 1", n)
		}
		c.conn.Close()
		waitProcs(t, e, sb.Id, tok, "sleep 301", 0)
	})

	t.Run("detached survives", func(t *testing.T) {
		c, _, err := e.dialWS(sb.Id, tok)
		if err != nil {
			t.Fatal(err)
		}
		c.start(nativews.Frame{Argv: []string{"sleep", "302"}, Detached: true})
		c.conn.Close()
		// Give a wrongful kill time to land, then check it did not.
		time.Sleep(500 * time.Millisecond)
		if n := countProcs(t, e, sb.Id, tok, "sleep 302"); n != 1 {
			t.Errorf("%d detached sleep 302 running after disconnect; want 1", n)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		c, _, err := e.dialWS(sb.Id, tok)
		if err != nil {
			t.Fatal(err)
		}
		c.start(nativews.Frame{Argv: []string{"sleep", "303"}, Timeout: 1})
		end, _ := c.until("exit")
		if !end.TimedOut && end.Signal != "killed" {
			t.Errorf("after the timeout: %+v; want killed", end)
		}
		waitProcs(t, e, sb.Id, tok, "sleep 303", 0)
	})

	t.Run("protocol errors", func(t *testing.T) {
		for _, first := range []nativews.Frame{{Type: "stdin"}, {Type: "start"}, {Type: "start", Cmd: "x", Argv: []string{"y"}}, {Type: "start", Cmd: "true", User: "nosuchuser"}, {Type: "start", Argv: []string{"/no/such/binary"}}} {
			c, _, err := e.dialWS(sb.Id, tok)
			if err != nil {
				t.Fatal(err)
			}
			c.send(first)
			if f := c.recv(); f.Type != "error" || !f.Fatal || f.Code != "invalid_argument" {
				t.Errorf("first frame %+v: got %+v; want a fatal invalid_argument error", first, f)
			}
		}
	})

	t.Run("refused before upgrade", func(t *testing.T) {
		for _, tc := range []struct {
			id, tok string
			status  int
		}{
			{sb.Id, "", 401},
			{sb.Id, e.token("acme", jwtauth.ScopeRead), 403},
			{sb.Id, e.token("other", jwtauth.ScopeRead, jwtauth.ScopeWrite), 404},
			{"nosuchsandbox0000000", tok, 404},
		} {
			_, resp, err := e.dialWS(tc.id, tc.tok)
			if err == nil || resp == nil || resp.StatusCode != tc.status {
				code := 0
				if resp != nil {
					code = resp.StatusCode
				}
				t.Errorf("dial %s: %v, status %d; want %d", tc.id, err, code, tc.status)
			}
		}
	})
}

// waitProcs polls until count processes match prefix (the kill after a
// disconnect is asynchronous), failing after 10 s.
func waitProcs(t *testing.T, e *nativeEnv, id, tok, prefix string, count int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := countProcs(t, e, id, tok, prefix)
		if n == count {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d processes %q; want %d", n, prefix, count)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
