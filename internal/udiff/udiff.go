// Package udiff writes unified diffs of text (the format of `diff -u` and
// git): the line edit script is Myers' O(ND) shortest one, grouped into
// hunks with three lines of context.
package udiff

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// Context is the number of unchanged lines around each change.
const Context = 3

type opKind byte

const (
	opEqual opKind = ' '
	opDel   opKind = '-'
	opIns   opKind = '+'
)

type op struct {
	kind opKind
	a, b int // line index in a (equal, delete) and b (equal, insert)
}

// Lines splits text into lines, each with its newline; the last may lack
// one.
func Lines(text []byte) []string {
	if len(text) == 0 {
		return nil
	}
	var out []string
	for len(text) > 0 {
		i := bytes.IndexByte(text, '\n')
		if i < 0 {
			out = append(out, string(text))
			break
		}
		out = append(out, string(text[:i+1]))
		text = text[i+1:]
	}
	return out
}

// MaxEdits bounds the edit distance Unified computes: its memory grows
// with the square of it.
const MaxEdits = 4000

// script returns the shortest edit script from a to b (Myers 1986: the
// furthest reaching D-paths, then a walk back through the saved frontiers),
// or ok false when it is longer than MaxEdits lines.
func script(a, b []string) (ops []op, ok bool) {
	n, m := len(a), len(b)
	max := n + m
	v := make([]int, 2*max+2)
	// trace[d] is the frontier before step d, diagonals -d-1..d+1 only.
	var trace [][]int
	for d := 0; d <= max; d++ {
		if d > MaxEdits {
			return nil, false
		}
		lo, hi := max-d-1, max+d+2
		if lo < 0 {
			lo = 0
		}
		trace = append(trace, append([]int(nil), v[lo:hi]...))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || k != d && v[max+k-1] < v[max+k+1] {
				x = v[max+k+1]
			} else {
				x = v[max+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x, y = x+1, y+1
			}
			v[max+k] = x
			if x >= n && y >= m {
				return backtrack(trace, a, b, max, d), true
			}
		}
	}
	return nil, true
}

func backtrack(trace [][]int, a, b []string, max, d int) []op {
	x, y := len(a), len(b)
	var rev []op
	for ; d > 0; d-- {
		lo := max - d - 1
		if lo < 0 {
			lo = 0
		}
		v := func(k int) int { return trace[d][max+k-lo] }
		k := x - y
		var pk int
		if k == -d || k != d && v(k-1) < v(k+1) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := v(pk)
		py := px - pk
		for x > px && y > py {
			x, y = x-1, y-1
			rev = append(rev, op{opEqual, x, y})
		}
		if x == px {
			y--
			rev = append(rev, op{opIns, x, y})
		} else {
			x--
			rev = append(rev, op{opDel, x, y})
		}
	}
	for x > 0 && y > 0 {
		x, y = x-1, y-1
		rev = append(rev, op{opEqual, x, y})
	}
	out := make([]op, len(rev))
	for i, o := range rev {
		out[len(rev)-1-i] = o
	}
	return out
}

// ErrTooManyEdits: the texts differ in more than MaxEdits lines.
var ErrTooManyEdits = errors.New("more lines changed than a diff is made for")

// Unified returns the unified diff of a (named aName) and b (bName), or ""
// when they are equal. A line without its newline at the end of either
// text is marked as diff marks it.
func Unified(aName, bName string, a, b []byte) (string, error) {
	al, bl := Lines(a), Lines(b)
	ops, ok := script(al, bl)
	if !ok {
		return "", ErrTooManyEdits
	}
	var sb strings.Builder
	changed := false
	for _, o := range ops {
		if o.kind != opEqual {
			changed = true
			break
		}
	}
	if !changed {
		return "", nil
	}
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", aName, bName)
	for i := 0; i < len(ops); {
		// The next change, and the hunk around it: changes closer than
		// twice the context share a hunk.
		for i < len(ops) && ops[i].kind == opEqual {
			i++
		}
		if i == len(ops) {
			break
		}
		start := max(0, i-Context)
		end := i
		for j := i; j < len(ops); j++ {
			if ops[j].kind != opEqual {
				end = j + 1
				continue
			}
			if j-end >= 2*Context {
				break
			}
		}
		end = min(len(ops), end+Context)
		writeHunk(&sb, ops[start:end], al, bl)
		i = end
	}
	return sb.String(), nil
}

func writeHunk(sb *strings.Builder, ops []op, a, b []string) {
	aStart, bStart, aLen, bLen := -1, -1, 0, 0
	for _, o := range ops {
		if o.kind != opIns {
			if aStart < 0 {
				aStart = o.a
			}
			aLen++
		}
		if o.kind != opDel {
			if bStart < 0 {
				bStart = o.b
			}
			bLen++
		}
	}
	// diff's convention: an empty range starts at the line before it.
	if aStart < 0 {
		aStart = ops[0].a - 1
	}
	if bStart < 0 {
		bStart = ops[0].b - 1
	}
	fmt.Fprintf(sb, "@@ -%s +%s @@\n", hunkRange(aStart, aLen), hunkRange(bStart, bLen))
	for _, o := range ops {
		line := ""
		switch o.kind {
		case opIns:
			line = b[o.b]
		default:
			line = a[o.a]
		}
		sb.WriteByte(byte(o.kind))
		sb.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			sb.WriteString("\n\\ No newline at end of file\n")
		}
	}
}

func hunkRange(start, n int) string {
	if n == 1 {
		return fmt.Sprint(start + 1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}
