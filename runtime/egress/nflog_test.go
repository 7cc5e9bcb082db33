package egress

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"log/slog"

	"github.com/sandboxd/sandboxd/runtime/egress/egresstest"
	"github.com/sandboxd/sandboxd/runtime/egress/policy"
)

// logLines keeps slog's JSON lines.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// audits are the audit lines' attributes.
func (l *logLines) audits(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		var m map[string]any
		if line == "" {
			continue
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["audit"] == true {
			out = append(out, m)
		}
	}
	return out
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// metric is the value of counter name for sandbox id in reg (-1: none).
func metric(t *testing.T, reg *prometheus.Registry, name, id string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "sandbox_id" && l.GetValue() == id {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// TestPolicyAudit: a refusal by address rule writes one audit line per
// (sandbox, destination, port) and counts connection attempts, not the
// SYN retries of each; an allowed destination writes none and counts as
// allowed. A second reader of the same group (another process on the
// table) goes on without it.
func TestPolicyAudit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for namespaces and nftables")
	}
	if err := HaveNft(); err != nil {
		t.Skip(err)
	}
	// Slot 2: the package's tests run one after another, and no other
	// package's use it.
	inet := egresstest.NewInet(t, "pl", 2)
	server := netip.MustParseAddrPort(inet.Server)
	refused := netip.AddrPortFrom(server.Addr(), 9) // nothing needs to listen: the host refuses
	if server.Port() == refused.Port() {
		t.Skip("the server got port 9")
	}

	pid := netnsProcess(t)
	subnet := netip.MustParsePrefix("10.139.242.0/24")
	e := testEgress(t, subnet, nil, nil)
	var logs logLines
	reg := prometheus.NewRegistry()
	e.Observe(slog.New(slog.NewJSONHandler(&logs, nil)), reg)
	t.Cleanup(func() { _ = e.Close() })
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.139.242.2")
	info, err := e.CreateVethIn("egress-audit-"+strconv.Itoa(os.Getpid()), ip, pid)
	if err != nil {
		t.Fatalf("CreateVethIn = %v", err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", info.HostIf).Run() })
	// The sandbox ignores the host's ICMP refusals, so that each connect
	// retries its SYN as against a host that drops; the dropped ICMPs are
	// counted.
	nft := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-n", "nft", "-f", "-")
	nft.Stdin = strings.NewReader("add table ip audit\nadd chain ip audit in { type filter hook input priority 0; }\nadd rule ip audit in ip protocol icmp counter drop\n")
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft in the sandbox's namespace: %v: %s", err, out)
	}

	const id = "sbx-audit"
	p, err := policy.Parse([]string{server.String()}, []string{policy.AllTraffic})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetPolicy(context.Background(), id, ip, p); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	r := e.audit
	e.mu.Unlock()
	if r == nil {
		t.Fatalf("no NFLOG reader on group %d:\n%s", e.logGroup(), logs.String())
	}

	if got, err := getIn(pid, inet.Server); err != nil || !strings.HasPrefix(got, egresstest.Reply) {
		t.Fatalf("GET %s (allowed) = %q, %v", inet.Server, got, err)
	}
	// Two connection attempts at once, each with a SYN retry or two
	// (TCP_SYNCNT 1: the kernel's last retry is due when the attempt
	// times out): at least four refused packets, a count set by the
	// kernel rather than by a clock.
	const attempts, syns = 2, 2
	var wg sync.WaitGroup
	for range attempts {
		wg.Go(func() {
			d := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				if err := c.Control(func(fd uintptr) {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_SYNCNT, syns-1)
				}); err != nil {
					return err
				}
				return serr
			}}
			if c, err := dialInWith(pid, refused.String(), d); err == nil {
				c.Close()
				t.Errorf("connected to %s, which the policy refuses", refused)
			}
		})
	}
	wg.Wait()
	denied, _, err := e.addressCounts()
	if err != nil {
		t.Fatal(err)
	}
	if denied[ip] < attempts*syns {
		t.Fatalf("the kernel refused %d packets, want %d or more (%d attempts of %d SYNs or more)", denied[ip], attempts*syns, attempts, syns)
	}
	// The log is asynchronous: wait until the reader has read them all.
	for deadline := time.Now().Add(30 * time.Second); r.read.Load() < denied[ip]; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reader read %d refused packets of %d", r.read.Load(), denied[ip])
		}
	}

	a := logs.audits(t)
	if len(a) != 1 {
		t.Fatalf("%d audit lines, want 1:\n%s", len(a), logs.String())
	}
	for k, want := range map[string]any{"sandbox_id": id, "dst": refused.String(), "proto": "tcp", "decision": "denied", "msg": "egress denied"} {
		if a[0][k] != want {
			t.Errorf("audit line's %s = %v, want %v: %v", k, a[0][k], want, a[0])
		}
	}
	if got := metric(t, reg, "sandboxd_egress_address_denied_connections_total", id); got != attempts {
		t.Errorf("denied connections = %v, want %d", got, attempts)
	}
	if got := metric(t, reg, "sandboxd_egress_address_denied_packets_total", id); got != float64(denied[ip]) {
		t.Errorf("denied packets = %v, want %d", got, denied[ip])
	}
	if got := metric(t, reg, "sandboxd_egress_address_allowed_connections_total", id); got < 1 {
		t.Errorf("allowed connections = %v, want 1 or more", got)
	}

	// Another process on the same table: the group is taken, and it goes
	// on without a reader.
	other, err := New(subnet)
	if err != nil {
		t.Fatal(err)
	}
	var otherLogs logLines
	other.table, other.log = e.table, slog.New(slog.NewJSONHandler(&otherLogs, nil))
	other.mu.Lock()
	other.startAudit()
	got := other.audit
	other.mu.Unlock()
	if got != nil {
		_ = other.Close()
		t.Errorf("a second reader bound group %d", e.logGroup())
	} else if !strings.Contains(otherLogs.String(), "no audit lines") {
		t.Errorf("the second reader's failure was not logged: %s", otherLogs.String())
	}
	// Its policies go without the log (a kernel without nfnetlink_log
	// refuses rules that log to a group).
	ip3 := netip.MustParseAddr("10.139.242.3")
	other.mu.Lock()
	err = other.commit(func(b *nlBatch) error { return b.policy(ip3, p, nil, false) })
	other.mu.Unlock()
	if err != nil {
		t.Fatalf("a policy without the log: %v", err)
	}
	out, err := exec.Command("nft", "list", "chain", "inet", e.table, "p_"+objSuffix(ip3)).CombinedOutput()
	if err != nil || strings.Contains(string(out), "log") || !strings.Contains(string(out), "reject") {
		t.Errorf("a policy written without a reader: %v\n%s", err, out)
	}
	other.mu.Lock()
	_ = other.commit(func(b *nlBatch) error { return b.clear(ip3) })
	other.dropConn()
	other.mu.Unlock()

	if err := e.ClearPolicy(ip); err != nil {
		t.Fatal(err)
	}
	if got := metric(t, reg, "sandboxd_egress_address_denied_connections_total", id); got != -1 {
		t.Errorf("a cleared policy's denied connections = %v, want none", got)
	}
}
