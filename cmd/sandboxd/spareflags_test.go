package main

import (
	"flag"
	"io"
	"maps"
	"testing"
)

func TestSpareFloors(t *testing.T) {
	for _, c := range []struct {
		name       string
		args       []string
		codeInterp bool
		availMB    int
		want       map[string]int
		wantErr    bool
	}{
		{"default", nil, false, 8192, map[string]int{"base": 2}, false},
		{"default with the code interpreter", nil, true, 8192, map[string]int{"base": 2, "code-interpreter-v1": 1}, false},
		{"default, code interpreter, short of memory", nil, true, 1024, map[string]int{"base": 2}, false},
		{"given: exactly that", []string{"--spare-min=base=5,py=1"}, true, 8192, map[string]int{"base": 5, "py": 1}, false},
		{"given empty: none", []string{"--spare-min="}, true, 8192, map[string]int{}, false},
		{"bad count", []string{"--spare-min=base=x"}, false, 0, nil, true},
		{"negative", []string{"--spare-min=base=-1"}, false, 0, nil, true},
		{"no name", []string{"--spare-min==2"}, false, 0, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var o limitOpts
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o.register(fs)
			err := fs.Parse(c.args)
			if (err != nil) != c.wantErr {
				t.Fatalf("parse %v: %v, want error %v", c.args, err, c.wantErr)
			}
			if err != nil {
				return
			}
			if got := o.spareFloors(c.codeInterp, c.availMB); !maps.Equal(got, c.want) {
				t.Errorf("floors = %v, want %v", got, c.want)
			}
		})
	}
}
