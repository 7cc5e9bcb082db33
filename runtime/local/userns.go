package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime"
)

// User namespaces (Options.UserNS): every sandbox maps its ids 0-65535 to
// the host's userNSBase + 0-65535, so root inside is an unprivileged id on
// the host. All sandboxes share the range: they cannot reach each other's
// files anyway (separate mount namespaces), and one range keeps pause to
// disk and adoption free of per-sandbox bookkeeping.
//
// Files keep their meaning inside through an idmapped mount of the
// templates directory (mountIdmapped), made once per backend:
// the overlay's lower layer is read through it, so a template's root-owned
// /etc is root's inside. What the backend creates for a sandbox (the
// overlay's upper root, the socket directory) is chowned to the mapped root.
const (
	userNSBase = 1_000_000_000
	userNSSize = 65536
)

// userNSHoldArg is the os.Args[1] of the child that holds a user namespace
// with the sandboxes' mapping open while the idmapped mount is made.
const userNSHoldArg = "sandboxd-local-userns-hold"

// userNSHoldMain waits for stdin to close.
func userNSHoldMain() {
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// idmappedDir is where the templates directory is mounted idmapped.
func (b *Backend) idmappedDir() string { return filepath.Join(b.opts.Root, "templates-idmapped") }

// lowerDir is the overlay lower directory of tpl as the sandboxes see it.
func (b *Backend) lowerDir(tpl *template) string {
	if !b.opts.UserNS {
		return tpl.lower
	}
	rel, err := filepath.Rel(filepath.Join(b.opts.Root, "templates"), tpl.lower)
	if err != nil || rel == ".." || filepath.IsAbs(rel) || len(rel) > 2 && rel[:3] == "../" {
		return tpl.lower // a directory template outside Root: see setupUserNS
	}
	return filepath.Join(b.idmappedDir(), rel)
}

// setupUserNS mounts the templates directory idmapped at idmappedDir,
// unless it is already (an earlier process's). Directory templates outside
// Root cannot be idmapped this way and are refused.
func (b *Backend) setupUserNS() error {
	for name, tpl := range b.templates {
		if b.lowerDir(tpl) == tpl.lower {
			return fmt.Errorf("template %q (%s) is outside %s: not supported with user namespaces", name, tpl.lower, b.opts.Root)
		}
	}
	dst := b.idmappedDir()
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	if mounted, err := mountinfo.Mounted(dst); err != nil {
		return err
	} else if mounted {
		return nil
	}
	return mountIdmapped(filepath.Join(b.opts.Root, "templates"), dst)
}

// mountIdmapped bind-mounts src at dst, read-only, with the sandboxes' id
// mapping applied: a file of host uid u shows as u+userNSBase there, which
// a sandbox's user namespace maps back to u.
func mountIdmapped(src, dst string) error {
	// A user namespace with the mapping, held by a child: mount_setattr
	// takes the mapping from a namespace fd.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, userNSHoldArg)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: userNSBase, Size: userNSSize}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: userNSBase, Size: userNSSize}},
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("user namespace: %w", err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	nsfd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("user namespace: %w", err)
	}
	defer unix.Close(nsfd)

	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(tree)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(nsfd)}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
		if errors.Is(err, unix.EINVAL) {
			// What a kernel says when the filesystem under Root cannot be
			// idmapped: tmpfs (the default /run) only can from Linux 6.3
			// (Debian 12's 6.1 cannot).
			return fmt.Errorf("idmap %s: %w (the filesystem under Root cannot be idmapped by this kernel: tmpfs needs Linux ≥ 6.3)", src, err)
		}
		return fmt.Errorf("idmap %s: %w", src, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount %s: %w", dst, err)
	}
	return nil
}

// userNSSpec adds the user namespace and its mapping to sp.
func userNSSpec(sp *specs.Spec) {
	sp.Linux.Namespaces = append(sp.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
	m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: userNSBase, Size: userNSSize}}
	sp.Linux.UIDMappings = m
	sp.Linux.GIDMappings = m
}

// chownToMappedRoot gives paths to the sandboxes' root.
func chownToMappedRoot(paths ...string) error {
	var errs []error
	for _, p := range paths {
		errs = append(errs, os.Lchown(p, userNSBase, userNSBase))
	}
	return errors.Join(errs...)
}

// missingDirs lists dir and those of its ancestors that do not exist.
func missingDirs(dir string) []string {
	var out []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || d == filepath.Dir(d) {
			return out
		}
		out = append(out, d)
	}
}

// userNSDirs lets a sandbox's root traverse (not list) the way to its state
// directory: runc's init sets the root filesystem up by its host path, as
// the sandbox's root. The directories New created, Root and
// Root/sandboxes get mode 0711; an existing ancestor that others cannot
// traverse is an error (its mode is the operator's to change).
func userNSDirs(root string, created []string) error {
	for _, d := range append(created, root, filepath.Join(root, "sandboxes")) {
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	for d := filepath.Clean(root); d != filepath.Dir(d); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not traversable by others (mode %v): sandboxes could not reach their root filesystem", d, fi.Mode().Perm())
		}
	}
	return nil
}

// sameUserNS refuses to start s on a backend whose UserNS setting differs
// from the one s was made with: its layer's owners are the host ids of that
// mode.
func (b *Backend) sameUserNS(s *sandbox) error {
	if s.meta.UserNS != b.opts.UserNS {
		return fmt.Errorf("%w: sandbox made with user namespaces %v, backend runs with %v", runtime.ErrUnavailable, s.meta.UserNS, b.opts.UserNS)
	}
	return nil
}
