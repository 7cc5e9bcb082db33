package main

import "testing"

func TestDiffPath(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{"diff --git a/home/user/app.txt b/home/user/app.txt\n", "/home/user/app.txt"},
		{"diff --git a/odd b/name b/odd b/name\n", "/odd b/name"},
		{"diff --git a/x b/x", "/x"},
		{"diff --git a/x b/y\n", ""},
		{"diff --git a/ b/\n", ""},
		{"--- a/home/user/app.txt\n", ""},
		{"+diff --git a/x b/x\n", ""},
	} {
		if got := diffPath([]byte(c.line)); got != c.want {
			t.Errorf("diffPath(%q) = %q, want %q", c.line, got, c.want)
		}
	}
}
