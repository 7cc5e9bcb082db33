package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/sys/unix"
)

// wsStart and wsMsg are the client's side of the websocket frame protocol
// (server/native_ws.go, docs/native-api.md).
type wsStart struct {
	Type    string            `json:"type"`
	Cmd     string            `json:"cmd,omitempty"`
	Argv    []string          `json:"argv,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	User    string            `json:"user,omitempty"`
	PTY     *wsPTY            `json:"pty,omitempty"`
	Stdin   *bool             `json:"stdin,omitempty"`
	Timeout int               `json:"timeout,omitempty"`
}

type wsPTY struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

type wsMsg struct {
	Type     string `json:"type"`
	Data     []byte `json:"data,omitempty"`
	Cols     uint16 `json:"cols,omitempty"`
	Rows     uint16 `json:"rows,omitempty"`
	Signal   string `json:"signal,omitempty"`
	PID      uint32 `json:"pid,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty"`
	Code     string `json:"code,omitempty"`
	Fatal    bool   `json:"fatal,omitempty"`
}

// signalExit is the shell convention for a death by signal: 128+n.
var signalExit = map[string]int{"hangup": 129, "interrupt": 130, "killed": 137, "terminated": 143}

// stream runs a command over the websocket: output to cio, stdin forwarded
// when withStdin, a PTY (raw local terminal, resize on SIGWINCH) when tty.
// It returns exitError with the remote code (nil for 0).
func (c *apiClient) stream(ctx context.Context, id string, start wsStart, cio clientIO, withStdin, tty bool) error {
	u, err := url.Parse(c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/exec/ws")
	if err != nil {
		return err
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	conn, resp, err := websocket.DefaultDialer.DialContext(ctx, u.String(), http.Header{"Authorization": {"Bearer " + c.token}})
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			return apiError(resp)
		}
		return err
	}
	defer conn.Close()
	var wmu sync.Mutex
	send := func(v any) error {
		wmu.Lock()
		defer wmu.Unlock()
		return conn.WriteJSON(v)
	}

	inFile, isFile := cio.in.(*os.File)
	localTTY := tty && isFile && isTerminal(int(inFile.Fd()))
	if tty {
		start.PTY = &wsPTY{Cols: 80, Rows: 24}
		if localTTY {
			if cols, rows, ok := termSize(int(inFile.Fd())); ok {
				start.PTY = &wsPTY{Cols: cols, Rows: rows}
			}
		}
	}
	start.Stdin = &withStdin
	if err := send(start); err != nil {
		return err
	}
	var first wsMsg
	if err := conn.ReadJSON(&first); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if first.Type == "error" {
		return fmt.Errorf("%s: %s", first.Code, first.Error)
	}
	if first.Type != "started" {
		return fmt.Errorf("exec: unexpected %q frame", first.Type)
	}

	if localTTY {
		restore, err := makeRaw(int(inFile.Fd()))
		if err != nil {
			return err
		}
		defer restore()
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		done := make(chan struct{})
		defer close(done)
		go func() { // exits when stream returns
			for {
				select {
				case <-done:
					return
				case <-winch:
					if cols, rows, ok := termSize(int(inFile.Fd())); ok {
						_ = send(wsMsg{Type: "resize", Cols: cols, Rows: rows})
					}
				}
			}
		}()
	} else {
		// Ctrl-C on a non-PTY command terminates the remote command.
		intr := make(chan os.Signal, 1)
		signal.Notify(intr, os.Interrupt)
		defer signal.Stop(intr)
		done := make(chan struct{})
		defer close(done)
		go func() { // exits when stream returns
			for {
				select {
				case <-done:
					return
				case <-intr:
					_ = send(wsMsg{Type: "signal", Signal: "SIGTERM"})
				}
			}
		}()
	}
	if withStdin {
		// The stdin pump ends at EOF or when the websocket fails; a
		// blocked read of a terminal is abandoned when the process exits.
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := cio.in.Read(buf)
				if n > 0 {
					if send(wsMsg{Type: "stdin", Data: buf[:n]}) != nil {
						return
					}
				}
				if err != nil {
					if errors.Is(err, io.EOF) && !tty {
						_ = send(wsMsg{Type: "close_stdin"})
					}
					return
				}
			}
		}()
	}
	finished := make(chan struct{})
	defer close(finished)
	go func() { // closing the websocket on cancel ends ReadJSON below; exits with stream
		select {
		case <-ctx.Done():
			conn.Close()
		case <-finished:
		}
	}()
	for {
		var m wsMsg
		if err := conn.ReadJSON(&m); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("exec: connection lost: %w", err)
		}
		switch m.Type {
		case "stdout":
			if _, err := cio.out.Write(m.Data); err != nil {
				return err
			}
		case "stderr":
			if _, err := cio.errOut.Write(m.Data); err != nil {
				return err
			}
		case "error":
			if m.Fatal {
				return fmt.Errorf("%s: %s", m.Code, m.Error)
			}
			fmt.Fprintf(cio.errOut, "sandboxd: %s: %s\r\n", m.Code, m.Error)
		case "exit":
			wmu.Lock()
			_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			wmu.Unlock()
			code := 0
			if m.ExitCode != nil {
				code = *m.ExitCode
			}
			if m.Signal != "" {
				code = signalExit[m.Signal]
				if code == 0 {
					code = 128
				}
			}
			if m.Error != "" && code == 0 {
				code = 1
			}
			if m.Error != "" {
				fmt.Fprintf(cio.errOut, "sandboxd: %s\n", m.Error)
			}
			if code != 0 {
				return exitError{code: code}
			}
			return nil
		}
	}
}

func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

func termSize(fd int) (cols, rows uint16, ok bool) {
	ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 {
		return 0, 0, false
	}
	return ws.Col, ws.Row, true
}

// makeRaw puts the terminal in raw mode (cfmakeraw) and returns its undo.
func makeRaw(fd int) (func(), error) {
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN] = 1
	raw.Cc[unix.VTIME] = 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, err
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}
