package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/faultinject"
	"github.com/sandboxd/sandboxd/revert"
	"github.com/sandboxd/sandboxd/runtime"
)

// Volumes (runtime.VolumeStore). Each volume is a directory under
// Options.VolumeDir:
//
//	<id>/image   an ext4 filesystem image, sparse, of the volume's size
//	<id>/mnt     where the image is loop-mounted (nosuid, nodev)
//	<id>/mnt/data  the volume's files: what sandboxes and the content API see
//	<id>/view    data idmapped for sandboxes in a user namespace
//
// Why a loop-mounted ext4 image: the kernel enforces the size on every
// writer (a sandbox gets ENOSPC, and so does the content API), it lives on
// disk and so survives sandboxd restarts, reboots and the sandboxes that used
// it, and it needs nothing of the filesystem under VolumeDir (a project
// quota would need XFS or ext4 mounted with prjquota; a tmpfs is not
// durable). The files keep the owners the sandboxes see (uid 1000 is the
// template's user): sandboxes in a user namespace mount the idmapped view,
// which shifts them into the namespace's range.
//
// The mounts are the host's: they outlive a crash of sandboxd and are found
// again (ensureVolume), and a volume whose image is no longer mounted (a
// reboot) is mounted again on first use.

// volumeOwner owns a new volume's root: the templates' `user`, so that a
// sandbox's default user can write to it as E2B's do.
const volumeOwner = 1000

func (b *Backend) volumeDir(id string) string { return filepath.Join(b.opts.VolumeDir, id) }

// volumeData is the host path of volume id's files.
func (b *Backend) volumeData(id string) string { return filepath.Join(b.volumeDir(id), "mnt", "data") }

var _ runtime.VolumeStore = (*Backend)(nil)

// CreateVolume makes volume id: an ext4 image of sizeMB MiB, mounted.
func (b *Backend) CreateVolume(ctx context.Context, id string, sizeMB int) error {
	if !runtime.ValidID(id) || sizeMB < 8 {
		return fmt.Errorf("create volume %s: %w: bad id or size %d MiB (at least 8)", id, runtime.ErrInvalidSpec, sizeMB)
	}
	b.volMu.Lock()
	defer b.volMu.Unlock()
	if err := os.MkdirAll(b.opts.VolumeDir, 0o700); err != nil {
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	dir := b.volumeDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create volume %s: %w", id, runtime.ErrAlreadyExists)
		}
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	r := revert.New()
	defer r.Fail()
	r.Add(func() {
		if err := b.removeVolume(id); err != nil {
			b.log.Warn("undo create volume", "volume_id", id, "err", err)
		}
	})
	image := filepath.Join(dir, "image")
	f, err := os.OpenFile(image, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	err = f.Truncate(int64(sizeMB) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("create volume %s: image: %w", id, err)
	}
	// No blocks reserved for root: root inside a sandbox gets ENOSPC at
	// the same size as everyone else. Lazy init keeps mkfs fast.
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-L", "sbxvol",
		"-E", "lazy_itable_init=1,lazy_journal_init=1", image).CombinedOutput()
	if err != nil {
		return fmt.Errorf("create volume %s: %w: mkfs.ext4: %w: %s", id, runtime.ErrUnavailable, err, strings.TrimSpace(string(out)))
	}
	faultinject.Pause("volume-create-backend", id)
	if err := b.mountVolume(ctx, id); err != nil {
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	data := b.volumeData(id)
	if err := os.Mkdir(data, 0o755); err != nil {
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	if err := os.Chown(data, volumeOwner, volumeOwner); err != nil {
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "mnt", "lost+found")); err != nil {
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	r.Success()
	return nil
}

// mountVolume loop-mounts volume id's image at mnt unless it is mounted.
// mount(8) sets up the loop device with autoclear: the unmount frees it.
func (b *Backend) mountVolume(ctx context.Context, id string) error {
	dir := b.volumeDir(id)
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if mounted, err := mountinfo.Mounted(mnt); err != nil {
		return err
	} else if mounted {
		return nil
	}
	out, err := exec.CommandContext(ctx, "mount", "-t", "ext4", "-o", "loop,nosuid,nodev", filepath.Join(dir, "image"), mnt).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: mount image: %w: %s", runtime.ErrUnavailable, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ensureVolume makes volume id usable (mounted, and with its idmapped view
// when view), after a reboot or a crash too. Called with volMu held.
func (b *Backend) ensureVolume(ctx context.Context, id string, view bool) error {
	if _, err := os.Stat(filepath.Join(b.volumeDir(id), "image")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("volume %s: %w", id, runtime.ErrNotFound)
		}
		return fmt.Errorf("volume %s: %w", id, err)
	}
	if err := b.mountVolume(ctx, id); err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	if _, err := os.Stat(b.volumeData(id)); err != nil {
		// A create that crashed before its data directory: not a volume.
		return fmt.Errorf("volume %s: %w", id, runtime.ErrNotFound)
	}
	if view {
		dst := filepath.Join(b.volumeDir(id), "view")
		if err := os.MkdirAll(dst, 0o700); err != nil {
			return err
		}
		if mounted, err := mountinfo.Mounted(dst); err != nil {
			return err
		} else if !mounted {
			if err := idmapMount(b.volumeData(id), dst, 0); err != nil {
				return fmt.Errorf("volume %s: %w: %w", id, runtime.ErrUnavailable, err)
			}
		}
	}
	return nil
}

// removeVolume unmounts and removes whatever exists of volume id.
func (b *Backend) removeVolume(id string) error {
	dir := b.volumeDir(id)
	for _, m := range []string{"view", "mnt"} {
		p := filepath.Join(dir, m)
		if mounted, err := mountinfo.Mounted(p); err == nil && mounted {
			if err := unix.Unmount(p, unix.UMOUNT_NOFOLLOW); err != nil {
				// Busy (a process of ours has a file open): detach, the
				// kernel frees it with the last user.
				detach(p)
			}
		}
	}
	faultinject.Pause("volume-delete-backend", id)
	return os.RemoveAll(dir)
}

// DeleteVolume removes volume id unless a live sandbox mounts it.
func (b *Backend) DeleteVolume(_ context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	b.volMu.Lock()
	defer b.volMu.Unlock()
	b.mu.Lock()
	var users []string
	for sid, s := range b.sbx {
		for _, m := range s.meta.Spec.Mounts {
			if m.Volume == id {
				users = append(users, sid)
			}
		}
	}
	b.mu.Unlock()
	if len(users) > 0 {
		return fmt.Errorf("delete volume %s: %w: mounted by %s", id, runtime.ErrInUse, strings.Join(users, ", "))
	}
	if err := b.removeVolume(id); err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	return nil
}

// OpenVolume returns the root of volume id's files.
func (b *Backend) OpenVolume(ctx context.Context, id string) (*os.Root, error) {
	if !runtime.ValidID(id) {
		return nil, fmt.Errorf("volume %s: %w", id, runtime.ErrNotFound)
	}
	b.volMu.Lock()
	err := b.ensureVolume(ctx, id, false)
	b.volMu.Unlock()
	if err != nil {
		return nil, err
	}
	return os.OpenRoot(b.volumeData(id))
}

// Volumes lists the volume directories, complete or not.
func (b *Backend) Volumes(context.Context) ([]string, error) {
	ents, err := os.ReadDir(b.opts.VolumeDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && runtime.ValidID(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// volumeMounts makes the volumes of s's spec usable and returns their
// bind mounts, shallower paths first so that a deeper one is not hidden.
func (b *Backend) volumeMounts(ctx context.Context, s *sandbox) ([]specs.Mount, error) {
	ms := s.meta.Spec.Mounts
	if len(ms) == 0 {
		return nil, nil
	}
	b.volMu.Lock()
	defer b.volMu.Unlock()
	out := make([]specs.Mount, 0, len(ms))
	for _, m := range ms {
		if err := b.ensureVolume(ctx, m.Volume, s.meta.UserNS); err != nil {
			if errors.Is(err, runtime.ErrNotFound) {
				return nil, fmt.Errorf("%w: mount %s: %w", runtime.ErrInvalidSpec, m.Path, err)
			}
			return nil, err
		}
		src := b.volumeData(m.Volume)
		if s.meta.UserNS {
			src = filepath.Join(b.volumeDir(m.Volume), "view")
		}
		out = append(out, specs.Mount{Destination: m.Path, Source: src, Type: "bind",
			Options: []string{"bind", "rw", "nosuid", "nodev"}})
	}
	depth := func(p string) int { return strings.Count(p, "/") }
	for i := 1; i < len(out); i++ { // insertion sort by depth, stable
		for j := i; j > 0 && depth(out[j].Destination) < depth(out[j-1].Destination); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}
