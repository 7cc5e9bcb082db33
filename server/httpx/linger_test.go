package httpx

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLingerListenerKeepsTheAnswer: a request net/http cannot parse gets
// its 400 and a close while the client is still sending the body. Like
// Python's http.client, the client sends the headers, then the body in
// parts, and reads the answer once it has sent all of it: on a socket
// closed outright, the part that arrives after the close is answered with
// a reset, and the client's next send fails ("connection reset by peer",
// as CI saw) before it ever reads the 400.
func TestLingerListenerKeepsTheAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(LingerListener(ln)) }()
	t.Cleanup(func() { _ = hs.Close() })

	part := bytes.Repeat([]byte("x"), 16<<10)
	for i := range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		req := "POST /sandboxes HTTP/1.1\r\nHost: x\r\nBad Header\r\nContent-Length: " + strconv.Itoa(3*len(part)) + "\r\n\r\n"
		_, err = c.Write([]byte(req))
		for j := 0; j < 3 && err == nil; j++ {
			time.Sleep(50 * time.Millisecond) // the server answers and closes meanwhile
			_, err = c.Write(part)
		}
		if err != nil {
			c.Close()
			t.Fatalf("try %d: sending the body: %v (the client never reads the 400)", i, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil {
			t.Fatalf("try %d: the 400 was lost: %v", i, err)
		}
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("try %d: status %d, want 400", i, resp.StatusCode)
		}
	}
}

// TestLingerConnCloseOnce: Close returns at once (the linger runs in the
// background), and a second Close says the connection is closed.
func TestLingerConnCloseOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ll := LingerListener(ln)
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	c, err := ll.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(t0); d > lingerFor/2 {
		t.Errorf("Close took %v: the linger must not block it", d)
	}
	if err := c.Close(); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("second Close = %v, want net.ErrClosed", err)
	}
	// The peer sees the half-close (EOF), then the full close.
	_ = peer.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := peer.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("peer read after Close = %d, %v; want EOF", n, err)
	}
}
