package native

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/gorilla/websocket"

	"github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
	"github.com/sandboxd/sandboxd/server/httpx"
	"github.com/sandboxd/sandboxd/server/nativews"
)

// Websocket exec: the frame protocol is package nativews
// (docs/native-api.md).
//
// Output frames keep envd's order. The server writes one frame at a time and
// reads the next event only when the client took the last one, so its
// memory stays bounded, and envd holds the process's output until this
// stream (the one that started it) has room: a slow client slows the process.
// Closing the websocket kills the process (its whole group) unless start
// said detached.

const (
	wsStartWait  = 30 * time.Second
	wsWriteWait  = 30 * time.Second
	wsPingPeriod = 20 * time.Second
	wsMaxFrame   = 1 << 20
)

var wsUpgrader = websocket.Upgrader{
	ReadBufferSize:  32 << 10,
	WriteBufferSize: 32 << 10,
	// Credentials travel in headers, never in cookies, so a foreign origin
	// gains nothing a plain script would not have.
	CheckOrigin: func(*http.Request) bool { return true },
	Error: func(w http.ResponseWriter, r *http.Request, status int, reason error) {
		var body nativeapi.Error
		body.Error.Code = nativeErrorCode(status)
		body.Error.Message = reason.Error()
		httpx.WriteJSON(w, status, body)
	},
}

// wsConn serialises writes to one websocket.
type wsConn struct {
	*websocket.Conn
	mu sync.Mutex
	// writeWait bounds each write: a client that takes no output for
	// that long is gone as far as the session is concerned.
	writeWait time.Duration
}

func (c *wsConn) send(f nativews.Frame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.SetWriteDeadline(time.Now().Add(c.writeWait))
	return c.WriteJSON(f)
}

func (c *wsConn) sendErr(err error, fatal bool) {
	err = envdErr(err)
	msg, ok := errdefs.Public(err)
	if !ok {
		msg = err.Error()
	}
	_ = c.send(nativews.Frame{Type: nativews.TypeError, Code: nativeErrorCode(httpx.StatusOf(err)), Error: msg, Fatal: fatal})
}

func (c *wsConn) closeWith(code int, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
}

func (a *API) ExecWebsocket(w http.ResponseWriter, r *http.Request, id string) {
	// The sandbox is looked up before the upgrade, so a missing or foreign
	// one is a plain 404 answer.
	if _, err := a.mgr.GetView(r.Context(), id); err != nil {
		WriteError(w, r, a.log, err)
		return
	}
	// The upgrader's own refusals are text/plain; the API's errors are JSON.
	if !websocket.IsWebSocketUpgrade(r) {
		WriteError(w, r, a.log, errdefs.New(errdefs.ErrInvalidArgument, "exec/ws needs a websocket upgrade (Connection: Upgrade, Upgrade: websocket)"))
		return
	}
	raw, err := wsUpgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered the client
	}
	conn := &wsConn{Conn: raw, writeWait: a.wsWriteWait}
	defer conn.Close()
	conn.SetReadLimit(wsMaxFrame)
	if err := a.wsSession(r.Context(), conn, id); err != nil {
		conn.sendErr(err, true)
		conn.closeWith(websocket.CloseNormalClosure, "")
	}
}

// wsSession runs one process for one websocket; it returns an error only
// before the process started.
func (a *API) wsSession(ctx context.Context, conn *wsConn, id string) error {
	start, pc, err := readStart(conn)
	if err != nil {
		return err
	}
	c, err := a.envd(ctx, id, start.User)
	if err != nil {
		return err
	}
	defer c.close()

	// session ends when the client goes away; the stream's context also
	// carries the timeout, which envd enforces on the process.
	session, endSession := context.WithCancel(ctx)
	defer endSession()
	sctx := session
	if start.Timeout > 0 {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(session, time.Duration(start.Timeout)*time.Second)
		defer cancel()
	}
	sreq := &process.StartRequest{Process: pc, Stdin: ptr(start.Stdin == nil || *start.Stdin)}
	if start.PTY != nil {
		sreq.Pty = &process.PTY{Size: &process.PTY_Size{Cols: start.PTY.Cols, Rows: start.PTY.Rows}}
	}
	req := connect.NewRequest(sreq)
	c.Auth(req.Header())
	stream, err := c.Process().Start(sctx, req)
	if err != nil {
		return startErr(err)
	}
	defer stream.Close()

	// The start event comes first; until then no input can be routed.
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return startErr(err)
		}
		return errdefs.New(errdefs.ErrUnavailable, "envd ended the stream before the process started")
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		return errdefs.New(errdefs.ErrUnavailable, "envd did not report a pid")
	}
	if err := conn.send(nativews.Frame{Type: nativews.TypeStarted, PID: pid}); err != nil {
		endSession()
	}

	// The reader owns the client's frames; it exits when the websocket
	// fails or closes (the client's answer to the close after the exit
	// frame, or the handler's Close), and ends the session so the event
	// loop below stops too.
	readerDone, pingDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(readerDone)
		defer endSession()
		a.wsRead(session, conn, c, pid, start.PTY != nil)
	}()
	go func() {
		defer close(pingDone)
		if err := wsPing(session, conn, a.wsPingPeriod); err != nil {
			a.logLostClient(id, pid, "ping", err)
			endSession()
		}
	}()

	end, err := wsForward(stream, conn)
	if err != nil {
		a.logLostClient(id, pid, "output", err)
		endSession()
	}
	// envd enforces the timeout too, and its answer can come before our
	// own deadline fires (as in exec).
	timedOut := errors.Is(sctx.Err(), context.DeadlineExceeded) ||
		(start.Timeout > 0 && connect.CodeOf(stream.Err()) == connect.CodeDeadlineExceeded)
	clientGone := session.Err() != nil && !timedOut
	a.wsFinish(ctx, conn, c, wsOutcome{id: id, pid: pid, start: start, end: end,
		clientGone: clientGone, timedOut: timedOut, streamErr: stream.Err()})
	endSession()
	<-pingDone
	// The process has ended: neither envd's stream nor the sandbox's
	// activity (the idle TTL) waits for the client's close reply.
	_ = stream.Close()
	c.close()
	if !clientGone {
		// A client still reading the last frames answers the pings among
		// them; a pong that met a closed socket would draw a reset, and the
		// reset drops what the kernel has not yet sent: the tail of the
		// output and the exit. So the socket stays open until the client
		// answers the close (the reader then returns) or the write wait
		// passes, as RFC 6455 7.1.1 has it.
		_ = conn.SetReadDeadline(time.Now().Add(conn.writeWait))
		<-readerDone
	}
	_ = conn.Close() // unblocks the reader
	<-readerDone
	return nil
}

// logLostClient records why a session lost its client in a write: a
// client that took nothing for the write wait is an operator's concern
// (a stuck or too slow consumer), one that went away is routine.
func (a *API) logLostClient(id string, pid uint32, what string, err error) {
	// The websocket library hides the deadline error behind a net.Error
	// of its own that keeps only Timeout.
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		a.log.Warn("exec ws: client took no "+what+" within the write wait; session ends",
			"sandbox_id", id, "pid", pid, "write_wait", a.wsWriteWait.String())
		return
	}
	a.log.Info("exec ws: client gone during "+what+"; session ends", "sandbox_id", id, "pid", pid, "err", err)
}

// readStart reads and checks the session's first frame.
func readStart(conn *wsConn) (nativews.Frame, *process.ProcessConfig, error) {
	_ = conn.SetReadDeadline(time.Now().Add(wsStartWait))
	var start nativews.Frame
	if err := conn.ReadJSON(&start); err != nil {
		return start, nil, errdefs.New(errdefs.ErrInvalidArgument, "expected a start frame: "+err.Error())
	}
	_ = conn.SetReadDeadline(time.Time{})
	if start.Type != nativews.TypeStart {
		return start, nil, errdefs.New(errdefs.ErrInvalidArgument, "the first frame must be start, not "+start.Type)
	}
	pc, err := processSpec{cmd: start.Cmd, argv: start.Argv, env: start.Env, cwd: start.Cwd}.config()
	if err != nil {
		return start, nil, err
	}
	if start.Timeout < 0 {
		return start, nil, errdefs.New(errdefs.ErrInvalidArgument, "timeout must not be negative")
	}
	return start, pc, nil
}

// wsPing keeps proxies from closing an idle websocket; it returns nil with
// the session, or the error of a failed ping.
func wsPing(session context.Context, conn *wsConn, period time.Duration) error {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-session.Done():
			return nil
		case <-t.C:
			conn.mu.Lock()
			err := conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(conn.writeWait))
			conn.mu.Unlock()
			if err != nil {
				return err
			}
		}
	}
}

// wsForward sends the process's output to the client until its exit event
// (which it returns), the stream's end (nil, nil), or a failed send (its
// error).
func wsForward(stream *connect.ServerStreamForClient[process.StartResponse], conn *wsConn) (*process.ProcessEvent_EndEvent, error) {
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if end := ev.GetEnd(); end != nil {
			return end, nil
		}
		d := ev.GetData()
		var f nativews.Frame
		switch {
		case d == nil:
			continue
		case d.GetStdout() != nil:
			f = nativews.Frame{Type: nativews.TypeStdout, Data: d.GetStdout()}
		case d.GetPty() != nil:
			f = nativews.Frame{Type: nativews.TypeStdout, Data: d.GetPty()}
		case d.GetStderr() != nil:
			f = nativews.Frame{Type: nativews.TypeStderr, Data: d.GetStderr()}
		default:
			continue
		}
		if err := conn.send(f); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// wsOutcome is how a session's process stream ended.
type wsOutcome struct {
	id         string
	pid        uint32
	start      nativews.Frame
	end        *process.ProcessEvent_EndEvent // nil: no exit event
	clientGone bool
	timedOut   bool
	streamErr  error
}

// wsFinish tells the client how the process ended (killing it when the
// session ends before it does) and closes the websocket normally.
func (a *API) wsFinish(ctx context.Context, conn *wsConn, c *envdConn, o wsOutcome) {
	id, pid, start, end, clientGone := o.id, o.pid, o.start, o.end, o.clientGone
	switch {
	case end != nil:
		code := int(end.GetExitCode())
		f := nativews.Frame{Type: nativews.TypeExit, ExitCode: &code, Signal: endSignal(end), Error: endError(end)}
		_ = conn.send(f)
	case clientGone:
		if !start.Detached {
			if err := c.kill(ctx, pid); err != nil {
				a.log.Warn("exec ws: kill after disconnect", "sandbox_id", id, "pid", pid, "err", err)
			}
		}
	case o.timedOut:
		if err := c.kill(ctx, pid); err != nil {
			a.log.Warn("exec ws: kill after timeout", "sandbox_id", id, "pid", pid, "err", err)
		}
		code := -1
		_ = conn.send(nativews.Frame{Type: nativews.TypeExit, ExitCode: &code, Signal: "killed", TimedOut: true})
	default:
		if !start.Detached {
			_ = c.kill(ctx, pid)
		}
		conn.sendErr(streamErr(o.streamErr), true)
	}
	conn.closeWith(websocket.CloseNormalClosure, "")
}

func streamErr(err error) error {
	if err == nil {
		return errdefs.New(errdefs.ErrUnavailable, "envd ended the stream without an exit event")
	}
	return err
}

// wsRead applies the client's frames to the process, in order. It returns
// when the websocket fails or closes.
func (a *API) wsRead(ctx context.Context, conn *wsConn, c *envdConn, pid uint32, pty bool) {
	client := c.Process()
	sel := c.selector(pid)
	for {
		var f nativews.Frame
		_, raw, err := conn.ReadMessage()
		if err != nil {
			return
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			conn.sendErr(errdefs.New(errdefs.ErrInvalidArgument, "bad frame: "+err.Error()), false)
			continue
		}
		switch f.Type {
		case nativews.TypeStdin:
			in := &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: f.Data}}
			if pty {
				in.Input = &process.ProcessInput_Pty{Pty: f.Data}
			}
			req := connect.NewRequest(&process.SendInputRequest{Process: sel, Input: in})
			c.Auth(req.Header())
			_, err = client.SendInput(ctx, req)
		case nativews.TypeCloseStdin:
			req := connect.NewRequest(&process.CloseStdinRequest{Process: sel})
			c.Auth(req.Header())
			_, err = client.CloseStdin(ctx, req)
		case nativews.TypeResize:
			req := connect.NewRequest(&process.UpdateRequest{Process: sel,
				Pty: &process.PTY{Size: &process.PTY_Size{Cols: f.Cols, Rows: f.Rows}}})
			c.Auth(req.Header())
			_, err = client.Update(ctx, req)
		case nativews.TypeSignal:
			var sig process.Signal
			switch strings.TrimPrefix(strings.ToUpper(f.Signal), "SIG") {
			case "TERM":
				sig = process.Signal_SIGNAL_SIGTERM
			case "KILL":
				sig = process.Signal_SIGNAL_SIGKILL
			default:
				err = errdefs.New(errdefs.ErrInvalidArgument, "unsupported signal "+f.Signal+": SIGTERM or SIGKILL")
			}
			if err == nil {
				req := connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: sig})
				c.Auth(req.Header())
				_, err = client.SendSignal(ctx, req)
			}
		default:
			err = errdefs.New(errdefs.ErrInvalidArgument, "unknown frame type "+f.Type)
		}
		if err != nil && ctx.Err() == nil {
			conn.sendErr(err, false)
		}
	}
}
