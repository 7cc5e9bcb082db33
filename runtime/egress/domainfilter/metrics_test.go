package domainfilter

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gathered returns the filter's series as "name{label=value,...}" → value.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			k := mf.GetName() + "{" + strings.Join(ls, ",") + "}"
			if m.Counter != nil {
				out[k] = m.GetCounter().GetValue()
			} else {
				out[k] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	good := startTLSServer(t, "good")
	h := newHarness(t, map[string][]uint16{"allowed.test": nil}, func(c *Config) { c.Registerer = reg })
	live, lr := openTLS(t, h, good.port, "allowed.test")
	c := h.dial(at(80))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n")
	io.ReadAll(c)
	udpQuery(t, h.f.DNSPort(), query(t, 1, "allowed.test", true))
	udpQuery(t, h.f.DNSPort(), query(t, 2, "denied.test", true))
	udpQuery(t, h.f.DNSPort(), query(t, 3, "evil.test", true))
	want := map[string]float64{
		"sandboxd_egress_decisions_total{decision=allowed,kind=tcp,sandbox_id=sbx-1}": 1,
		"sandboxd_egress_decisions_total{decision=denied,kind=tcp,sandbox_id=sbx-1}":  1,
		"sandboxd_egress_decisions_total{decision=allowed,kind=dns,sandbox_id=sbx-1}": 1,
		"sandboxd_egress_decisions_total{decision=denied,kind=dns,sandbox_id=sbx-1}":  2,
		"sandboxd_egress_proxy_connections{}":                                         1,
	}
	got := gathered(t, reg)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if a, d := h.f.Counts("sbx-1"); a != 2 || d != 3 {
		t.Errorf("counts %d %d, want 2 3", a, d)
	}
	if err := ping(live, lr); err != nil {
		t.Fatal(err)
	}
	live.Close()
	deadline := time.Now().Add(5 * time.Second)
	for gathered(t, reg)["sandboxd_egress_proxy_connections{}"] != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the connection gauge stays up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.f.Forget("sbx-1")
	for k := range gathered(t, reg) {
		if strings.Contains(k, "sbx-1") {
			t.Errorf("%s still there after Forget", k)
		}
	}
	if a, d := h.f.Counts("sbx-1"); a+d != 0 {
		t.Errorf("counts %d %d after Forget", a, d)
	}
	// A second filter on the same registry is refused, the first's
	// Close unregisters.
	if _, err := Start(t.Context(), Config{Listen: loopback, Reachable: onlyLoopback, Sandboxes: &fakeSandboxes{}, Registerer: reg}); err == nil {
		t.Error("registered twice")
	}
	h.f.Close()
	f, err := Start(t.Context(), Config{Listen: loopback, Reachable: onlyLoopback, Sandboxes: &fakeSandboxes{}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// sink reads everything, then says how much.
func startSink(b *testing.B) uint16 {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				io.WriteString(c, strings.Repeat("x", int(n%7)))
			}()
		}
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func BenchmarkProxyThroughput(b *testing.B) {
	const size = 64 << 20
	chunk := make([]byte, 1<<20)
	port := startSink(b)
	send := func(b *testing.B, c *net.TCPConn, head string) {
		if _, err := io.WriteString(c, head); err != nil {
			b.Fatal(err)
		}
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				b.Fatal(err)
			}
		}
		c.CloseWrite()
		if _, err := io.ReadAll(c); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	head := "POST / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
	b.Run("direct", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			c, err := net.Dial("tcp4", at(port).String())
			if err != nil {
				b.Fatal(err)
			}
			send(b, c.(*net.TCPConn), head)
		}
	})
	b.Run("proxy", func(b *testing.B) {
		h := newHarness(b, map[string][]uint16{"allowed.test": nil})
		b.SetBytes(size)
		for b.Loop() {
			send(b, h.dial(at(port)), head)
		}
	})
}
