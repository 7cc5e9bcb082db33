package relay

import (
	"crypto/tls"
	"net"
	"testing"
)

// The relay's cost over a direct connection, on loopback (go test -bench
// . ./incus/relay/): BenchmarkDial and BenchmarkDialDirect open a new
// connection to an echo server and exchange one byte, through the relay
// (TLS 1.3, the session resumed) or not; BenchmarkRoundTrip and
// BenchmarkRoundTripDirect send 64 bytes back and forth over a kept
// connection, which is what sandboxd's proxy does with the keep-alive
// connections it holds to envd.

func BenchmarkDial(b *testing.B) {
	r := startRelay(b, nil)
	tg := listenTarget(b, "127.0.0.2", echo)
	d := r.dialer(b)
	resumed := 0
	for b.Loop() {
		c, err := d.Dial(b.Context(), r.addr, tg.addr)
		if err != nil {
			b.Fatal(err)
		}
		roundTrip(b, c, "x")
		if c.(*tls.Conn).ConnectionState().DidResume {
			resumed++
		}
		c.Close()
	}
	b.ReportMetric(float64(resumed)/float64(b.N), "resumed/op")
}

func BenchmarkDialDirect(b *testing.B) {
	tg := listenTarget(b, "127.0.0.2", echo)
	for b.Loop() {
		c, err := net.Dial("tcp", tg.addr.String())
		if err != nil {
			b.Fatal(err)
		}
		roundTrip(b, c, "x")
		c.Close()
	}
}

const msg64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func BenchmarkRoundTrip(b *testing.B) {
	r := startRelay(b, nil)
	tg := listenTarget(b, "127.0.0.2", echo)
	c, err := r.dialer(b).Dial(b.Context(), r.addr, tg.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for b.Loop() {
		roundTrip(b, c, msg64)
	}
}

func BenchmarkRoundTripDirect(b *testing.B) {
	tg := listenTarget(b, "127.0.0.2", echo)
	c, err := net.Dial("tcp", tg.addr.String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for b.Loop() {
		roundTrip(b, c, msg64)
	}
}
