//go:build !seccomp

package spawn

import (
	"fmt"

	"github.com/opencontainers/runc/libcontainer/configs"
)

// CompileSeccomp needs libseccomp: built without -tags seccomp, there is no
// program to give, and such a config starts through libcontainer (which
// has no seccomp support then either).
func CompileSeccomp(*configs.Seccomp) ([]byte, error) {
	return nil, fmt.Errorf("%w: built without seccomp", ErrUnsupported)
}
