package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	if b.cfg.NetSubnet != "" {
		extra = append(extra, "--egress-subnet="+b.cfg.NetSubnet)
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
// through the name filter's proxy and by address direct, alternated. The
// script times the transfer itself, from the connect (and, by name, the
// sandbox's DNS lookup) to the last byte, so that python's start and the
// command's round trip, which both sides pay alike, do not blur the ratio;
// the ratio by the wall time of commands.run is kept beside it. The CPU
// time per MB of the client (python3), the server (fakeinet) and the proxy
// (sandboxd) says where the proxied path's extra cost goes.
func downloadRows(ctx context.Context, b *Bench, h *Harness, inet *fakeInet) error {
	const size = 256 << 20
	proxied, _ := json.Marshal(map[string]any{"templateID": "base", "timeout": 3600,
		"network": map[string]any{"allowOut": []string{"allowed.sbx.test"}, "denyOut": []string{"0.0.0.0/0"}}})
	type side struct {
		body                 []byte
		addr                 string
		rate, wall           []float64 // MB/s
		proxyMs, srvMs, clMs []float64 // CPU ms per MB
	}
	via := &side{body: proxied, addr: "allowed.sbx.test"}
	direct := &side{body: createBody(true), addr: inet.one}
	var ratios []float64 // proxied ÷ direct, pair by pair
	errs := 0
	for i := 0; i < b.iters(1, 3, 5) && ctx.Err() == nil; i++ {
		pair := []*side{via, direct}
		if i%2 == 1 { // alternate which goes first
			pair[0], pair[1] = pair[1], pair[0]
		}
		got := map[*side]float64{}
		for _, c := range pair {
			sb, err := h.createBody(ctx, h.key, c.body)
			if err != nil {
				errs++
				b.logf("network download: %v", err)
				continue
			}
			t := h.proxyTarget(sb)
			p0, s0 := cpuTime(h.sandboxd.Process.Pid), cpuTime(inet.cmd.Process.Pid)
			t0 := time.Now()
			res, err := t.run(ctx, "/usr/bin/python3", "-c", downloadScript, "allowed.sbx.test", c.addr, fmt.Sprint(size))
			took := time.Since(t0)
			p1, s1 := cpuTime(h.sandboxd.Process.Pid), cpuTime(inet.cmd.Process.Pid)
			t.close()
			_ = h.destroy(context.WithoutCancel(ctx), sb.ID)
			var secs, clientCPU float64
			if err == nil {
				if _, err = fmt.Sscan(string(res.head), &secs, &clientCPU); err == nil && secs <= 0 {
					err = fmt.Errorf("bad time %q", res.head)
				}
			}
			if err != nil {
				errs++
				b.logf("network download via %s: %v", c.addr, err)
				continue
			}
			mb := float64(size) / 1e6
			c.rate = append(c.rate, mb/secs)
			c.wall = append(c.wall, mb/took.Seconds())
			c.proxyMs = append(c.proxyMs, (p1-p0).Seconds()*1e3/mb)
			c.srvMs = append(c.srvMs, (s1-s0).Seconds()*1e3/mb)
			c.clMs = append(c.clMs, clientCPU*1e3/mb)
			got[c] = mb / secs
		}
		if len(got) == 2 {
			ratios = append(ratios, got[via]/got[direct])
		}
	}
	d := dist("network", "256 MiB HTTPS download in a sandbox, direct (no policy)", "MB/s", direct.rate, 0)
	p := dist("network", "the same through the egress name filter's proxy (allowOut: the name, deny-all)", "MB/s", via.rate, errs)
	p.Goal = "≥ 90% of direct"
	if d.P50 != nil && p.P50 != nil {
		p.Compare = fmt.Sprintf("p50 %.0f%% of direct; median of the %d interleaved pairs' ratios %.0f%%",
			100**p.P50 / *d.P50, len(ratios), 100*median(ratios))
		if wd, wp := median(direct.wall), median(via.wall); wd > 0 {
			p.Compare += fmt.Sprintf("; by the wall time of commands.run %.0f%%", 100*wp/wd)
		}
	}
	p.Note = "timed in the sandbox's python3 from the connect (DNS lookup and TLS handshake included) to the last byte; the fake internet is a veth on this host"
	d.Note = fmt.Sprintf("CPU per MB, medians, direct / proxied: client (python3) %.2f / %.2f ms, server (fakeinet) %.2f / %.2f ms, sandboxd (the proxy) %.2f / %.2f ms",
		median(direct.clMs), median(via.clMs), median(direct.srvMs), median(via.srvMs), median(direct.proxyMs), median(via.proxyMs))
	b.add(d, p)
	return nil
}

// cpuTime is the user and system CPU time pid has used so far (0 if it
// cannot be read), from /proc/<pid>/stat in clock ticks of 10 ms.
func cpuTime(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses and
	// may hold spaces: utime and stime are the 12th and 13th of them.
	_, rest, _ := strings.Cut(string(raw), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// downloadScript fetches /bytes/N over TLS with SNI argv[1] from argv[2]
// (a name or an address), fails unless it got them all, and prints the
// seconds from the connect to the last byte and the CPU seconds it used.
const downloadScript = `
import resource, socket, ssl, sys, time
host, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
t0 = time.perf_counter()
s = ctx.wrap_socket(socket.create_connection((addr, 443), timeout=10), server_hostname=host)
s.sendall(("GET /bytes/%d HTTP/1.0\r\nHost: %s\r\n\r\n" % (n, host)).encode())
got = 0
while True:
    d = s.recv(1 << 20)
    if not d:
        break
    got += len(d)
took = time.perf_counter() - t0
if got <= n:
    sys.exit("got %d bytes" % got)
r = resource.getrusage(resource.RUSAGE_SELF)
print("%.6f %.6f" % (took, r.ru_utime + r.ru_stime))
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
