package server

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/server/nativews"
)

// A websocket client that stops reading slows the process down instead of
// losing it: envd's output pump waits for the stream that started the
// process, so the process blocks on its full pipe with bounded buffering on
// the way, and once the client reads again every byte arrives.
func TestNativeExecWebsocketBackpressure(t *testing.T) {
	e := newNativeEnv(t, true)
	tok := e.full()
	sb := e.create(tok, nil)
	c, _, err := e.dialWS(sb.Id, tok)
	if err != nil {
		t.Fatal(err)
	}
	const total = 96 << 20
	argv := []string{"head", "-c", strconv.Itoa(total), "/dev/zero"}
	c.start(nativews.Frame{Argv: argv})

	// How much head has written so far, from inside the sandbox; -1 once it
	// is gone.
	script := `for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "` +
		strings.Join(argv, " ") + ` " ] && sed -n 's/^wchar: //p' $p/io; done; true`
	written := func() int {
		res := e.exec(sb.Id, tok, map[string]any{"cmd": script})
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
	// Wait until the stalled process stops making progress.
	last := -2
	deadline := time.Now().Add(30 * time.Second)
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
	if last >= total*3/4 {
		t.Fatalf("process wrote %d of %d bytes while its client read nothing", last, total)
	}
	t.Logf("stalled after %d bytes", last)

	got := 0
	for {
		f := c.recv()
		switch f.Type {
		case "stdout":
			if len(bytes.Trim(f.Data, "\x00")) != 0 {
				t.Fatalf("unexpected output after %d bytes", got)
			}
			got += len(f.Data)
			continue
		case "exit":
			if exitCode(f) != 0 || got != total {
				t.Fatalf("exit %+v after %d bytes; want exit 0 after %d", f, got, total)
			}
		default:
			t.Fatalf("frame %+v after %d bytes; want stdout until exit", f, got)
		}
		break
	}
}
