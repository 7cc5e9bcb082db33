package template

import (
	"encoding/json"
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

// A version's paths survive its build record: names that are not UTF-8
// come back as they were (not as U+FFFD, which would make /\xff and /\xfe
// one name and a false conflict), and records written before p64 existed
// still read.
func TestPathChangeJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []PathChange
	}{
		{"utf-8", []PathChange{{Path: "/src/é"}, {Path: "/src", Dir: true}}},
		{"not utf-8", []PathChange{{Path: "/\xff"}, {Path: "/\xfe", Dir: true}, {Path: "/a\nb"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := json.Marshal(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			var out []PathChange
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(out, tc.in) {
				t.Errorf("%s read back as %#v, want %#v", raw, out, tc.in)
			}
		})
	}
	var old []PathChange
	if err := json.Unmarshal([]byte(`[{"p":"/x","d":true},{"p":"/y"}]`), &old); err != nil {
		t.Fatal(err)
	}
	if want := []PathChange{{Path: "/x", Dir: true}, {Path: "/y"}}; !slices.Equal(old, want) {
		t.Errorf("older record read as %#v, want %#v", old, want)
	}
	stored, _ := json.Marshal([]PathChange{{Path: "/\xfe"}})
	var theirs []PathChange
	_ = json.Unmarshal(stored, &theirs)
	if got := Conflicts([]PathChange{{Path: "/\xff"}}, theirs); len(got) != 0 {
		t.Errorf("/\\xff against a stored /\\xfe: conflicts %q, want none", got)
	}
}
