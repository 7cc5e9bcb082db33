package egress

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNftSession: scripts through one nft -i apply, a failing one reports
// nft's error and is all or nothing, and the session stays in step.
func TestNftSession(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for nftables")
	}
	if err := HaveNft(); err != nil {
		t.Skip(err)
	}
	table := "test_nftsession_" + strings.ReplaceAll(t.Name(), "/", "_")
	if err := runNftExec("table inet " + table + " {\n set s { type ipv4_addr; }\n}\n"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "inet", table).Run() })
	var s nftSession
	t.Cleanup(s.close)
	has := func(a string) bool {
		out, _ := exec.Command("nft", "list", "set", "inet", table, "s").Output()
		return strings.Contains(string(out), a)
	}
	for i, tc := range []struct {
		script, wantErr, present, absent string
	}{
		{script: "add element inet " + table + " s { 10.0.0.1 }\nadd element inet " + table + " s { 10.0.0.2 }", present: "10.0.0.2"},
		{script: "add element inet " + table + " s { 10.0.0.3 }\nadd element inet " + table + " nosuchset { 10.0.0.4 }", wantErr: "Error", absent: "10.0.0.3"},
		{script: "delete element inet " + table + " s { 10.0.0.1 }", absent: "10.0.0.1"},
	} {
		err := s.run(tc.script)
		if (err != nil) != (tc.wantErr != "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%d: run = %v, want error %q", i, err, tc.wantErr)
		}
		if tc.present != "" && !has(tc.present) {
			t.Errorf("%d: %s missing after the script", i, tc.present)
		}
		if tc.absent != "" && has(tc.absent) {
			t.Errorf("%d: %s present after the script", i, tc.absent)
		}
	}
}
