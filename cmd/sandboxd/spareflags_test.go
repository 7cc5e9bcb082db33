package main

import (
	"flag"
	"io"
	"maps"
	"testing"

	"github.com/sandboxd/sandboxd/pool"
)

func TestSpareFloors(t *testing.T) {
	for _, c := range []struct {
		name       string
		args       []string
		codeInterp bool
		availMB    int
		backend    string
		want       map[string]int
		wantErr    bool
	}{
		{"default: one per 256 MiB", nil, false, 8192, "local", map[string]int{"base": 32}, false},
		{"default: one per 256 MiB past --pool-max", nil, false, 23 << 10, "local", map[string]int{"base": 92}, false},
		{"default: --pool-max does not bound it", []string{"--pool-max=10"}, false, 23 << 10, "local", map[string]int{"base": 92}, false},
		{"default: at most --spare-max", []string{"--spare-max=10"}, false, 23 << 10, "local", map[string]int{"base": 10}, false},
		{"default: at least 2", nil, false, 300, "local", map[string]int{"base": 2}, false},
		{"default with the code interpreter", nil, true, 8192, "local", map[string]int{"base": 32, "code-interpreter-v1": 1}, false},
		{"default, code interpreter, short of memory", nil, true, 1024, "local", map[string]int{"base": 4}, false},
		{"default on another backend: 2", nil, false, 8192, "other", map[string]int{"base": 2}, false},
		{"default on Incus: one per GiB", nil, false, 8192, "incus", map[string]int{"base": 8}, false},
		{"default on Incus: at most 20", nil, true, 22 << 10, "incus", map[string]int{"base": 20, "code-interpreter-v1": 1}, false},
		{"default on Incus: at least 2", nil, false, 1024, "incus", map[string]int{"base": 2}, false},
		{"given: exactly that", []string{"--spare-min=base=5,py=1"}, true, 8192, "local", map[string]int{"base": 5, "py": 1}, false},
		{"given on Incus: exactly that", []string{"--spare-min=base=5"}, true, 8192, "incus", map[string]int{"base": 5}, false},
		{"given empty: none", []string{"--spare-min="}, true, 8192, "local", map[string]int{}, false},
		{"bad count", []string{"--spare-min=base=x"}, false, 0, "local", nil, true},
		{"negative", []string{"--spare-min=base=-1"}, false, 0, "local", nil, true},
		{"no name", []string{"--spare-min==2"}, false, 0, "local", nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := parseLimitOpts(c.args)
			if (err != nil) != c.wantErr {
				t.Fatalf("parse %v: %v, want error %v", c.args, err, c.wantErr)
			}
			if err != nil {
				return
			}
			if got := o.spareFloors(c.codeInterp, c.availMB, c.backend); !maps.Equal(got, c.want) {
				t.Errorf("floors = %v, want %v", got, c.want)
			}
		})
	}
}

func TestSpareCap(t *testing.T) {
	for _, c := range []struct {
		name    string
		args    []string
		availMB int
		backend string
		want    int
	}{
		{"local: one per 256 MiB", nil, 23 << 10, "local", 92},
		{"local: at least 64", nil, 4096, "local", 64},
		{"local: not --pool-max", []string{"--pool-max=10"}, 4096, "local", 64},
		{"Incus: 64", nil, 23 << 10, "incus", 64},
		{"given", []string{"--spare-max=7"}, 23 << 10, "local", 7},
		{"given on Incus", []string{"--spare-max=200"}, 1024, "incus", 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := parseLimitOpts(c.args)
			if err != nil {
				t.Fatal(err)
			}
			if got := o.spareCap(c.availMB, c.backend); got != c.want {
				t.Errorf("spareCap = %d, want %d", got, c.want)
			}
		})
	}
}

func TestSpareReserveFlag(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want int // pool.Config.SpareReserve
	}{
		{"default", nil, pool.DefaultSpareReserve},
		{"given", []string{"--spare-reserve=5"}, 5},
		{"none", []string{"--spare-reserve=0"}, -1},
		{"negative is none", []string{"--spare-reserve=-3"}, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := parseLimitOpts(c.args)
			if err != nil {
				t.Fatal(err)
			}
			if got := o.spareReserveConfig(); got != c.want {
				t.Errorf("SpareReserve = %d, want %d", got, c.want)
			}
		})
	}
}

// parseLimitOpts parses args as serve's limit flags.
func parseLimitOpts(args []string) (*limitOpts, error) {
	var o limitOpts
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.register(fs)
	return &o, fs.Parse(args)
}
