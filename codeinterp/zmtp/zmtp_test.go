package zmtp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// listen accepts one connection on loopback and hands it to serve.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		serve(nc)
	}()
	return ln.Addr().String()
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A DEALER and a ROUTER, a SUB and a PUB exchange messages of short, long
// and empty frames both ways; the SUB's subscription arrives as ZMTP 3.0's
// message of 1 and the prefix.
func TestRoundTrip(t *testing.T) {
	long := bytes.Repeat([]byte("x"), 1<<20)
	msg := [][]byte{[]byte("<IDS|MSG>"), {}, []byte("short"), bytes.Repeat([]byte("y"), 256), long}
	for _, tc := range []struct{ client, server SocketType }{{Dealer, Router}, {Sub, Pub}} {
		t.Run(string(tc.client), func(t *testing.T) {
			got := make(chan [][]byte, 2)
			addr := listen(t, func(nc net.Conn) {
				c, err := Handshake(context.Background(), nc, tc.server)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				for range 2 {
					m, err := c.Recv()
					if err != nil {
						t.Error(err)
						return
					}
					got <- m
				}
				if err := c.Send(msg...); err != nil {
					t.Error(err)
				}
			})
			c, err := Dial(ctxT(t), addr, tc.client)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Subscribe("kernel."); err != nil {
				t.Fatal(err)
			}
			if err := c.Send(msg...); err != nil {
				t.Fatal(err)
			}
			if m := <-got; len(m) != 1 || string(m[0]) != "\x01kernel." {
				t.Errorf("subscription %q", m)
			}
			for _, m := range [][][]byte{<-got, mustRecv(t, c)} {
				if len(m) != len(msg) {
					t.Fatalf("%d frames, want %d", len(m), len(msg))
				}
				for i := range m {
					if !bytes.Equal(m[i], msg[i]) {
						t.Errorf("frame %d: %d bytes, want %d", i, len(m[i]), len(msg[i]))
					}
				}
			}
			// The peer closed after its message.
			if _, err := c.Recv(); !errors.Is(err, io.EOF) {
				t.Errorf("Recv after the peer closed: %v, want EOF", err)
			}
		})
	}
}

func mustRecv(t *testing.T, c *Conn) [][]byte {
	t.Helper()
	m, err := c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Peers that are not what a DEALER can talk to fail the handshake with a
// reason, and a silent one fails it when ctx ends.
func TestHandshakeRefused(t *testing.T) {
	curve := greeting()
	copy(curve[12:32], "CURVE\x00")
	errCmd := []byte{0x04, 17, 5, 'E', 'R', 'R', 'O', 'R', 10, 'g', 'o', ' ', 'a', 'w', 'a', 'y', '!', '!', '!'}
	for _, tc := range []struct {
		name  string
		serve func(net.Conn)
		want  string
	}{
		{"curve", func(nc net.Conn) { nc.Write(curve); io.Copy(io.Discard, nc) }, `mechanism "CURVE"`},
		{"zmtp2", func(nc net.Conn) { g := greeting(); g[10] = 2; nc.Write(g); io.Copy(io.Discard, nc) }, "ZMTP 2.0"},
		{"not zmtp", func(nc net.Conn) { nc.Write(bytes.Repeat([]byte("HTTP/1.1 "), 8)); nc.Close() }, "not a ZMTP greeting"},
		{"pub", func(nc net.Conn) { Handshake(context.Background(), nc, Pub) }, "a DEALER cannot talk to a PUB"},
		{"error", func(nc net.Conn) { nc.Write(append(greeting(), errCmd...)); io.Copy(io.Discard, nc) }, "the peer refused: go away!!!"},
		{"silent", func(nc net.Conn) { io.Copy(io.Discard, nc) }, "deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := listen(t, tc.serve)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := Dial(ctx, addr, Dealer)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Dial: %v, want %q", err, tc.want)
			}
		})
	}
}
