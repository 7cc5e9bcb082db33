package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/sandboxd/sandboxd/openapi/nativeapi"
)

// writerNotes passes a patch of the native /diff through, line by line,
// with a comment line before each file's section naming the process that
// wrote the file, from the sandbox's changes (`sandboxd sandbox diff
// --writers`). git apply skips lines outside a file's section.
type writerNotes struct {
	w       io.Writer
	notes   map[string]string // path (absolute, as /changes has it) → note
	pending []byte            // a line not ended yet
}

func newWriterNotes(w io.Writer, cl nativeapi.ChangeList) *writerNotes {
	n := &writerNotes{w: w, notes: map[string]string{}}
	for _, c := range cl.Changes {
		if c.Writer == nil || c.PathBase64 != nil {
			continue // a name that is not UTF-8 is not matched by its text
		}
		note := fmt.Sprintf("# writer of %s: %s (pid %d", c.Path, c.Writer.Comm, c.Writer.Pid)
		if c.Writer.EnvdPid != nil {
			note += fmt.Sprintf(", envd command %d", *c.Writer.EnvdPid)
		}
		note += ")"
		if c.Writer.Command != nil {
			note += ": " + strings.ReplaceAll(*c.Writer.Command, "\n", " ")
		}
		n.notes[c.Path] = note + "\n"
	}
	return n
}

func (n *writerNotes) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			n.pending = append(n.pending, p...)
			break
		}
		line := append(n.pending, p[:i+1]...)
		n.pending = nil
		p = p[i+1:]
		if note, ok := n.notes[diffPath(line)]; ok {
			if _, err := io.WriteString(n.w, note); err != nil {
				return 0, err
			}
		}
		if _, err := n.w.Write(line); err != nil {
			return 0, err
		}
	}
	return total, nil
}

// diffPath is the absolute path of a "diff --git a/<rel> b/<rel>" header
// line, "" for any other line. rel is there twice, so its length says
// where it ends whatever it holds.
func diffPath(line []byte) string {
	s, ok := strings.CutPrefix(strings.TrimSuffix(string(line), "\n"), "diff --git a/")
	if !ok || len(s) < len(" b/")+2 || (len(s)-len(" b/"))%2 != 0 {
		return ""
	}
	n := (len(s) - len(" b/")) / 2
	if s[n:n+len(" b/")] != " b/" || s[:n] != s[n+len(" b/"):] {
		return ""
	}
	return "/" + s[:n]
}

// Flush writes a last line without a newline, if any.
func (n *writerNotes) Flush() error {
	if len(n.pending) == 0 {
		return nil
	}
	_, err := n.w.Write(n.pending)
	n.pending = nil
	return err
}
