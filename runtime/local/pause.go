package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
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
	m.upgrade()
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
	s, err := b.lockLive(ctx, id)
	if err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	defer s.mu.Unlock()
	if s.meta.Paused == pausedDisk {
		return nil
	}
	ctr, err := s.container()
	if err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	if kind == runtime.PauseDisk {
		switch st, _ := ctr.Status(); st {
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
	if err := freeze(ctx, ctr); err != nil {
		if st, _ := ctr.Status(); st == libcontainer.Paused {
			s.frozen = true
			b.disarmWriters(s, true)
			return nil
		}
		if errors.Is(err, libcontainer.ErrNotRunning) {
			return fmt.Errorf("pause sandbox %s: %w", id, runtime.ErrNotRunning)
		}
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	s.frozen = true
	// Frozen, nothing writes: what it wrote is queued, and handled first.
	b.disarmWriters(s, true)
	return nil
}

// Resume thaws a sandbox paused in memory, or starts one paused to disk
// afresh on its saved upper layer.
func (b *Backend) Resume(ctx context.Context, id string) (bool, error) {
	s, err := b.lockLive(ctx, id)
	if err != nil {
		return false, fmt.Errorf("resume: %w", err)
	}
	defer s.mu.Unlock()
	if s.meta.Paused == pausedDisk {
		if err := b.resumeFromDisk(ctx, s); err != nil {
			return false, fmt.Errorf("resume sandbox %s from disk: %w", id, err)
		}
		return true, nil
	}
	ctr, err := s.container()
	if err != nil {
		return false, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	// Armed before the thaw, so that nothing it writes then is missed.
	b.armWriters(s, s.initPid)
	if err := ctr.Resume(); err != nil {
		if errors.Is(err, libcontainer.ErrNotPaused) {
			if st, _ := ctr.Status(); st == libcontainer.Running {
				s.frozen = false
				return false, nil
			}
			b.disarmWriters(s, false)
			return false, fmt.Errorf("resume sandbox %s: %w", id, runtime.ErrNotRunning)
		}
		b.disarmWriters(s, false)
		return false, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	s.frozen = false
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
	ctr, err := s.container()
	if err != nil {
		return err
	}
	if err := ctr.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		return fmt.Errorf("kill: %w", err)
	}
	if err := s.waitExit(); err != nil {
		return err
	}
	// The layer's inodes do not survive the copy: its writers go by path
	// from here (writerRecord.toHandles turns them back at the resume).
	byPath, err := b.writersByPath(s)
	if err != nil {
		b.log.Warn("pause to disk: writers", "sandbox", s.id, "err", err)
	}
	saved := b.savedDir(s.id)
	tmp := filepath.Join(b.opts.SaveDir, "."+s.id+savingSuffix)
	m := s.meta
	m.Paused = pausedDisk
	err = func() error {
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
	s.exited, s.initPid, s.killInit = nil, 0, nil
	b.disarmWriters(s, false)
	if s.writers != nil {
		if byPath == nil {
			byPath = map[string]*runtime.Writer{}
		}
		s.writers.mu.Lock()
		s.writers.byPath, s.writers.byHandle = byPath, nil
		s.writers.mu.Unlock()
	}
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
	if ctr, _ := s.container(); ctr != nil {
		_ = ctr.Destroy()
	}
	s.ctr, s.ctrRoot, s.ctrErr = nil, "", nil
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
	if err := b.start(ctx, s, tpl, ip, nil, r); err != nil {
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
	cg := openCgroup(b.cgroupPath(s.id))
	cg.kill()
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
	if err := cg.remove(); err != nil {
		errs = append(errs, err)
	}
	s.ctr, s.ctrRoot, s.ctrErr = nil, "", nil
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
		if err := b.egress.setup(); err != nil {
			return fmt.Errorf("%w: %w", runtime.ErrUnavailable, err)
		}
	}
	if err := b.startableUserNS(s); err != nil {
		return err
	}
	saved := filepath.Join(b.savedDir(s.id), "upper")
	if _, err := os.Lstat(saved); err != nil {
		return fmt.Errorf("saved upper layer: %w", err)
	}
	// After a reboot (Root on a tmpfs) only SaveDir knows the sandbox.
	if err := makeStateDir(s.dir, s.meta.UserNS); err != nil && !errors.Is(err, fs.ErrExist) {
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
	if rec := s.writers; rec != nil {
		rec.mu.Lock()
		byPath := rec.byPath
		err := rec.toHandles(s.upperDir())
		rec.mu.Unlock()
		if err != nil {
			b.log.Warn("resume from disk: writers", "sandbox", s.id, "err", err)
		}
		r.Add(func() { // still paused to disk: by path again
			rec.mu.Lock()
			rec.byPath, rec.byHandle = byPath, nil
			rec.mu.Unlock()
		})
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
	if err := b.start(ctx, s, b.templateOf(s), ip, nil, r); err != nil {
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

// templateOf returns what a sandbox was created from: the lower
// directories it was created on (Reconcile keeps them while the sandbox
// lives, whatever happens to its template since) and the mounts of its
// base template. Only when the base's directory, the bottom one, is gone
// (Root was a tmpfs, and the template came back under another digest
// after a reboot: the host view's holds the host's /etc files) is it
// the base's current one, as an image update would give a container:
// without it the sandbox could never run again. Layers have no such
// fallback: their keys name their content. The caller holds s.mu.
func (b *Backend) templateOf(s *sandbox) *template {
	t := template{name: s.meta.Spec.Template, lowers: slices.Clone(s.meta.Lowers), base: s.meta.Base}
	cur := b.template(s.meta.Base)
	if cur == nil || cur.defined || len(t.lowers) == 0 {
		return &t
	}
	t.mounts = cur.mounts
	bottom := len(t.lowers) - 1
	if _, err := os.Lstat(t.lowers[bottom]); errors.Is(err, fs.ErrNotExist) && t.lowers[bottom] != cur.lower() {
		b.log.Warn("template directory of the sandbox is gone: using the template's current one",
			"sandbox", s.id, "template", t.base, "was", t.lowers[bottom], "now", cur.lower())
		t.lowers[bottom] = cur.lower()
		s.meta.Lowers = slices.Clone(t.lowers)
		if s.meta.Template != "" {
			s.meta.Template = cur.lower()
		}
	}
	return &t
}
