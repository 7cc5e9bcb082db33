package main

import (
	"flag"
	"io"
	"maps"
	"testing"
)

func TestBackendOpts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		images  map[string]string
		subnet  string
		wantErr bool
	}{
		{name: "defaults", images: map[string]string{"base": "sandboxd-base"}},
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
			if got := bo.images(); !maps.Equal(got, tc.images) {
				t.Errorf("images = %v; want %v", got, tc.images)
			}
			if sub != tc.subnet {
				t.Errorf("subnet = %q; want %q", sub, tc.subnet)
			}
		})
	}
}
