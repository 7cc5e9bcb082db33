package udiff

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnified compares with GNU diff -u (when installed): the same hunks
// and lines, headers aside.
func TestUnified(t *testing.T) {
	cases := []struct{ name, a, b string }{
		{"equal", "a\nb\n", "a\nb\n"},
		{"append", "a\nb\n", "a\nb\nc\n"},
		{"prepend", "b\nc\n", "a\nb\nc\n"},
		{"delete all", "a\nb\n", ""},
		{"from empty", "", "x\ny\n"},
		{"middle", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n", "1\n2\n3\n4\nfive\n6\n7\n8\n9\n10\n"},
		{"two hunks", strings.Repeat("l\n", 3) + "x\n" + strings.Repeat("m\n", 10) + "y\n" + strings.Repeat("n\n", 3),
			strings.Repeat("l\n", 3) + "X\n" + strings.Repeat("m\n", 10) + "Y\n" + strings.Repeat("n\n", 3)},
		{"one hunk, near changes", "a\nb\nc\nd\ne\nf\ng\nh\n", "A\nb\nc\nd\ne\nf\nG\nh\n"},
		{"no newline at end", "a\nb", "a\nc"},
		{"newline added", "a", "a\n"},
	}
	diff, _ := exec.LookPath("diff")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Unified("a/f", "b/f", []byte(tc.a), []byte(tc.b))
			if err != nil {
				t.Fatal(err)
			}
			if (got == "") != (tc.a == tc.b) {
				t.Fatalf("Unified = %q for a %s change", got, tc.name)
			}
			if diff == "" || got == "" {
				return
			}
			dir := t.TempDir()
			pa, pb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
			_ = os.WriteFile(pa, []byte(tc.a), 0o644)
			_ = os.WriteFile(pb, []byte(tc.b), 0o644)
			out, _ := exec.Command(diff, "-u", pa, pb).Output()
			want := string(out)
			// Headers differ (names, times); hunks must not.
			strip := func(s string) string {
				lines := strings.SplitAfter(s, "\n")
				return strings.Join(lines[2:], "")
			}
			if strip(got) != strip(want) {
				t.Errorf("hunks differ from diff -u:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestUnifiedTooManyEdits(t *testing.T) {
	var a, b strings.Builder
	for i := 0; i < MaxEdits+10; i++ {
		a.WriteString("a\n")
		b.WriteString("b\n")
	}
	if _, err := Unified("a", "b", []byte(a.String()), []byte(b.String())); err != ErrTooManyEdits {
		t.Errorf("Unified of %d changed lines: %v, want ErrTooManyEdits", MaxEdits+10, err)
	}
}
