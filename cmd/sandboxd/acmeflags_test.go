package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestACMEFlagErrors: serve refuses bad --acme-* combinations before it
// touches anything, with an error that names the flag.
func TestACMEFlagErrors(t *testing.T) {
	t.Setenv("EXEC_PATH", "")
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not PEM\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "data")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--acme-email", "a@b.test"}, "--acme-email: only with --acme-dns"},
		{[]string{"--acme-directory", "https://ca.test/dir"}, "--acme-directory: only with --acme-dns"},
		{[]string{"--acme-dns-resolver", "127.0.0.1"}, "--acme-dns-resolver: only with --acme-dns"},
		{[]string{"--acme-ca-root", junk}, "--acme-ca-root: only with --acme-dns"},
		{[]string{"--acme-dns", "exec"}, "--acme-dns needs --domain"},
		{[]string{"--acme-dns", "exec", "--domain", "sbx.test", "--tls-cert", "c.pem", "--tls-key", "k.pem"}, "--acme-dns excludes --tls-cert"},
		{[]string{"--acme-dns", "exec", "--domain", "*.sbx.test"}, "--domain"},
		{[]string{"--acme-dns", "exec", "--domain", "127.0.0.1:3000"}, "--domain"},
		{[]string{"--acme-dns", "exec", "--domain", "bad_name.test"}, "--domain"},
		{[]string{"--acme-dns", "route53", "--domain", "sbx.test"}, `--acme-dns "route53": want one of exec, rfc2136`},
		{[]string{"--acme-dns", "exec", "--domain", "sbx.test", "--acme-email", "admin"}, "--acme-email"},
		{[]string{"--acme-dns", "exec", "--domain", "sbx.test", "--acme-email", "Admin <a@b.test>"}, "--acme-email"},
		{[]string{"--acme-dns", "exec", "--domain", "sbx.test", "--acme-directory", "ftp://ca.test/"}, "--acme-directory"},
		{[]string{"--acme-dns", "exec", "--domain", "sbx.test", "--acme-directory", "ca.test/dir"}, "--acme-directory"},
		{[]string{"--acme-dns", "exec", "--domain", "sbx.test", "--acme-ca-root", filepath.Join(dir, "missing.pem")}, "--acme-ca-root"},
		{[]string{"--acme-dns", "exec", "--domain", "sbx.test", "--acme-ca-root", junk}, "--acme-ca-root " + junk + ": no PEM certificate"},
		{[]string{"--acme-dns", "exec", "--domain", "sbx.test", "--acme-dns-resolver", "a b"}, "acme-dns-resolver"},
		// Flags are fine, the provider's environment is not.
		{[]string{"--acme-dns", "exec", "--domain", "sbx.test:3000"}, "--acme-dns exec: exec: some credentials information are missing: EXEC_PATH"},
		{[]string{"--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together"},
	} {
		err := serve(append([]string{"--data-dir", dataDir}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %q = %v; want an error containing %q", tc.args, err, tc.want)
		}
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("a refused serve left %s: %v", dataDir, err)
	}
}

func TestACMEFlagValidate(t *testing.T) {
	o := acmeOpts{dns: "rfc2136"}
	if err := o.resolvers.Set("127.0.0.1, [::1]:5353,ns.test"); err != nil {
		t.Fatal(err)
	}
	if err := o.resolvers.Set("10.0.0.1:5300"); err != nil {
		t.Fatal(err)
	}
	if err := o.validate("Sbx.Test.:3000", "", ""); err != nil {
		t.Fatal(err)
	}
	if o.host != "sbx.test" {
		t.Errorf("host = %q; want sbx.test (no port, lower case, no final dot)", o.host)
	}
	want := []string{"127.0.0.1:53", "[::1]:5353", "ns.test:53", "10.0.0.1:5300"}
	if !slices.Equal(o.resolvers, want) {
		t.Errorf("resolvers = %q; want %q", o.resolvers, want)
	}
	for _, name := range []string{"exec", "dnsupdate"} {
		o := acmeOpts{dns: name}
		if err := o.validate("sbx.test", "", ""); err != nil {
			t.Errorf("--acme-dns %s: %v", name, err)
		}
	}
	var none acmeOpts
	if err := none.validate("", "c.pem", "k.pem"); err != nil || none.enabled() {
		t.Errorf("no --acme-* flags: validate = %v, enabled %v; want nil, false", err, none.enabled())
	}
}
