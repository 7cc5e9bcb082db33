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

	"github.com/sandboxd/sandboxd/server/nativews"
)

// signalExit is the shell convention for a death by signal: 128+n.
var signalExit = map[string]int{"hangup": 129, "interrupt": 130, "killed": 137, "terminated": 143}

// stream runs a command over the websocket: output to cio, stdin forwarded
// when withStdin, a PTY (raw local terminal, resize on SIGWINCH) when tty.
// It returns exitError with the remote code (nil for 0).
func (c *apiClient) stream(ctx context.Context, id string, start nativews.Frame, cio clientIO, withStdin, tty bool) error {
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
		start.PTY = &nativews.Size{Cols: 80, Rows: 24}
		if localTTY {
			if cols, rows, ok := termSize(int(inFile.Fd())); ok {
				start.PTY = &nativews.Size{Cols: uint32(cols), Rows: uint32(rows)}
			}
		}
	}
	start.Stdin = &withStdin
	if err := send(start); err != nil {
		return err
	}
	var first nativews.Frame
	if err := conn.ReadJSON(&first); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if first.Type == nativews.TypeError {
		return fmt.Errorf("%s: %s", first.Code, first.Error)
	}
	if first.Type != nativews.TypeStarted {
		return fmt.Errorf("exec: unexpected %q frame", first.Type)
	}

	if localTTY {
		restore, err := makeRaw(int(inFile.Fd()))
		if err != nil {
			return err
		}
		defer restore()
		defer onSignal(syscall.SIGWINCH, func() {
			if cols, rows, ok := termSize(int(inFile.Fd())); ok {
				_ = send(nativews.Frame{Type: nativews.TypeResize, Cols: uint32(cols), Rows: uint32(rows)})
			}
		})()
	} else {
		// Ctrl-C on a non-PTY command terminates the remote command.
		defer onSignal(os.Interrupt, func() {
			_ = send(nativews.Frame{Type: nativews.TypeSignal, Signal: "SIGTERM"})
		})()
	}
	if withStdin {
		// The stdin pump ends at EOF or when the websocket fails; a
		// blocked read of a terminal is abandoned when the process exits.
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := cio.in.Read(buf)
				if n > 0 {
					if send(nativews.Frame{Type: nativews.TypeStdin, Data: buf[:n]}) != nil {
						return
					}
				}
				if err != nil {
					if errors.Is(err, io.EOF) && !tty {
						_ = send(nativews.Frame{Type: nativews.TypeCloseStdin})
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
		var m nativews.Frame
		if err := conn.ReadJSON(&m); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("exec: connection lost: %w", err)
		}
		switch m.Type {
		case nativews.TypeStdout:
			if _, err := cio.out.Write(m.Data); err != nil {
				return err
			}
		case nativews.TypeStderr:
			if _, err := cio.errOut.Write(m.Data); err != nil {
				return err
			}
		case nativews.TypeError:
			if m.Fatal {
				return fmt.Errorf("%s: %s", m.Code, m.Error)
			}
			fmt.Fprintf(cio.errOut, "sandboxd: %s: %s\r\n", m.Code, m.Error)
		case nativews.TypeExit:
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

// onSignal calls f for each delivery of sig until the returned stop is
// called.
func onSignal(sig os.Signal, f func()) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sig)
	done := make(chan struct{})
	go func() { // exits at stop
		for {
			select {
			case <-done:
				return
			case <-ch:
				f()
			}
		}
	}()
	return func() {
		close(done)
		signal.Stop(ch)
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
