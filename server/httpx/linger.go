package httpx

import (
	"io"
	"net"
	"sync"
	"time"
)

// Lingering close: how long, and how much, a closed connection still reads
// of what its peer sends.
const (
	lingerFor = 500 * time.Millisecond
	lingerMax = 256 << 10
)

// LingerListener wraps ln so that closing one of its TCP connections
// half-closes it and then, in the background, reads and drops what the
// peer still sends (until its FIN, lingerFor or lingerMax bytes) before it
// closes the socket.
//
// A socket closed with unread input answers with a reset, and the reset
// can overtake the answer already written: the peer then sees "connection
// reset by peer" instead of it. net/http closes so after the 400 it writes
// for a request it cannot parse, with the request's body unread (its
// lingering close covers only some of its error paths); CI saw the client
// lose those 400s. This is the classic lingering close of HTTP servers,
// for every connection the listener accepted, hijacked ones included.
func LingerListener(ln net.Listener) net.Listener { return lingerListener{ln} }

type lingerListener struct{ net.Listener }

func (l lingerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &lingerConn{TCPConn: tc}, nil
	}
	return c, nil
}

// lingerConn is a *net.TCPConn (every method of it, for net/http's and
// crypto/tls's type checks) whose Close lingers.
type lingerConn struct {
	*net.TCPConn
	once sync.Once
}

func (c *lingerConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		if err = c.CloseWrite(); err != nil {
			err = c.TCPConn.Close()
			return
		}
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(lingerFor))
			_, _ = io.CopyN(io.Discard, c.TCPConn, lingerMax)
			_ = c.TCPConn.Close()
		}()
	})
	return err
}
