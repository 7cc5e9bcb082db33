// Package nativews is the native API's websocket frame protocol
// (docs/native-api.md), shared by the server (server/native/ws.go) and the
// CLI client (cmd/sandboxd). Every frame is a JSON text message with a
// "type"; byte payloads are base64 in "data".
//
//	client -> server: start (first, once), stdin, close_stdin, resize, signal
//	server -> client: started, stdout, stderr, exit (last), error
package nativews

// Frame types.
const (
	// client -> server
	TypeStart      = "start"
	TypeStdin      = "stdin"
	TypeCloseStdin = "close_stdin"
	TypeResize     = "resize"
	TypeSignal     = "signal"

	// server -> client
	TypeStarted = "started"
	TypeStdout  = "stdout"
	TypeStderr  = "stderr"
	TypeExit    = "exit"
	TypeError   = "error"
)

// Frame is one websocket message in either direction; which fields are set
// depends on Type.
type Frame struct {
	Type string `json:"type"`

	// start
	Cmd      string            `json:"cmd,omitempty"`
	Argv     []string          `json:"argv,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	User     string            `json:"user,omitempty"`
	PTY      *Size             `json:"pty,omitempty"`
	Stdin    *bool             `json:"stdin,omitempty"` // default true
	Detached bool              `json:"detached,omitempty"`
	Timeout  int               `json:"timeout,omitempty"` // seconds, 0 = none

	// stdin, stdout, stderr
	Data []byte `json:"data,omitempty"`
	// resize
	Cols uint32 `json:"cols,omitempty"`
	Rows uint32 `json:"rows,omitempty"`
	// signal (SIGTERM or SIGKILL); exit: the signal that ended the process
	Signal string `json:"signal,omitempty"`

	// started
	PID uint32 `json:"pid,omitempty"`
	// exit; error uses Error, Code and Fatal
	ExitCode *int   `json:"exit_code,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty"`
	Code     string `json:"code,omitempty"`
	Fatal    bool   `json:"fatal,omitempty"`
}

// Size is a terminal size, in the start frame's "pty".
type Size struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}
