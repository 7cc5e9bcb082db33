package egress

import (
	"crypto/rand"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestWriteRcvBuf(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		def            int
		wantErr        bool
	}{
		{"raised", "4096\t131072\t6291456\n", "4096 4194304 6291456", 4 << 20, false},
		{"capped by the maximum", "4096 131072 1048576", "4096 1048576 1048576", 4 << 20, false},
		{"never lowered", "4096 8388608 33554432", "4096 8388608 33554432", 4 << 20, false},
		{"not three numbers", "4096 131072", "4096 131072", 4 << 20, true},
		{"not numbers", "a b c", "a b c", 4 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tcp_rmem")
			if err := os.WriteFile(path, []byte(tc.in), 0o644); err != nil {
				t.Fatal(err)
			}
			err := writeRcvBuf(path, tc.def)
			if (err != nil) != tc.wantErr {
				t.Fatalf("writeRcvBuf = %v; want an error: %v", err, tc.wantErr)
			}
			got, _ := os.ReadFile(path)
			if strings.Join(strings.Fields(string(got)), " ") != tc.want {
				t.Errorf("file = %q; want %q", got, tc.want)
			}
		})
	}
}

// TestSandboxRcvBuf checks that a sandbox's network namespace gets the
// receive buffer default, and that the host's own stays as it was.
func TestSandboxRcvBuf(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make veth pairs")
	}
	hostBefore, err := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem")
	if err != nil {
		t.Skipf("no tcp_rmem: %v", err)
	}
	e, err := New(netip.MustParsePrefix("10.189.250.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	// Not the pid: pids come round again, and a run killed before its
	// cleanup leaves its links.
	key := "egress-test-rmem-" + rand.Text()[:8]
	t.Cleanup(func() { DeleteLinks(key) })
	pid := netnsProcess(t)
	if _, err := e.CreateVethIn(key, netip.MustParseAddr("10.189.250.9"), pid); err != nil {
		t.Fatalf("CreateVethIn = %v", err)
	}
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-n", "cat", "/proc/sys/net/ipv4/tcp_rmem").Output()
	if err != nil {
		t.Fatalf("read the sandbox's tcp_rmem: %v", err)
	}
	var lo, def, hi int
	if _, err := fmt.Sscan(string(out), &lo, &def, &hi); err != nil {
		t.Fatalf("sandbox's tcp_rmem %q: %v", out, err)
	}
	if want := min(SandboxRcvBuf, hi); def != want {
		t.Errorf("sandbox's tcp_rmem = %q; want the default %d", out, want)
	}
	if hostAfter, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem"); string(hostAfter) != string(hostBefore) {
		t.Errorf("host's tcp_rmem changed from %q to %q", hostBefore, hostAfter)
	}
}
