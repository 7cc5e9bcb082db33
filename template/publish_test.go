package template

import (
	"slices"
	"testing"
)

func TestConflicts(t *testing.T) {
	f := func(p string) PathChange { return PathChange{Path: p} }
	d := func(p string) PathChange { return PathChange{Path: p, Dir: true} }
	for _, tc := range []struct {
		name         string
		mine, theirs []PathChange
		want         []string
	}{
		{"disjoint files", []PathChange{f("/a/x")}, []PathChange{f("/a/y")}, nil},
		{"same file", []PathChange{f("/a/x"), f("/b")}, []PathChange{f("/a/x")}, []string{"/a/x"}},
		{"both add a directory, different files in it", []PathChange{d("/src"), f("/src/a")}, []PathChange{d("/src"), f("/src/b")}, nil},
		{"they deleted a directory mine wrote in", []PathChange{f("/etc/app/conf")}, []PathChange{f("/etc/app")}, []string{"/etc/app/conf"}},
		{"mine replaced a directory they wrote in", []PathChange{f("/etc/app")}, []PathChange{f("/etc/app/conf")}, []string{"/etc/app"}},
		{"mine added a directory where they put a file", []PathChange{d("/x"), f("/x/y")}, []PathChange{f("/x")}, []string{"/x", "/x/y"}},
		{"odd names", []PathChange{f("/a\nb"), f("/\xff")}, []PathChange{f("/a\nb"), f("/\xfe")}, []string{"/a\nb"}},
		{"nothing published since", []PathChange{f("/a")}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Conflicts(tc.mine, tc.theirs); !slices.Equal(got, tc.want) {
				t.Errorf("Conflicts = %q, want %q", got, tc.want)
			}
		})
	}
}
