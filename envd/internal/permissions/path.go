package permissions

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrBadPath is returned for a path that cannot be resolved for a user.
var ErrBadPath = errors.New("invalid path")

// ResolvePath turns a client path into a clean absolute path as seen by u:
// empty means defaultDir (or home when that is empty too), a leading "~" or
// "~/" means home, any other relative path is taken from home.
func ResolvePath(path string, u *User, defaultDir string) (string, error) {
	if strings.IndexByte(path, 0) >= 0 {
		return "", fmt.Errorf("%w: NUL byte", ErrBadPath)
	}
	if path == "" {
		path = defaultDir
		if path == "" {
			path = u.Home
		}
	}
	if path[0] == '~' {
		if len(path) > 1 && path[1] != '/' {
			return "", fmt.Errorf("%w: %q: cannot expand another user's home", ErrBadPath, path)
		}
		path = filepath.Join(u.Home, path[1:])
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(u.Home, path)
	}
	return filepath.Clean(path), nil
}

// EnsureDir creates dir and any missing parents, giving every directory it
// creates to u, so that files uploaded for a user land in directories that
// user can use.
func EnsureDir(dir string, u *User) error {
	var missing []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%w: %s is not a directory", ErrBadPath, d)
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
		if d == "/" {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := os.Lchown(missing[i], int(u.UID), int(u.GID)); err != nil {
			return err
		}
	}
	return nil
}
