package main

import (
	"reflect"
	"testing"

	sbxruntime "github.com/sandboxd/sandboxd/runtime"
)

func TestTemplateFlag(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    templateFlag
		wantErr bool
	}{
		{"path", []string{"py=/img/py.tar"}, templateFlag{"py": {path: "/img/py.tar"}}, false},
		{"path and resources", []string{"py=/img/py.tar,cpu=2,memory=1024,disk=2048"},
			templateFlag{"py": {path: "/img/py.tar", res: sbxruntime.Resources{CPUCount: 2, MemoryMB: 1024, DiskSizeMB: 2048}}}, false},
		{"some resources, any order", []string{"py=/img/py.tar,disk=2048,cpu=4"},
			templateFlag{"py": {path: "/img/py.tar", res: sbxruntime.Resources{CPUCount: 4, DiskSizeMB: 2048}}}, false},
		{"comma in the path", []string{"py=/img/a,b:latest,memory=256"},
			templateFlag{"py": {path: "/img/a,b:latest", res: sbxruntime.Resources{MemoryMB: 256}}}, false},
		{"base resources", []string{"base=,memory=768"}, templateFlag{"base": {res: sbxruntime.Resources{MemoryMB: 768}}}, false},
		{"base with a path", []string{"base=/x"}, nil, true},
		{"no path", []string{"py=,cpu=1"}, nil, true},
		{"no name", []string{"=/x"}, nil, true},
		{"no equals", []string{"py"}, nil, true},
		{"zero", []string{"py=/x,cpu=0"}, nil, true},
		{"negative", []string{"py=/x,memory=-1"}, nil, true},
		{"not a number", []string{"py=/x,disk=lots"}, nil, true},
		{"twice a key", []string{"py=/x,cpu=1,cpu=2"}, nil, true},
		{"twice a name", []string{"py=/x", "py=/y"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := templateFlag{}
			var err error
			for _, a := range tc.args {
				if err = f.Set(a); err != nil {
					break
				}
			}
			if tc.wantErr {
				if err == nil {
					t.Fatalf("Set(%q) = nil; want an error (got %v)", tc.args, f)
				}
				return
			}
			if err != nil {
				t.Fatalf("Set(%q) = %v", tc.args, err)
			}
			if !reflect.DeepEqual(f, tc.want) {
				t.Errorf("Set(%q) = %+v; want %+v", tc.args, f, tc.want)
			}
		})
	}
}
