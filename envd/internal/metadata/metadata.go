// Package metadata stores user metadata of files as extended attributes under
// the "user.e2b." namespace, the way E2B's envd exposes it in EntryInfo and
// X-Metadata-* upload headers.
package metadata

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Prefix is the xattr namespace; keys are exposed without it.
const Prefix = "user.e2b."

// Limits E2B applies to upload metadata.
const (
	MaxKeyLen   = 246
	MaxTotalLen = 4096
)

// ErrInvalid is returned for metadata that breaks the limits above.
var ErrInvalid = errors.New("invalid metadata")

// Validate checks keys and values: printable ASCII, key length and total size.
func Validate(m map[string]string) error {
	total := 0
	for k, v := range m {
		if k == "" || len(k) > MaxKeyLen {
			return fmt.Errorf("%w: key %q length", ErrInvalid, k)
		}
		if !printable(k) || !printable(v) {
			return fmt.Errorf("%w: key %q: only printable ASCII is allowed", ErrInvalid, k)
		}
		total += len(k) + len(v)
	}
	if total > MaxTotalLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalid, total, MaxTotalLen)
	}
	return nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Read returns the metadata of path (not following a final symlink). A
// filesystem without xattr support reads as no metadata.
func Read(path string) (map[string]string, error) {
	size, err := unix.Llistxattr(path, nil)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	if size == 0 {
		return nil, nil
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(path, buf)
	if err != nil {
		return nil, err
	}
	var out map[string]string
	for _, name := range strings.Split(string(buf[:size]), "\x00") {
		key, ok := strings.CutPrefix(name, Prefix)
		if !ok || key == "" {
			continue
		}
		val := make([]byte, MaxTotalLen)
		n, err := unix.Lgetxattr(path, name, val)
		if err != nil {
			continue // removed between list and get
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = string(val[:n])
	}
	return out, nil
}

// Replace makes m the whole metadata of path: keys not in m are removed.
func Replace(path string, m map[string]string) error {
	old, err := Read(path)
	if err != nil {
		return err
	}
	for k := range old {
		if _, keep := m[k]; !keep {
			if err := unix.Lremovexattr(path, Prefix+k); err != nil && !errors.Is(err, unix.ENODATA) {
				return err
			}
		}
	}
	for k, v := range m {
		if err := unix.Lsetxattr(path, Prefix+strings.ToLower(k), []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}
