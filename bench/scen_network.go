package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// networkScenario: what an egress policy costs. Warm claims with a
// 20-rule policy (10 addresses, 10 names, deny-all) and without one,
// interleaved, from a full pool: the policy is one nft transaction and,
// for its names, the name filter's redirect. Then a TLS download from the
// fake internet (compat-tests/fakeinet), through the name filter's proxy
// (a policy allowing the name) and direct (no policy), alternated.
func networkScenario(ctx context.Context, b *Bench) error {
	if !b.flags["pool"] || !b.flags["egress-dns"] {
		b.add(unavailable("network", "warm claim with a 20-rule egress policy", "egress policies are not implemented in this build"))
		return nil
	}
	const size = 5
	var extra []string
	inet, inetErr := startFakeInet(ctx, b.cfg.BinDir)
	if inetErr != nil {
		b.logf("network: no fake internet, so no download rows: %v", inetErr)
	} else {
		defer inet.stop()
		extra = append(extra, "--egress-dns="+inet.one)
	}
	h, err := b.startPool(ctx, size, extra...)
	if err != nil {
		return err
	}
	defer h.Close()
	var allow []string
	for i := range 10 {
		allow = append(allow, fmt.Sprintf("192.52.193.%d", 16+i), fmt.Sprintf("api%d.example.com", i))
	}
	withPolicy, _ := json.Marshal(map[string]any{"templateID": "base", "timeout": 3600,
		"network": map[string]any{"allowOut": allow, "denyOut": []string{"0.0.0.0/0"}}})
	plain := createBody(true)

	n := b.iters(1, 2, 20)
	var none, pol []time.Duration
	errs := 0
	b.loop(ctx, n, func(i int) {
		runs := []struct {
			body []byte
			into *[]time.Duration
		}{{plain, &none}, {withPolicy, &pol}}
		if i%2 == 1 { // alternate which goes first
			runs[0], runs[1] = runs[1], runs[0]
		}
		for _, c := range runs {
			_ = h.poolReady(ctx, size, 10*time.Second)
			t0 := time.Now()
			sb, err := h.createBody(ctx, h.key, c.body)
			took := time.Since(t0)
			if err != nil {
				errs++
				b.logf("network: %v", err)
				continue
			}
			_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
			*c.into = append(*c.into, took)
		}
	})
	base := durDist("network", fmt.Sprintf("warm claim → 201, no egress policy (pool of %d)", size), none, 0)
	r := durDist("network", "warm claim → 201 with a 20-rule egress policy (10 addresses, 10 names, deny-all)", pol, errs)
	r.Goal = "≤ 2 ms over no policy (p50)"
	if base.P50 != nil && r.P50 != nil {
		r.Compare = fmt.Sprintf("p50 +%.1f ms over no policy, interleaved", *r.P50-*base.P50)
	}
	b.add(base, r)
	if inet == nil {
		b.add(unavailable("network", "TLS download through the egress proxy vs direct", "no fake internet (bin/fakeinet): "+inetErr.Error()))
		return nil
	}
	return downloadRows(ctx, b, h, inet)
}

// downloadRows times a 256 MiB HTTPS download in a sandbox, by name
// through the name filter's proxy and by address direct, alternated.
func downloadRows(ctx context.Context, b *Bench, h *Harness, inet *fakeInet) error {
	const size = 256 << 20
	proxied, _ := json.Marshal(map[string]any{"templateID": "base", "timeout": 3600,
		"network": map[string]any{"allowOut": []string{"allowed.sbx.test"}, "denyOut": []string{"0.0.0.0/0"}}})
	var via, direct []float64 // MB/s
	errs := 0
	for i := 0; i < b.iters(1, 3, 5) && ctx.Err() == nil; i++ {
		for _, c := range []struct {
			body []byte
			addr string
			into *[]float64
		}{{proxied, "allowed.sbx.test", &via}, {createBody(true), inet.one, &direct}} {
			sb, err := h.createBody(ctx, h.key, c.body)
			if err != nil {
				errs++
				b.logf("network download: %v", err)
				continue
			}
			t := h.proxyTarget(sb)
			t0 := time.Now()
			_, err = t.run(ctx, "/usr/bin/python3", "-c", downloadScript, "allowed.sbx.test", c.addr, fmt.Sprint(size))
			took := time.Since(t0)
			t.close()
			_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
			if err != nil {
				errs++
				b.logf("network download via %s: %v", c.addr, err)
				continue
			}
			*c.into = append(*c.into, float64(size)/1e6/took.Seconds())
		}
	}
	d := dist("network", "256 MiB HTTPS download in a sandbox, direct (no policy)", "MB/s", direct, 0)
	p := dist("network", "the same through the egress name filter's proxy (allowOut: the name, deny-all)", "MB/s", via, errs)
	p.Goal = "≥ 90% of direct"
	if d.P50 != nil && p.P50 != nil {
		p.Compare = fmt.Sprintf("p50 %.0f%% of direct", 100**p.P50 / *d.P50)
	}
	p.Note = "wall time of commands.run, python3's TLS included; the fake internet is a veth on this host"
	b.add(d, p)
	return nil
}

// downloadScript fetches /bytes/N over TLS with SNI argv[1] from argv[2]
// (a name or an address) and fails unless it got them all.
const downloadScript = `
import socket, ssl, sys
host, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
s = ctx.wrap_socket(socket.create_connection((addr, 443), timeout=10), server_hostname=host)
s.sendall(("GET /bytes/%d HTTP/1.0\r\nHost: %s\r\n\r\n" % (n, host)).encode())
got = 0
while True:
    d = s.recv(1 << 20)
    if not d:
        break
    got += len(d)
sys.exit(0 if got > n else "got %d bytes" % got)
`

// fakeInet is a running compat-tests/fakeinet.
type fakeInet struct {
	cmd *exec.Cmd
	one string
}

func startFakeInet(ctx context.Context, binDir string) (*fakeInet, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "fakeinet"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	f := &fakeInet{cmd: cmd}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "COMPAT_INET_ONE="); ok {
			f.one = v
		}
		if line == "ready" && f.one != "" {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return f, nil
		}
	}
	f.stop()
	return nil, errors.New("fakeinet ended before it was ready")
}

func (f *fakeInet) stop() {
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	_ = f.cmd.Wait()
}
