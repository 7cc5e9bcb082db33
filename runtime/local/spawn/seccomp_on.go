//go:build seccomp

package spawn

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/opencontainers/runc/libcontainer/configs"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// CompileSeccomp compiles the seccomp profile c into the classic BPF
// program libcontainer would load for it, with libseccomp as libcontainer
// does. Only what the local backend's profile uses is translated: a default
// action of allow (so that runc's ENOSYS stub for syscalls newer than the
// profile is not needed), errno actions, the native architecture and
// conditions on single arguments; anything else is ErrUnsupported.
func CompileSeccomp(c *configs.Seccomp) ([]byte, error) {
	if c.DefaultAction != configs.Allow || len(c.Architectures) > 0 || c.ListenerPath != "" {
		return nil, fmt.Errorf("%w: seccomp default action, architectures or listener", ErrUnsupported)
	}
	if _, err := seccompFlags(c); err != nil {
		return nil, err
	}
	filter, err := libseccomp.NewFilter(libseccomp.ActAllow)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	defer filter.Release()
	if err := filter.SetNoNewPrivsBit(false); err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	for _, call := range c.Syscalls {
		if call.Action != configs.Errno {
			return nil, fmt.Errorf("%w: seccomp action %v", ErrUnsupported, call.Action)
		}
		nr, err := libseccomp.GetSyscallFromName(call.Name)
		if err != nil {
			continue // as libcontainer: a name this kernel's table lacks is skipped
		}
		ret := int16(unix.EPERM)
		if call.ErrnoRet != nil {
			ret = int16(*call.ErrnoRet)
		}
		act := libseccomp.ActErrno.SetReturnCode(ret)
		if len(call.Args) == 0 {
			err = filter.AddRule(nr, act)
		} else {
			var conds []libseccomp.ScmpCondition
			for _, a := range call.Args {
				op, ok := operators[a.Op]
				if !ok {
					return nil, fmt.Errorf("%w: seccomp operator %v", ErrUnsupported, a.Op)
				}
				cond, cerr := libseccomp.MakeCondition(a.Index, op, a.Value, a.ValueTwo)
				if cerr != nil {
					return nil, fmt.Errorf("seccomp: %w", cerr)
				}
				conds = append(conds, cond)
			}
			if sameArgTwice(call.Args) {
				// As libcontainer: conditions on one argument are
				// alternatives, each a rule of its own.
				for _, cond := range conds {
					if err = filter.AddRuleConditional(nr, act, []libseccomp.ScmpCondition{cond}); err != nil {
						break
					}
				}
			} else {
				err = filter.AddRuleConditional(nr, act, conds)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("seccomp: rule for %s: %w", call.Name, err)
		}
	}
	return export(filter)
}

var operators = map[configs.Operator]libseccomp.ScmpCompareOp{
	configs.EqualTo:              libseccomp.CompareEqual,
	configs.NotEqualTo:           libseccomp.CompareNotEqual,
	configs.GreaterThan:          libseccomp.CompareGreater,
	configs.GreaterThanOrEqualTo: libseccomp.CompareGreaterEqual,
	configs.LessThan:             libseccomp.CompareLess,
	configs.LessThanOrEqualTo:    libseccomp.CompareLessOrEqual,
	configs.MaskEqualTo:          libseccomp.CompareMaskedEqual,
}

// export returns the filter's BPF program: libseccomp writes it to a file.
func export(filter *libseccomp.ScmpFilter) ([]byte, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	done := make(chan error, 1)
	go func() {
		done <- filter.ExportBPF(w)
		w.Close()
	}()
	b, rerr := io.ReadAll(r)
	if err := errors.Join(<-done, rerr); err != nil {
		return nil, fmt.Errorf("seccomp: export: %w", err)
	}
	return b, nil
}

func sameArgTwice(args []*configs.Arg) bool {
	seen := map[uint]bool{}
	for _, a := range args {
		if seen[a.Index] {
			return true
		}
		seen[a.Index] = true
	}
	return false
}
