package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/runtime"
)

// pausedDisk is meta.Paused of a sandbox paused to disk: no process, no
// mount, no cgroup and no veth; its upper layer is in savedDir and its
// egress address (meta.Net) stays reserved.
const pausedDisk = "disk"

// savedDir is where sandbox id's upper layer is kept while it is paused to
// disk. It is on the disk of SaveDir, not on the sandbox's tmpfs. Next to
// the layer (upper/) it holds a copy of the sandbox's meta (meta.json):
// Root is usually on a tmpfs, lost in a reboot, and the copy is what makes
// the sandbox known again. SaveDir/<id> appears whole (renamed from
// .<id>.tmp) and goes whole (renamed to .<id>.old first), so a meta.json
// there always stands for a complete layer.
func (b *Backend) savedDir(id string) string { return filepath.Join(b.opts.SaveDir, id) }

func (b *Backend) savedMetaPath(id string) string {
	return filepath.Join(b.savedDir(id), "meta.json")
}

// Names in SaveDir besides the layers of sandboxes paused to disk: a pause
// in progress (or interrupted), a layer on its way out, and the layers
// Reconcile could not adopt but would not delete.
const (
	savingSuffix  = ".tmp"
	retiredSuffix = ".old"
	quarantineDir = ".quarantine"
)

// readSaved reads the meta that SaveDir keeps of sandbox id; it fails
// unless the layer is there too.
func (b *Backend) readSaved(id string) (meta, error) {
	var m meta
	raw, err := os.ReadFile(b.savedMetaPath(id))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("%s: %w", b.savedMetaPath(id), err)
	}
	if m.Spec.ID != id || m.Paused != pausedDisk {
		return m, fmt.Errorf("%s: not a sandbox %s paused to disk", b.savedMetaPath(id), id)
	}
	if _, err := os.Lstat(filepath.Join(b.savedDir(id), "upper")); err != nil {
		return m, err
	}
	return m, nil
}

// retireSaved removes the saved layer of sandbox id once it no longer
// stands for the sandbox (it was resumed): renamed away first, so that no
// crash leaves a meta.json with part of its layer.
func (b *Backend) retireSaved(id string) error {
	old := filepath.Join(b.opts.SaveDir, "."+id+retiredSuffix)
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	if err := os.Rename(b.savedDir(id), old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.RemoveAll(old)
}

// removeSaved removes all that SaveDir holds of sandbox id: for Destroy.
func (b *Backend) removeSaved(id string) error {
	return errors.Join(b.retireSaved(id), os.RemoveAll(filepath.Join(b.opts.SaveDir, "."+id+savingSuffix)))
}

// quarantineSaved moves a saved layer that no sandbox claims but that has
// a complete meta out of the way (into SaveDir/.quarantine), instead of
// deleting what may be a user's only copy of their files.
func (b *Backend) quarantineSaved(id string) error {
	q := filepath.Join(b.opts.SaveDir, quarantineDir)
	if err := os.MkdirAll(q, 0o700); err != nil {
		return err
	}
	to := filepath.Join(q, fmt.Sprintf("%s-%d", id, time.Now().UnixNano()))
	if err := os.Rename(b.savedDir(id), to); err != nil {
		return err
	}
	b.log.Warn("saved layer of an unknown sandbox kept aside", "sandbox", id, "path", to)
	return nil
}

// Pause freezes every process of the sandbox (cgroup freezer; memory
// stays), or, for PauseDisk, ends them and keeps only the upper layer on
// disk.
func (b *Backend) Pause(ctx context.Context, id string, kind runtime.PauseKind) error {
	s, err := b.get(ctx, id)
	if err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return fmt.Errorf("pause sandbox %s: %w", id, runtime.ErrNotFound)
	}
	if s.meta.Paused == pausedDisk {
		return nil
	}
	if kind == runtime.PauseDisk {
		switch st, _ := s.ctr.Status(); st {
		case libcontainer.Paused:
			return nil // paused already, in memory
		case libcontainer.Stopped:
			return fmt.Errorf("pause sandbox %s: %w", id, runtime.ErrNotRunning)
		}
		release, err := b.claimSaveRoom(s)
		if err != nil {
			return fmt.Errorf("pause sandbox %s to disk: %w", id, err)
		}
		defer release()
		if err := b.pauseToDisk(context.WithoutCancel(ctx), s); err != nil {
			return fmt.Errorf("pause sandbox %s to disk: %w", id, err)
		}
		return nil
	}
	if err := s.ctr.Pause(); err != nil {
		if st, _ := s.ctr.Status(); st == libcontainer.Paused {
			return nil
		}
		if errors.Is(err, libcontainer.ErrNotRunning) {
			return fmt.Errorf("pause sandbox %s: %w", id, runtime.ErrNotRunning)
		}
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// Resume thaws a sandbox paused in memory, or starts one paused to disk
// afresh on its saved upper layer.
func (b *Backend) Resume(ctx context.Context, id string) (bool, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return false, fmt.Errorf("resume: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return false, fmt.Errorf("resume sandbox %s: %w", id, runtime.ErrNotFound)
	}
	if s.meta.Paused == pausedDisk {
		if err := b.resumeFromDisk(ctx, s); err != nil {
			return false, fmt.Errorf("resume sandbox %s from disk: %w", id, err)
		}
		return true, nil
	}
	if err := s.ctr.Resume(); err != nil {
		if errors.Is(err, libcontainer.ErrNotPaused) {
			if st, _ := s.ctr.Status(); st == libcontainer.Running {
				return false, nil
			}
			return false, fmt.Errorf("resume sandbox %s: %w", id, runtime.ErrNotRunning)
		}
		return false, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return false, nil
}

// claimSaveRoom fails with runtime.ErrUnsupported (the caller can pause
// in memory instead) unless SaveDir's filesystem has room for s's upper
// layer, bytes and inodes, as much as its disk tmpfs uses now, and the
// reserve of Options.SaveReserveMB on top. Layers share that filesystem
// with whatever else is there, and nothing else bounds them. What pauses
// in progress will still write counts as used; release ends s's claim.
func (b *Backend) claimSaveRoom(s *sandbox) (release func(), err error) {
	var disk, save unix.Statfs_t
	if err := unix.Statfs(s.diskDir(), &disk); err != nil {
		return nil, fmt.Errorf("room for the layer: %w", err)
	}
	if err := unix.Statfs(b.opts.SaveDir, &save); err != nil {
		return nil, fmt.Errorf("room for the layer: %w", err)
	}
	needBytes := (disk.Blocks - disk.Bfree) * frsize(&disk)
	needInodes := disk.Files - disk.Ffree
	total := save.Blocks * frsize(&save)
	var reserve, inodeReserve uint64
	switch r := b.opts.SaveReserveMB; {
	case r == 0:
		reserve = max(total/20, 256<<20)
	case r > 0:
		reserve = uint64(r) << 20
	}
	if b.opts.SaveReserveMB >= 0 {
		inodeReserve = save.Files / 20
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Overestimates: pauses in progress have written part of theirs.
	free := save.Bavail*frsize(&save) - min(save.Bavail*frsize(&save), b.saving.bytes)
	freeInodes := save.Ffree - min(save.Ffree, b.saving.inodes)
	if free < needBytes+reserve {
		return nil, fmt.Errorf("%w: %s has %d MiB free; the layer needs %d MiB and %d MiB stay free (SaveReserveMB)",
			runtime.ErrUnsupported, b.opts.SaveDir, free>>20, needBytes>>20, reserve>>20)
	}
	// Files == 0: the filesystem has no fixed number of inodes.
	if save.Files > 0 && freeInodes < needInodes+inodeReserve {
		return nil, fmt.Errorf("%w: %s has %d inodes free; the layer needs %d and %d stay free",
			runtime.ErrUnsupported, b.opts.SaveDir, freeInodes, needInodes, inodeReserve)
	}
	b.saving.bytes += needBytes
	b.saving.inodes += needInodes
	return func() {
		b.mu.Lock()
		b.saving.bytes -= needBytes
		b.saving.inodes -= needInodes
		b.mu.Unlock()
	}, nil
}

// frsize is the unit of st's block counts.
func frsize(st *unix.Statfs_t) uint64 {
	if st.Frsize > 0 {
		return uint64(st.Frsize)
	}
	return uint64(st.Bsize)
}

// pauseToDisk ends the sandbox's processes, copies its upper layer to
// savedDir and releases its tmpfs, cgroup and veth. The caller holds s.mu.
//
// The steps are ordered so that a crash at any point leaves either a
// running-shaped sandbox whose init is dead (Reconcile removes it, as any
// dead sandbox) or a complete saved layer with meta.json saying so (load
// finishes the release). The upper is copied while the tmpfs is still
// charged to the sandbox's cgroup, so its pages are freed before the cgroup
// goes.
func (b *Backend) pauseToDisk(ctx context.Context, s *sandbox) error {
	if err := s.ctr.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		return fmt.Errorf("kill: %w", err)
	}
	if err := s.waitExit(); err != nil {
		return err
	}
	saved := b.savedDir(s.id)
	tmp := filepath.Join(b.opts.SaveDir, "."+s.id+savingSuffix)
	m := s.meta
	m.Paused = pausedDisk
	err := func() error {
		if err := unmount(s.rootfsDir()); err != nil {
			return err
		}
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return err
		}
		if err := copyTree(s.upperDir(), filepath.Join(tmp, "upper")); err != nil {
			return err
		}
		if err := writeJSON(filepath.Join(tmp, "meta.json"), m); err != nil {
			return err
		}
		if err := syncDir(tmp); err != nil {
			return err
		}
		// A layer of an earlier pause whose resume did not get to remove
		// it: this sandbox's own, and stale.
		if err := os.RemoveAll(saved); err != nil {
			return err
		}
		if err := os.Rename(tmp, saved); err != nil {
			return err
		}
		// The rename, on disk: from here the layer stands for the sandbox.
		return syncDir(b.opts.SaveDir)
	}()
	if err != nil {
		// Nothing is lost yet: start the sandbox again on the upper layer
		// it still has, so that a failed pause leaves it running (afresh).
		_ = os.RemoveAll(tmp)
		_ = os.RemoveAll(saved)
		if rerr := b.restart(ctx, s); rerr != nil {
			return fmt.Errorf("save upper layer: %w (and restarting it failed: %w)", err, rerr)
		}
		return fmt.Errorf("save upper layer: %w (%w)", err, runtime.ErrRestarted)
	}
	s.meta = m
	s.exited = nil
	// SaveDir's meta.json makes the pause hold even without this one (see
	// load), which tells the state directory the same.
	if err := writeJSON(filepath.Join(s.dir, "meta.json"), m); err != nil {
		b.log.Warn("pause to disk: meta", "sandbox", s.id, "err", err)
	}
	// The pause holds from here: what could not be released now goes at
	// the next load (a restart of sandboxd), resume or destroy.
	if err := b.releaseStopped(s); err != nil {
		b.log.Warn("pause to disk: release", "sandbox", s.id, "err", err)
	}
	return nil
}

// restart starts a stopped sandbox again on the tmpfs it still has.
func (b *Backend) restart(ctx context.Context, s *sandbox) error {
	_ = s.ctr.Destroy()
	deleteLinks(s.id)
	tpl := b.templateOf(s)
	var ip netip.Addr
	if s.meta.Net != nil {
		ip = s.meta.Net.IP
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.StartTimeout)
	defer cancel()
	r := revert.New()
	defer r.Fail()
	if err := b.start(ctx, s, tpl, ip, r); err != nil {
		return err
	}
	r.Success()
	return nil
}

// releaseStopped removes what a sandbox paused to disk no longer needs: any
// process left in its cgroup, its mounts (the tmpfs with the old upper), its
// libcontainer state, veth and cgroup. It is idempotent, and also finishes a
// pause or undoes a resume that a crash interrupted.
func (b *Backend) releaseStopped(s *sandbox) error {
	cg := b.cgroupPath(s.id)
	killCgroup(cg)
	deleteLinks(s.id)
	var errs []error
	for _, d := range []string{s.rootfsDir(), s.diskDir()} {
		if err := unmount(d); err != nil {
			errs = append(errs, err)
		}
	}
	// Mounts first: the tmpfs's pages are charged to the cgroup.
	if ms, err := mountsUnder(s.dir); err != nil || len(ms) > 0 {
		errs = append(errs, fmt.Errorf("still mounted under %s: %v %w", s.dir, ms, err))
	}
	for _, p := range []string{s.diskDir(), filepath.Join(s.dir, "ctr"), filepath.Join(s.dir, "resolv.conf")} {
		if len(errs) > 0 {
			break // never remove through a mount
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeCgroup(cg); err != nil {
		errs = append(errs, err)
	}
	s.ctr = nil
	return errors.Join(errs...)
}

// resumeFromDisk builds a fresh tmpfs, restores the saved upper layer on it
// and starts the sandbox. On failure the sandbox is paused to disk as
// before. The caller holds s.mu.
//
// The restore copy and envd's start have deadlines of their own (a
// caller's deadline bounds both): the copy's grows with the disk size,
// which bounds the layer, so that a big layer is not cut off by a deadline
// meant for a start.
func (b *Backend) resumeFromDisk(ctx context.Context, s *sandbox) (err error) {
	if s.meta.Net != nil {
		if err := haveNft(); err != nil {
			return fmt.Errorf("%w: %w", runtime.ErrUnavailable, err)
		}
		if err := b.egress.setup(); err != nil {
			return fmt.Errorf("%w: %w", runtime.ErrUnavailable, err)
		}
	}
	if err := b.sameUserNS(s); err != nil {
		return err
	}
	saved := filepath.Join(b.savedDir(s.id), "upper")
	if _, err := os.Lstat(saved); err != nil {
		return fmt.Errorf("saved upper layer: %w", err)
	}
	// After a reboot (Root on a tmpfs) only SaveDir knows the sandbox.
	if err := b.makeStateDir(s.dir); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("state dir: %w", err)
	}
	// From a clean slate, should the pause have left something behind.
	if err := b.releaseStopped(s); err != nil {
		return err
	}
	r := revert.New()
	defer r.Fail()
	r.Add(func() {
		s.exited = nil
		if err := b.releaseStopped(s); err != nil {
			b.log.Warn("undo resume from disk", "sandbox", s.id, "err", err)
		}
	})
	// The restored files are written by a child process in the sandbox's
	// cgroup, so that they are charged to it as the originals were.
	copyCtx, cancel := context.WithTimeout(ctx, restoreTimeout(b.opts.StartTimeout, s.meta.Spec.DiskSizeMB))
	defer cancel()
	if err := s.prepareDisk(func(upper string) error {
		return copyTreeInCgroup(copyCtx, b.cgroupPath(s.id), saved, upper)
	}); err != nil {
		return fmt.Errorf("restore upper layer: %w", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.opts.StartTimeout)
		defer cancel()
	}
	var ip netip.Addr
	if s.meta.Net != nil {
		ip = s.meta.Net.IP
	}
	if err := b.start(ctx, s, b.templateOf(s), ip, r); err != nil {
		return err
	}
	m := s.meta
	m.Paused = ""
	if err := writeJSON(filepath.Join(s.dir, "meta.json"), m); err != nil {
		return fmt.Errorf("meta: %w", err)
	}
	s.meta = m
	r.Success()
	if err := b.retireSaved(s.id); err != nil {
		b.log.Warn("resume from disk: remove saved layer", "sandbox", s.id, "err", err)
	}
	return nil
}

// restoreTimeout bounds the copy of a saved layer back onto a disk of
// diskMB: base plus 40 ms per MiB (25 MiB/s, slower than a disk full of
// small files copies on a busy host), so a full 1 GiB disk gets 41 s more.
func restoreTimeout(base time.Duration, diskMB int) time.Duration {
	return base + time.Duration(diskMB)*40*time.Millisecond
}

// templateOf returns the template a sandbox was created from, with the
// lower directory it was created on (Reconcile keeps that directory while
// the sandbox lives, even if the template has been rebuilt since). Only
// when that directory is gone (Root was a tmpfs, and the template came
// back under another digest after a reboot: the base template's holds the
// host's /etc files) is it the template's current one, as an image update
// would give a container: without it the sandbox could never run again.
// The caller holds s.mu.
func (b *Backend) templateOf(s *sandbox) *template {
	t := template{name: s.meta.Spec.Template, lower: s.meta.Template}
	cur := b.templates[s.meta.Spec.Template]
	if cur == nil {
		return &t
	}
	t.mounts = cur.mounts
	if _, err := os.Lstat(t.lower); errors.Is(err, fs.ErrNotExist) && t.lower != cur.lower {
		b.log.Warn("template directory of the sandbox is gone: using the template's current one",
			"sandbox", s.id, "template", t.name, "was", t.lower, "now", cur.lower)
		t.lower = cur.lower
		s.meta.Template = cur.lower
	}
	return &t
}

// copyTreeArg is the os.Args[1] of the child process that restores an
// upper layer (see Init).
const copyTreeArg = "sandboxd-local-copytree"

// copyTreeInCgroup runs copyTree(src, dst) in a child process that joins
// the cgroup at path before it writes anything.
func copyTreeInCgroup(ctx context.Context, path, src, dst string) error {
	m, err := cgroupManager(path)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, copyTreeArg, src, dst)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	// The child copies only once it reads the go-ahead, after joining.
	if err := m.Apply(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("join cgroup %s: %w", path, err)
	}
	_, _ = stdin.Write([]byte{1})
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("copy %s: %w: %s", src, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// copyTreeMain is the child of copyTreeInCgroup.
func copyTreeMain(args []string) {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: "+copyTreeArg+" SRC DST")
		os.Exit(2)
	}
	var go1 [1]byte
	if n, _ := os.Stdin.Read(go1[:]); n != 1 {
		os.Exit(3) // the parent gave up
	}
	if err := copyTree(args[0], args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// copyTree copies the tree at src to dst, which must not exist, with all
// that an overlayfs upper layer holds: file types including the 0/0
// character devices of whiteouts, ownership, modes, all extended attributes
// (trusted.overlay.* marks opaque directories and more, security.capability
// file capabilities), timestamps, symlinks and hard links. It follows no
// symlink. Its source must be quiet: no process of the sandbox runs while a
// layer is copied.
//
// It works on directory fds and names (openat, mkdirat, ...), never on
// full paths: a sandbox can make paths longer than PATH_MAX (by relative
// steps), which must not make its layer impossible to save or restore. It
// holds two fds per level of depth.
func copyTree(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("copy %s: not a directory", src)
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	sf, err := openDir(unix.AT_FDCWD, src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer sf.Close()
	df, err := openDir(unix.AT_FDCWD, dst)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer df.Close()
	c := &treeCopier{root: df, links: map[fileKey]linkLoc{}}
	if err := c.dir(sf, df, nil); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	// The root's own metadata: what the entries' creation changed last.
	if err := setMeta(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, &st); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

type fileKey struct{ dev, ino uint64 }

// linkLoc is where the first copy of a hard-linked file went: its
// directory (names from the root of the copy) and name.
type linkLoc struct {
	dir  []string
	name string
}

type treeCopier struct {
	root  *os.File // dst
	links map[fileKey]linkLoc
}

// openDir opens the directory name under dirfd, following no symlink.
func openDir(dirfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// dir copies the entries of the directory src into dst; rel is dst's path
// from the root of the copy, as names.
func (c *treeCopier) dir(src, dst *os.File, rel []string) error {
	names, err := src.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", strings.Join(rel, "/"), err)
	}
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	for _, name := range names {
		if err := c.entry(sfd, dfd, name, rel); err != nil {
			if _, ok := errors.AsType[*copyError](err); ok {
				return err // named by a deeper level
			}
			return &copyError{path: path.Join(append(rel, name)...), err: err}
		}
	}
	return nil
}

// copyError is a failure of copyTree at path (relative to the tree).
type copyError struct {
	path string
	err  error
}

func (e *copyError) Error() string { return e.path + ": " + e.err.Error() }
func (e *copyError) Unwrap() error { return e.err }

// entry copies src's entry name to dst.
func (c *treeCopier) entry(sfd, dfd int, name string, rel []string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return fmt.Errorf("mkdir: %w", err)
		}
		sub, err := openDir(sfd, name)
		if err != nil {
			return err
		}
		defer sub.Close()
		dsub, err := openDir(dfd, name)
		if err != nil {
			return err
		}
		defer dsub.Close()
		if err := c.dir(sub, dsub, append(slices.Clip(rel), name)); err != nil {
			return err
		}
		// Last: creating its entries changed its times.
		return setMeta(sfd, name, dfd, name, &st)
	case unix.S_IFREG:
		k := fileKey{st.Dev, st.Ino}
		if first, ok := c.links[k]; ok {
			return c.link(first, dfd, name)
		}
		if err := copyFileAt(sfd, dfd, name, st.Size); err != nil {
			return err
		}
		if st.Nlink > 1 {
			c.links[k] = linkLoc{dir: slices.Clone(rel), name: name}
		}
	case unix.S_IFLNK:
		to, err := readlinkat(sfd, name)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(to, dfd, name); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
	case unix.S_IFCHR, unix.S_IFBLK:
		// Only overlayfs's whiteouts (0/0) belong here: a sandbox
		// cannot make device nodes, and none is ever copied to the
		// host's disk.
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			return nil
		}
		fallthrough
	default: // fifos, sockets
		if err := unix.Mknodat(dfd, name, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod: %w", err)
		}
	}
	return setMeta(sfd, name, dfd, name, &st)
}

// link makes name in dfd a hard link to the first copy at loc, reaching
// its directory one name at a time.
func (c *treeCopier) link(loc linkLoc, dfd int, name string) error {
	dir := c.root
	for _, n := range loc.dir {
		d, err := openDir(int(dir.Fd()), n)
		if dir != c.root {
			dir.Close()
		}
		if err != nil {
			return err
		}
		dir = d
	}
	if dir != c.root {
		defer dir.Close()
	}
	if err := unix.Linkat(int(dir.Fd()), loc.name, dfd, name, 0); err != nil {
		return fmt.Errorf("link: %w", err)
	}
	return nil
}

// readlinkat returns the target of the symlink name in dirfd.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", fmt.Errorf("readlink: %w", err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// fdPath names the entry name of the directory dirfd for the calls that
// have no *at form (the xattr calls): /proc/self/fd/N is followed to the
// directory, name is not followed, and the path stays short however deep
// the directory is.
func fdPath(dirfd int, name string) string {
	if dirfd == unix.AT_FDCWD {
		return name
	}
	return "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
}

// setMeta gives the copy dname in dfd the ownership, mode, extended
// attributes and times of the original (st, sname in sfd).
func setMeta(sfd int, sname string, dfd int, dname string, st *unix.Stat_t) error {
	// chown clears setuid bits and file capabilities: it goes first.
	if err := unix.Fchownat(dfd, dname, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(dfd, dname, st.Mode&0o7777, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := copyXattrs(fdPath(sfd, sname), fdPath(dfd, dname)); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(dfd, dname, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("utimes: %w", err)
	}
	return nil
}

// copyFileAt copies the regular file name of sfd to a new file name in
// dfd, keeping its holes: a sandbox can make a sparse file far larger than
// its disk, which must take no more room on the host's disk (or on its
// tmpfs when it comes back) than it did.
func copyFileAt(sfd, dfd int, name string, size int64) error {
	ifd, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	in := os.NewFile(uintptr(ifd), name)
	defer in.Close()
	ofd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	out := os.NewFile(uintptr(ofd), name)
	if err := copyData(in, out, size); err != nil {
		out.Close()
		return fmt.Errorf("copy: %w", err)
	}
	return out.Close()
}

// copyData copies the data extents of in (SEEK_DATA/SEEK_HOLE) to the same
// offsets of out and sets out's size.
func copyData(in, out *os.File, size int64) error {
	fd := int(in.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		hole = min(hole, size)
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// copyXattrs copies every extended attribute of src to dst (neither
// followed if a symlink).
func copyXattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		return fmt.Errorf("list xattrs of %s: %w", src, err)
	}
	for _, name := range names {
		val, err := getXattr(src, name)
		if err != nil {
			return fmt.Errorf("get xattr %s of %s: %w", name, src, err)
		}
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", name, dst, err)
		}
	}
	return nil
}

func listXattrs(p string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := unix.Llistxattr(p, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, sz+64)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
}

func getXattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := unix.Lgetxattr(p, name, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, sz+64)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// syncDir flushes the tree at dir to disk, so that a saved layer that
// meta.json points to is there after a power loss too.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
