package incus

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/faultinject"
	"github.com/sandboxd/sandboxd/runtime"
)

// Volumes (runtime.VolumeStore) are Incus custom storage volumes on the
// backend's pool, tagged with keyVolume (and keyNamespace), attached to a
// sandbox's container as disk devices. Incus enforces the size (the pool's
// quota: a btrfs qgroup), keeps the volume whatever happens to the
// containers, attaches one volume to several containers at once, and maps
// its owners into each unprivileged container (idmapped mounts), so files
// keep the ids the sandboxes see. The content API reaches the files at the
// volume's path under IncusDir.

const keyVolume = "user.sandboxd.volume"

// volumeOwner owns a new volume's root: the templates' `user`.
const volumeOwner = 1000

var _ runtime.VolumeStore = (*Backend)(nil)

// volumeName is volume id's custom volume name.
func (b *Backend) volumeName(id string) string {
	if b.opts.Namespace != "" {
		return "sbxv-" + b.opts.Namespace + "-" + id
	}
	return "sbxv-" + id
}

// volumePath is where volume id's files are on the host.
func (b *Backend) volumePath(id string) string {
	project := b.c.Project
	if project == "" {
		project = "default"
	}
	return filepath.Join(b.opts.IncusDir, "storage-pools", b.opts.Pool, "custom", project+"_"+b.volumeName(id))
}

// CreateVolume creates volume id of sizeMB MiB on the pool.
func (b *Backend) CreateVolume(ctx context.Context, id string, sizeMB int) error {
	if !runtime.ValidID(id) || sizeMB < 8 {
		return fmt.Errorf("create volume %s: %w: bad id or size %d MiB (at least 8)", id, runtime.ErrInvalidSpec, sizeMB)
	}
	if b.cluster != nil {
		// A volume's files are on one member, and the content API reads
		// them through the host's filesystem (OpenVolume).
		return fmt.Errorf("create volume %s: %w: volumes on a remote Incus or a cluster", id, runtime.ErrUnsupported)
	}
	// security.shifted: attached through idmapped mounts, never shifted on
	// disk, so the files keep the ids the sandboxes see (and the content
	// API reads them as such) whichever container attached them first.
	b.ensureQuota(ctx) // the size below holds only with consistent quota groups
	cfg := map[string]string{"size": strconv.Itoa(sizeMB) + "MiB", "security.shifted": "true", keyVolume: id}
	if b.opts.Namespace != "" {
		cfg[keyNamespace] = b.opts.Namespace
	}
	if err := b.c.CreateStorageVolume(ctx, b.opts.Pool, StorageVolumesPost{
		Name: b.volumeName(id), ContentType: "filesystem", Config: cfg, Description: "sandboxd volume",
	}); err != nil {
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	faultinject.Pause("volume-create-backend", id)
	// The sandbox's user owns the root, as on the local backend.
	if err := os.Chown(b.volumePath(id), volumeOwner, volumeOwner); err != nil {
		_ = b.c.DeleteStorageVolume(context.WithoutCancel(ctx), b.opts.Pool, b.volumeName(id))
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	return nil
}

// DeleteVolume deletes volume id unless an instance attaches it.
func (b *Backend) DeleteVolume(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	v, err := b.c.StorageVolume(ctx, b.opts.Pool, b.volumeName(id))
	if errors.Is(err, runtime.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	if len(v.UsedBy) > 0 && b.awaitDeletes(ctx, v.UsedBy) {
		// Destroy deletes instances in the background: a volume used only
		// by sandboxes already destroyed is free once they are gone.
		if v, err = b.c.StorageVolume(ctx, b.opts.Pool, b.volumeName(id)); err != nil {
			return fmt.Errorf("delete volume %s: %w", id, err)
		}
	}
	if len(v.UsedBy) > 0 {
		var users []string
		for _, u := range v.UsedBy {
			users = append(users, strings.TrimPrefix(filepath.Base(u), "sbx-"))
		}
		return fmt.Errorf("delete volume %s: %w: mounted by %s", id, runtime.ErrInUse, strings.Join(users, ", "))
	}
	faultinject.Pause("volume-delete-backend", id)
	if err := b.c.DeleteStorageVolume(ctx, b.opts.Pool, b.volumeName(id)); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	return nil
}

// awaitDeletes waits for the deletions in progress of the instances in
// usedBy (API paths) and reports whether there were any.
func (b *Backend) awaitDeletes(ctx context.Context, usedBy []string) bool {
	users := map[string]bool{}
	for _, u := range usedBy {
		users[path.Base(u)] = true
	}
	b.mu.Lock()
	var waits []chan struct{}
	for id, ch := range b.deleting {
		if users[InstanceName(b.opts.Namespace, id)] {
			waits = append(waits, ch)
		}
	}
	b.mu.Unlock()
	return len(waits) > 0 && waitClosed(ctx, waits) == nil
}

// OpenVolume returns the root of volume id's files on the host.
func (b *Backend) OpenVolume(ctx context.Context, id string) (*os.Root, error) {
	if !runtime.ValidID(id) {
		return nil, fmt.Errorf("volume %s: %w", id, runtime.ErrNotFound)
	}
	if _, err := b.c.StorageVolume(ctx, b.opts.Pool, b.volumeName(id)); err != nil {
		return nil, fmt.Errorf("volume %s: %w", id, err)
	}
	return os.OpenRoot(b.volumePath(id))
}

// Volumes lists this backend's volumes (its namespace's).
func (b *Backend) Volumes(ctx context.Context) ([]string, error) {
	vs, err := b.c.StorageVolumes(ctx, b.opts.Pool)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	var out []string
	for _, v := range vs {
		if id := v.Config[keyVolume]; id != "" && v.Config[keyNamespace] == b.opts.Namespace {
			out = append(out, id)
		}
	}
	return out, nil
}

// volumeDevices are the disk devices of a spec's mounts.
func (b *Backend) volumeDevices(ms []runtime.Mount) map[string]map[string]string {
	out := map[string]map[string]string{}
	for i, m := range ms {
		out["vol"+strconv.Itoa(i)] = map[string]string{"type": "disk", "pool": b.opts.Pool, "source": b.volumeName(m.Volume), "path": m.Path}
	}
	return out
}
