package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name        string
		allow, deny []string
		wantErr     string // part of the error; "" = valid
	}{
		{name: "empty"},
		{name: "deny all", deny: []string{"0.0.0.0/0"}},
		{name: "addresses", allow: []string{"1.1.1.1", "8.8.8.0/24", "9.9.9.9:53", "10.0.0.0/8:1-1024"}, deny: []string{"0.0.0.0/0"}},
		{name: "domains", allow: []string{"example.com", "*.github.com", "pypi.org:443", "*"}, deny: []string{"0.0.0.0/0"}},
		{name: "domain with a trailing dot", allow: []string{"Example.COM."}, deny: []string{"0.0.0.0/0"}},
		{name: "IPv6 deny", deny: []string{"::/0", "[2001:db8::1]:53"}},
		{name: "domains need deny all", allow: []string{"example.com"}, wantErr: "must hold 0.0.0.0/0"},
		{name: "domain in deny", deny: []string{"example.com"}, wantErr: `network.denyOut[0] "example.com": not an IP address or CIDR`},
		{name: "bad CIDR", deny: []string{"1.2.3.4/33"}, wantErr: `network.denyOut[0]`},
		{name: "bad port", allow: []string{"1.2.3.4:0"}, wantErr: "want 1-65535"},
		{name: "backwards range", allow: []string{"1.2.3.4:90-80"}, wantErr: "runs backwards"},
		{name: "inner wildcard", allow: []string{"a.*.com"}, deny: []string{"0.0.0.0/0"}, wantErr: "wildcard may only start"},
		{name: "unicode domain", allow: []string{"bücher.de"}, deny: []string{"0.0.0.0/0"}, wantErr: "punycode"},
		{name: "garbage", allow: []string{"no spaces.com"}, deny: []string{"0.0.0.0/0"}, wantErr: "neither"},
		{name: "unspecified", deny: []string{"0.0.0.0"}, wantErr: "unspecified"},
		{name: "IPv6 allow", allow: []string{"2001:db8::/32"}, wantErr: "no IPv6"},
		{name: "empty entry", allow: []string{" "}, wantErr: "empty"},
		{name: "too many", deny: make([]string, MaxRules+1), wantErr: "more than the limit of 500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.allow, tc.deny)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Parse = %v, want it valid", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalid)):
				t.Errorf("Parse = %v, want ErrInvalid with %q", err, tc.wantErr)
			}
		})
	}
}

func TestPolicyMatch(t *testing.T) {
	p, err := Parse([]string{"example.com", "*.github.com:443", "1.2.3.0/24", "5.6.7.8:22"}, []string{"0.0.0.0/0", "9.9.9.9"})
	if err != nil {
		t.Fatal(err)
	}
	hosts := []struct {
		host string
		port uint16
		want bool
	}{
		{"example.com", 80, true}, {"EXAMPLE.com.", 443, true}, {"www.example.com", 443, false},
		{"api.github.com", 443, true}, {"api.github.com", 80, false}, {"github.com", 443, false},
		{"evilgithub.com", 443, false}, {"", 443, false},
	}
	for _, h := range hosts {
		if got := p.AllowsHost(h.host, h.port); got != h.want {
			t.Errorf("AllowsHost(%q, %d) = %v, want %v", h.host, h.port, got, h.want)
		}
	}
	if !p.AllowsName("api.github.com") || p.AllowsName("pypi.org") {
		t.Error("AllowsName: want api.github.com only")
	}
	addrs := []struct {
		ip   string
		port uint16
		want bool
	}{{"1.2.3.4", 443, true}, {"5.6.7.8", 22, true}, {"5.6.7.8", 23, false}, {"9.9.9.9", 53, false}, {"8.8.8.8", 53, false}}
	for _, a := range addrs {
		if got := p.Decide(netip.MustParseAddr(a.ip), a.port); got != a.want {
			t.Errorf("Decide(%s:%d) = %v, want %v", a.ip, a.port, got, a.want)
		}
	}
}
