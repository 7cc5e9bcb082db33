package mcp

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestClipped: output within the bounds is kept whole, in any chunking;
// beyond them the head and tail are kept, the note counts the cut, and no
// cut splits a UTF-8 character.
func TestClipped(t *testing.T) {
	write := func(s string, chunk int) *clipped {
		var c clipped
		for len(s) > 0 {
			n := min(chunk, len(s))
			c.write([]byte(s[:n]))
			s = s[n:]
		}
		return &c
	}
	small := strings.Repeat("x", headMax+tailMax)
	for _, chunk := range []int{1, 7, 4096, len(small)} {
		if got := write(small, chunk).String("stdout"); got != small {
			t.Errorf("chunk %d: %d bytes within the bounds changed (%d bytes back)", chunk, len(small), len(got))
		}
	}
	big := strings.Repeat("h", headMax) + strings.Repeat("m", 1000) + strings.Repeat("t", tailMax)
	for _, chunk := range []int{3, 1000, len(big)} {
		got := write(big, chunk).String("stderr")
		want := strings.Repeat("h", headMax) +
			"\n[sandboxd: 1000 bytes of stderr cut here; it wrote 66536 bytes, of which the first 16384 and the last 49152 are shown]\n" +
			strings.Repeat("t", tailMax)
		if got != want {
			t.Errorf("chunk %d: got %d bytes, want %d", chunk, len(got), len(want))
		}
	}
	// "é" is 2 bytes, "€" 3: odd offsets put the cuts inside characters.
	uni := "a" + strings.Repeat("é", headMax) + strings.Repeat("€", tailMax)
	c := write(uni, 4093)
	got := c.String("stdout")
	if !utf8.ValidString(got) {
		t.Fatal("a cut split a character")
	}
	head, rest, _ := strings.Cut(got, "\n[sandboxd: ")
	note, tail, _ := strings.Cut(rest, "]\n")
	if int64(len(head)+len(tail)) > c.total || !strings.HasPrefix(uni, head) || !strings.HasSuffix(uni, tail) {
		t.Errorf("head %d and tail %d bytes are not the output's ends", len(head), len(tail))
	}
	if !strings.Contains(note, "of stdout cut here") {
		t.Errorf("note %q", note)
	}
}
