package server

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sandboxd/sandboxd/server/nativews"
)

// A websocket client that stops reading slows the process down instead of
// losing it: envd's output pump waits for the stream that started the
// process, so the process blocks on its full pipe with bounded buffering on
// the way, and once the client reads again every byte arrives.
func TestNativeExecWebsocketBackpressure(t *testing.T) {
	// The write wait is far beyond what finding the stall can take on a
	// loaded machine: this test is about a client that comes back.
	c, written := startFlood(t, func(c *Config) { c.NativeWSWriteWait = 10 * time.Minute })

	// Wait until the stalled process stops making progress.
	last := -2
	deadline := time.Now().Add(2 * time.Minute)
	for {
		w := written()
		if w < 0 {
			t.Fatal("the process ended while its client read nothing")
		}
		if w == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process still progressing (%d bytes) while its client reads nothing", w)
		}
		last = w
		time.Sleep(200 * time.Millisecond)
	}
	// envd buffers up to 32 MiB for the reader; the rest is the transports.
	if last >= floodBytes*3/4 {
		t.Fatalf("process wrote %d of %d bytes while its client read nothing", last, floodBytes)
	}
	t.Logf("stalled after %d bytes", last)

	c.readFlood()
}

// A client still catching up when the process ends gets every byte, the
// exit and the close. It answers the pings among the frames as it reads
// them, so its pongs keep coming after the server's last frame: a server
// that closed its socket then would answer them with a reset, and the reset
// drops what the server had not yet sent. Pings every millisecond make
// such a pong all but certain.
func TestNativeExecWebsocketSlowReaderGetsTheEnd(t *testing.T) {
	c, _ := startFlood(t, func(c *Config) { c.NativeWSPingPeriod = time.Millisecond })
	c.readFlood()
	_ = c.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, _, err := c.conn.ReadMessage()
	if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
		t.Fatalf("after the exit: %v; want a normal close", err)
	}
}

// readFlood reads startFlood's output to its exit frame.
func (c *wsClient) readFlood() {
	c.t.Helper()
	got := 0
	for {
		f := c.recv()
		switch f.Type {
		case "stdout":
			if len(bytes.Trim(f.Data, "\x00")) != 0 {
				c.t.Fatalf("unexpected output after %d bytes", got)
			}
			got += len(f.Data)
			continue
		case "exit":
			if exitCode(f) != 0 || got != floodBytes {
				c.t.Fatalf("exit %+v after %d bytes; want exit 0 after %d", f, got, floodBytes)
			}
		default:
			c.t.Fatalf("frame %+v after %d bytes; want stdout until exit", f, got)
		}
		return
	}
}

// A client that takes no output for the write wait is gone: the session
// ends, the websocket closes, and the process is killed rather than left
// blocked on a pipe nobody drains.
func TestNativeExecWebsocketStuckClient(t *testing.T) {
	c, written := startFlood(t, func(c *Config) { c.NativeWSWriteWait = time.Second })

	deadline := time.Now().Add(2 * time.Minute)
	for written() >= 0 {
		if time.Now().After(deadline) {
			t.Fatal("the process still runs 2 minutes after its client stopped reading; want it killed after the write wait")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// What the client had buffered is still readable; then the websocket
	// ends without an exit frame.
	got := 0
	for {
		_ = c.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		var f nativews.Frame
		if err := c.conn.ReadJSON(&f); err != nil {
			t.Logf("websocket ended after %d bytes: %v", got, err)
			break
		}
		if f.Type != "stdout" {
			t.Fatalf("frame %+v after %d bytes; want stdout until the websocket ends", f, got)
		}
		got += len(f.Data)
	}
	if got >= floodBytes {
		t.Fatalf("client got all %d bytes; want the session ended before", got)
	}
}

// floodBytes is what startFlood's process writes: far more than the
// transports and envd buffer between it and a client that reads nothing.
const floodBytes = 96 << 20

// startFlood starts a process writing floodBytes over exec/ws on a server
// configured by conf, and returns the client (which has read nothing but
// the started frame) and a probe of the process's progress.
func startFlood(t *testing.T, conf func(*Config)) (*wsClient, func() int) {
	t.Helper()
	e := newNativeEnvWith(t, true, nil, conf)
	tok := e.full()
	sb := e.create(tok, nil)
	c, _, err := e.dialWS(sb.Id, tok)
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{"head", "-c", strconv.Itoa(floodBytes), "/dev/zero"}
	c.start(nativews.Frame{Argv: argv})
	return c, e.progress(sb.Id, tok, argv)
}

// progress returns a probe of how much the process running argv in sandbox
// id has written so far, read from inside the sandbox; the probe returns -1
// once the process is gone.
func (e *nativeEnv) progress(id, tok string, argv []string) func() int {
	t := e.t
	script := `for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "` +
		strings.Join(argv, " ") + ` " ] && sed -n 's/^wchar: //p' $p/io; done; true`
	return func() int {
		t.Helper()
		res := e.exec(id, tok, map[string]any{"cmd": script})
		out := strings.TrimSpace(res.Stdout)
		if res.ExitCode != 0 {
			t.Fatalf("reading progress: %+v", res)
		}
		if out == "" {
			return -1
		}
		n, err := strconv.Atoi(out)
		if err != nil {
			t.Fatalf("progress %q: %v", out, err)
		}
		return n
	}
}
