package local

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
// templates directory (mountIdmapped), made once per backend, and one of
// each directory template outside it: the overlay's lower layer is read
// through it, so a template's root-owned /etc is root's inside. What the backend creates for a sandbox (the
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

// UserNSMode says whether a backend runs sandboxes in user namespaces.
type UserNSMode int

const (
	// UserNSAuto uses user namespaces where New's probe finds the host
	// able to, and logs a warning and runs without them elsewhere. A
	// directory template the probe cannot idmap runs without them too.
	UserNSAuto UserNSMode = iota
	// UserNSOn requires them: New fails where the host (or a template's
	// filesystem) cannot, and no sandbox of this backend starts without.
	UserNSOn
	// UserNSOff never uses them for new sandboxes.
	UserNSOff
)

func (m UserNSMode) String() string {
	switch m {
	case UserNSAuto:
		return "auto"
	case UserNSOn:
		return "on"
	case UserNSOff:
		return "off"
	}
	return fmt.Sprintf("UserNSMode(%d)", int(m))
}

// ParseUserNSMode reads auto, on or off; true/1 and false/0 mean on and
// off, so that a boolean flag or config value keeps its meaning.
func ParseUserNSMode(s string) (UserNSMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto":
		return UserNSAuto, nil
	case "on", "true", "1":
		return UserNSOn, nil
	case "off", "false", "0":
		return UserNSOff, nil
	}
	return 0, fmt.Errorf("user namespaces %q: want auto, on or off", s)
}

// UserNS reports whether new sandboxes get a user namespace (those of a
// template that cannot be idmapped excepted: see New's log).
func (b *Backend) UserNS() bool { return b.userNS }

// idmappedDir is where the templates directory is mounted idmapped.
func (b *Backend) idmappedDir() string { return filepath.Join(b.opts.Root, "templates-idmapped") }

// idmappedLower returns the idmapped view of lower, a template's lower
// directory: within the templates directory's view when lower is under
// it, else a view of its own, <Root>/templates-idmapped-<hash of lower>,
// mounted on first use (a directory template outside Root, of this
// process or of the one that created a sandbox being resumed).
func (b *Backend) idmappedLower(lower string) (string, error) {
	dst := b.viewPath(lower)
	if _, ok := b.inTemplatesDir(lower); ok {
		return dst, nil
	}
	b.viewMu.Lock()
	defer b.viewMu.Unlock()
	if b.views[dst] {
		return dst, nil
	}
	if err := ensureIdmapped(lower, dst); err != nil {
		return "", err
	}
	b.views[dst] = true
	return dst, nil
}

// viewPath is where idmappedLower shows lower.
func (b *Backend) viewPath(lower string) string {
	if rel, ok := b.inTemplatesDir(lower); ok {
		return filepath.Join(b.idmappedDir(), rel)
	}
	sum := sha256.Sum256([]byte(filepath.Clean(lower)))
	return b.idmappedDir() + "-" + hex.EncodeToString(sum[:8])
}

// idmappedLowers returns the idmapped views of lowers (idmappedLower).
func (b *Backend) idmappedLowers(lowers []string) ([]string, error) {
	out := make([]string, len(lowers))
	for i, l := range lowers {
		v, err := b.idmappedLower(l)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// inTemplatesDir returns lower relative to <Root>/templates, if it is
// under it (the host view, imported images).
func (b *Backend) inTemplatesDir(lower string) (string, bool) {
	rel, err := filepath.Rel(filepath.Join(b.opts.Root, "templates"), lower)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", false
	}
	return rel, true
}

// ensureIdmapped mounts src idmapped at dst unless dst is a mount point
// already (an earlier process's view: views stay while sandboxes use them).
func ensureIdmapped(src, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	if mounted, err := mountinfo.Mounted(dst); err != nil {
		return err
	} else if mounted {
		return nil
	}
	return mountIdmapped(src, dst)
}

// setupUserNS decides, at New, whether this backend can run sandboxes in
// user namespaces, by doing what they need: a user namespace with the
// mapping (the child mountIdmapped starts), the idmapped view of the
// templates directory, and an overlay on top of it that shows the mapped
// owners. A directory template outside Root gets the same probe on a view
// of its own; one that fails runs without user namespaces under
// UserNSAuto, and fails New under UserNSOn. On success b.userNS is set.
func (b *Backend) setupUserNS(created []string) error {
	if b.opts.UserNS == UserNSOff {
		return nil
	}
	err := b.probeUserNS(created)
	if err != nil {
		b.detachViews()
		if b.opts.UserNS == UserNSOn {
			return fmt.Errorf("%w: user namespaces (--local-userns=on): %w", runtime.ErrUnavailable, err)
		}
		b.log.Warn("local backend: sandboxes run WITHOUT user namespaces (root inside is root on the host): "+
			"the host cannot give them one; --local-userns=off silences this, =on makes it an error", "err", err)
		return nil
	}
	b.userNS = true
	for _, name := range slices.Sorted(maps.Keys(b.templates)) {
		tpl := b.templates[name]
		if _, ok := b.inTemplatesDir(tpl.lower()); ok {
			tpl.userNS = true // the probe above covered it
			continue
		}
		view, err := b.idmappedLower(tpl.lower())
		if err == nil {
			err = b.probeOverlay(view, tpl.lower())
		}
		if err != nil {
			if b.opts.UserNS == UserNSOn {
				b.detachViews()
				return fmt.Errorf("%w: user namespaces (--local-userns=on): template %q (%s) cannot be idmapped: %w",
					runtime.ErrUnavailable, name, tpl.lower(), err)
			}
			b.log.Warn("local backend: template's sandboxes run WITHOUT user namespaces: its directory cannot be idmapped",
				"template", name, "dir", tpl.lower(), "err", err)
			continue
		}
		tpl.userNS = true
	}
	return nil
}

// probeUserNS is setupUserNS's host check.
func (b *Backend) probeUserNS(created []string) error {
	raw, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	if err != nil {
		return fmt.Errorf("kernel without user namespaces: %w", err)
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(raw))); err != nil || n <= 0 {
		return fmt.Errorf("user namespaces disabled (/proc/sys/user/max_user_namespaces is %q)", strings.TrimSpace(string(raw)))
	}
	if err := userNSDirs(b.opts.Root, created); err != nil {
		return err
	}
	src := filepath.Join(b.opts.Root, "templates")
	if err := ensureIdmapped(src, b.idmappedDir()); err != nil {
		return err
	}
	return b.probeOverlay(b.idmappedDir(), src)
}

// probeOverlay mounts an overlay with the idmapped view as its top lower
// layer (as a sandbox's root is made; without an upper layer, so that the
// root's owner is the view's) and checks that it shows src's owner
// shifted into the sandboxes' range: overlayfs on idmapped layers needs
// Linux 5.19, and not every filesystem can be idmapped.
func (b *Backend) probeOverlay(view, src string) error {
	// A probe that a crash interrupted left its directory, maybe mounted.
	stale, _ := filepath.Glob(filepath.Join(b.opts.Root, ".userns-probe-*"))
	for _, d := range stale {
		if err := removeDir(d); err != nil {
			b.log.Warn("local backend: remove a stale userns probe", "dir", d, "err", err)
		}
	}
	dir, err := os.MkdirTemp(b.opts.Root, ".userns-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	mnt, empty := filepath.Join(dir, "mnt"), filepath.Join(dir, "empty")
	for _, d := range []string{mnt, empty} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+view+":"+empty); err != nil {
		return fmt.Errorf("overlayfs on an idmapped layer (needs Linux 5.19+): %w", err)
	}
	defer detach(mnt)
	var got, host unix.Stat_t
	if err := unix.Stat(mnt, &got); err != nil {
		return err
	}
	if err := unix.Stat(src, &host); err != nil {
		return err
	}
	if host.Uid < userNSSize && got.Uid != host.Uid+userNSBase {
		return fmt.Errorf("idmapped overlay shows owner %d for %s (host %d); want %d", got.Uid, src, host.Uid, host.Uid+userNSBase)
	}
	return nil
}

// detach lazily unmounts dir if it is a mount point; what still uses the
// mount (a sandbox's overlay on a view) keeps it until it lets go.
func detach(dir string) {
	_ = unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
}

// releaseViews detaches the idmapped views when no sandbox is left under
// Root: the next New mounts them again, and a run dir whose sandboxes are
// gone then holds no mount. With sandboxes left they stay (a sandbox
// resumed from disk by the next process finds them). Called by Close.
func (b *Backend) releaseViews() {
	if ents, err := os.ReadDir(b.sandboxesDir()); err != nil || len(ents) > 0 {
		return
	}
	b.detachViews()
}

// detachViews detaches and removes every idmapped view under Root.
func (b *Backend) detachViews() {
	b.viewMu.Lock()
	defer b.viewMu.Unlock()
	clear(b.views)
	views, _ := filepath.Glob(b.idmappedDir() + "*")
	for _, v := range views {
		detach(v)
		_ = os.Remove(v)
	}
}

// mountIdmapped bind-mounts src at dst, read-only, with the sandboxes' id
// mapping applied: a file of host uid u shows as u+userNSBase there, which
// a sandbox's user namespace maps back to u.
func mountIdmapped(src, dst string) error {
	return idmapMount(src, dst, unix.MOUNT_ATTR_RDONLY)
}

// idmapMount bind-mounts src at dst with the sandboxes' id mapping and
// the attributes attrs (besides nosuid and nodev).
func idmapMount(src, dst string, attrs uint64) error {
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
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | attrs | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(nsfd)}
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

// startableUserNS refuses to start s (a resume from disk) where its mode
// cannot be had: a sandbox keeps the mode it was made with for its life,
// since its layer holds the host ids of that mode. One made with a user
// namespace needs a backend that has them; one made without starts on any
// backend but one whose mode is UserNSOn, which runs nothing without.
func (b *Backend) startableUserNS(s *sandbox) error {
	switch {
	case s.meta.UserNS && !b.userNS:
		return fmt.Errorf("%w: sandbox made with a user namespace, and this backend runs without (user namespaces %s): "+
			"resume it under a sandboxd that has them, or kill it", runtime.ErrUnavailable, b.opts.UserNS)
	case !s.meta.UserNS && b.opts.UserNS == UserNSOn:
		return fmt.Errorf("%w: sandbox made without a user namespace, and this backend runs every sandbox in one "+
			"(user namespaces on): resume it under --local-userns=auto, or kill it", runtime.ErrUnavailable)
	}
	return nil
}
