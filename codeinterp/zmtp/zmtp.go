// Package zmtp is a minimal ZeroMQ client: one TCP connection speaking
// ZMTP 3.0 with the NULL mechanism (rfc.zeromq.org/spec/23), as a DEALER
// or a SUB socket. It is what the code interpreter needs to talk to a
// Jupyter kernel on the sandbox's loopback (shell and iopub), and no more:
// no reconnects, no CURVE, no routing (Handshake makes the other end of a
// connection, ROUTER or PUB, for tests). Unlike a full ZeroMQ socket, a
// Conn reports its peer going away (Recv returns an error), which is how
// the code interpreter learns that a kernel died.
package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// SocketType is the ZeroMQ socket type a Conn announces.
type SocketType string

const (
	Dealer SocketType = "DEALER"
	Sub    SocketType = "SUB"
	Router SocketType = "ROUTER"
	Pub    SocketType = "PUB"
)

// peers are the socket types each of ours may talk to (ZMTP 3.0's
// compatibility table).
var peers = map[SocketType][]string{
	Dealer: {"ROUTER", "DEALER", "REP"},
	Sub:    {"PUB", "XPUB"},
	Router: {"DEALER", "REQ", "ROUTER"},
	Pub:    {"SUB", "XSUB"},
}

// MaxFrame bounds a frame's size: a corrupt length must not make the
// reader allocate without limit. A kernel's 50 MB print is one frame.
const MaxFrame = 1 << 30

// Frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// ErrProtocol is a peer that does not speak ZMTP 3 with NULL as expected.
var ErrProtocol = errors.New("zmtp: protocol error")

// Conn is one ZMTP connection. Send and Recv may run concurrently with
// each other; each is for one goroutine at a time.
type Conn struct {
	c net.Conn
	r *bufio.Reader

	wmu sync.Mutex
	w   *bufio.Writer
}

// Dial connects to addr (host:port over TCP) as a socket of type typ and
// does the handshake.
func Dial(ctx context.Context, addr string, typ SocketType) (*Conn, error) {
	if peers[typ] == nil {
		return nil, fmt.Errorf("zmtp: socket type %s not supported", typ)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return Handshake(ctx, nc, typ)
}

// Handshake makes nc, a new connection to or from a ZeroMQ peer, a Conn of
// type typ. ctx bounds the handshake: a peer that says nothing must not
// hold the caller. nc is closed on failure.
func Handshake(ctx context.Context, nc net.Conn, typ SocketType) (*Conn, error) {
	if peers[typ] == nil {
		_ = nc.Close()
		return nil, fmt.Errorf("zmtp: socket type %s not supported", typ)
	}
	c := &Conn{c: nc, r: bufio.NewReaderSize(nc, 64<<10), w: bufio.NewWriterSize(nc, 64<<10)}
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	err := c.handshake(typ)
	if !stop() {
		err = errors.Join(ctx.Err(), err)
	}
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("zmtp: handshake with %s: %w", nc.RemoteAddr(), err)
	}
	return c, nil
}

// greeting is ZMTP 3.0's: signature, version 3.0, mechanism NULL, not as
// a server, filler.
func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}

func (c *Conn) handshake(typ SocketType) error {
	if _, err := c.w.Write(greeting()); err != nil {
		return err
	}
	if err := c.writeFrame(flagCommand, readyCommand(typ)); err != nil {
		return err
	}
	if err := c.w.Flush(); err != nil {
		return err
	}
	var g [64]byte
	if _, err := io.ReadFull(c.r, g[:]); err != nil {
		return err
	}
	if g[0] != 0xff || g[9] != 0x7f {
		return fmt.Errorf("%w: not a ZMTP greeting", ErrProtocol)
	}
	if g[10] < 3 {
		return fmt.Errorf("%w: ZMTP %d.%d, not 3", ErrProtocol, g[10], g[11])
	}
	if mech := string(bytes.TrimRight(g[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("%w: mechanism %q, not NULL", ErrProtocol, mech)
	}
	flags, body, err := c.readFrame()
	if err != nil {
		return err
	}
	if flags&flagCommand == 0 {
		return fmt.Errorf("%w: a message before READY", ErrProtocol)
	}
	name, props, err := parseCommand(body)
	if err != nil {
		return err
	}
	switch name {
	case "READY":
	case "ERROR":
		return fmt.Errorf("%w: the peer refused: %s", ErrProtocol, props["reason"])
	default:
		return fmt.Errorf("%w: command %s before READY", ErrProtocol, name)
	}
	peer := props["Socket-Type"]
	for _, ok := range peers[typ] {
		if peer == ok {
			return nil
		}
	}
	return fmt.Errorf("%w: a %s cannot talk to a %s", ErrProtocol, typ, peer)
}

// readyCommand is the NULL mechanism's READY with our socket type.
func readyCommand(typ SocketType) []byte {
	var b bytes.Buffer
	b.WriteByte(5)
	b.WriteString("READY")
	writeProp(&b, "Socket-Type", string(typ))
	return b.Bytes()
}

func writeProp(b *bytes.Buffer, name, value string) {
	b.WriteByte(byte(len(name)))
	b.WriteString(name)
	_ = binary.Write(b, binary.BigEndian, uint32(len(value)))
	b.WriteString(value)
}

// parseCommand splits a command frame into its name and, for READY, its
// properties; ERROR's reason is the property "reason".
func parseCommand(body []byte) (string, map[string]string, error) {
	if len(body) < 1 || len(body) < 1+int(body[0]) {
		return "", nil, fmt.Errorf("%w: short command", ErrProtocol)
	}
	name := string(body[1 : 1+body[0]])
	rest := body[1+body[0]:]
	props := map[string]string{}
	if name == "ERROR" {
		if len(rest) > 0 && len(rest) >= 1+int(rest[0]) {
			props["reason"] = string(rest[1 : 1+rest[0]])
		}
		return name, props, nil
	}
	for len(rest) > 0 {
		n := int(rest[0])
		if len(rest) < 1+n+4 {
			return "", nil, fmt.Errorf("%w: short property", ErrProtocol)
		}
		key := string(rest[1 : 1+n])
		vlen := binary.BigEndian.Uint32(rest[1+n:])
		rest = rest[1+n+4:]
		if uint64(len(rest)) < uint64(vlen) {
			return "", nil, fmt.Errorf("%w: short property value", ErrProtocol)
		}
		props[key] = string(rest[:vlen])
		rest = rest[vlen:]
	}
	return name, props, nil
}

func (c *Conn) writeFrame(flags byte, body []byte) error {
	var hdr [9]byte
	hdr[0] = flags
	n := 2
	if len(body) > 255 {
		hdr[0] |= flagLong
		binary.BigEndian.PutUint64(hdr[1:], uint64(len(body)))
		n = 9
	} else {
		hdr[1] = byte(len(body))
	}
	if _, err := c.w.Write(hdr[:n]); err != nil {
		return err
	}
	_, err := c.w.Write(body)
	return err
}

func (c *Conn) readFrame() (byte, []byte, error) {
	flags, err := c.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(c.r, b[:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := c.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		size = uint64(b)
	}
	if size > MaxFrame {
		return 0, nil, fmt.Errorf("%w: a frame of %d bytes", ErrProtocol, size)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

// Send sends one message of frames, in one write.
func (c *Conn) Send(frames ...[]byte) error {
	if len(frames) == 0 {
		return fmt.Errorf("zmtp: a message needs a frame")
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		if err := c.writeFrame(flags, f); err != nil {
			return err
		}
	}
	return c.w.Flush()
}

// Subscribe subscribes a SUB connection to messages starting with prefix
// ("" for all): in ZMTP 3.0, a message of 1 and the prefix.
func (c *Conn) Subscribe(prefix string) error {
	return c.Send(append([]byte{1}, prefix...))
}

// Recv returns the next message's frames. Commands between messages
// (ZMTP 3.1's heartbeats, which a 3.0 peer does not send) are skipped.
// An error means the connection is over: io.EOF when the peer closed it.
func (c *Conn) Recv() ([][]byte, error) {
	var frames [][]byte
	for {
		flags, body, err := c.readFrame()
		if err != nil {
			return nil, err
		}
		if flags&flagCommand != 0 {
			if len(frames) > 0 {
				return nil, fmt.Errorf("%w: a command inside a message", ErrProtocol)
			}
			continue
		}
		frames = append(frames, body)
		if flags&flagMore == 0 {
			return frames, nil
		}
	}
}

// Close closes the connection; a Recv under way returns an error.
func (c *Conn) Close() error {
	return c.c.Close()
}
