package main

import (
	"flag"
	"io"
	"maps"
	"strings"
	"testing"
)

func TestBackendOpts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		images  map[string]string
		subnet  string
		allow   string
		userNS  string
		wantErr bool
	}{
		{name: "defaults", images: map[string]string{"base": "sandboxd-base"}, userNS: "auto"},
		{name: "bare userns", args: []string{"--local-userns"}, userNS: "on"},
		{name: "userns off", args: []string{"--local-userns=off"}, userNS: "off"},
		{name: "userns auto", args: []string{"--local-userns=auto"}, userNS: "auto"},
		{name: "userns from a boolean", args: []string{"--local-userns=false"}, userNS: "off"},
		{name: "userns bad", args: []string{"--local-userns=maybe"}, wantErr: true},
		{
			name:   "extra image and subnet",
			args:   []string{"--incus-image", "py=my-python", "--egress-subnet", "10.140.0.0/24"},
			images: map[string]string{"base": "sandboxd-base", "py": "my-python"}, subnet: "10.140.0.0/24",
		},
		{name: "base overridden", args: []string{"--incus-image", "base=other"}, images: map[string]string{"base": "other"}},
		{name: "no alias", args: []string{"--incus-image", "py="}, wantErr: true},
		{name: "no name", args: []string{"--incus-image", "=x"}, wantErr: true},
		{name: "twice", args: []string{"--incus-image", "py=a", "--incus-image", "py=b"}, wantErr: true},
		{name: "bad subnet", args: []string{"--egress-subnet", "10.140.0.0"}, wantErr: true},
		{name: "allow twice", args: []string{"--egress-allow-cidr", "192.168.1.7/24", "--egress-allow-cidr", "10.0.0.0/8"}, allow: "[192.168.1.0/24 10.0.0.0/8]"},
		{name: "allow a list", args: []string{"--egress-allow-cidr", "192.168.1.0/24, 172.16.0.0/12"}, allow: "[192.168.1.0/24 172.16.0.0/12]"},
		{name: "allow bad", args: []string{"--egress-allow-cidr", "192.168.1.7"}, wantErr: true},
		{name: "allow IPv6", args: []string{"--egress-allow-cidr", "fd00::/8"}, wantErr: true},
		{name: "dns", args: []string{"--egress-dns", "192.0.2.53, 198.51.100.53"}},
		{name: "dns block", args: []string{"--egress-dns", "192.0.2.0/24"}, wantErr: true},
		{name: "dns IPv6", args: []string{"--egress-dns", "2001:db8::53"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var bo backendOpts
			bo.register(fs)
			err := fs.Parse(tc.args)
			var sub string
			if err == nil {
				p, serr := bo.subnet()
				err = serr
				if p.IsValid() {
					sub = p.String()
				}
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("parse %v: %v; want error %v", tc.args, err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if tc.userNS != "" && bo.userNS.String() != tc.userNS {
				t.Errorf("userns = %s; want %s", &bo.userNS, tc.userNS)
			}
			if tc.images == nil {
				tc.images = map[string]string{"base": "sandboxd-base"}
			}
			if got := bo.images(); !maps.Equal(got, tc.images) {
				t.Errorf("images = %v; want %v", got, tc.images)
			}
			if tc.allow == "" {
				tc.allow = "[]"
			}
			if got := bo.egressAllow.String(); got != tc.allow {
				t.Errorf("egress allow = %s; want %s", got, tc.allow)
			}
			if sub != tc.subnet {
				t.Errorf("subnet = %q; want %q", sub, tc.subnet)
			}
		})
	}
}

// TestServeStrayArgument: --local-userns is a boolean flag to the flag
// package, so "--local-userns off" would mean on plus an argument; serve
// refuses that instead of ignoring the "off".
func TestServeStrayArgument(t *testing.T) {
	err := serve([]string{"--local-userns", "off"})
	if err == nil || !strings.Contains(err.Error(), `"off"`) {
		t.Fatalf("serve(--local-userns off) = %v; want an error naming the argument", err)
	}
}
