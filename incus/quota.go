package incus

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The btrfs pool enforces the sizes of sandboxes' roots and of volumes
// with quota groups. The kernel stops keeping them when it marks them
// inconsistent (seen after Incus's snapshot and subvolume work during a
// test run), and then no size holds: a 32 MiB volume took 64 MB. Only a
// rescan brings them back, so the backend looks before each create and
// volume create and every quotaCheckEvery, and rescans when they are.

// quotaCheckEvery is how often the background check looks.
const quotaCheckEvery = 5 * time.Second

// btrfs ioctls (linux/btrfs.h): BTRFS_IOC_FS_INFO, _IOR(0x94, 31, 1024
// bytes); BTRFS_IOC_QUOTA_RESCAN, _IOW(0x94, 44, 64 bytes);
// BTRFS_IOC_QUOTA_RESCAN_WAIT, _IO(0x94, 46).
const (
	iocFSInfo           = 2<<30 | 1024<<16 | 0x94<<8 | 31
	iocQuotaRescan      = 1<<30 | 64<<16 | 0x94<<8 | 44
	iocQuotaRescanWait  = 0x94<<8 | 46
	btrfsSuperMagic     = 0x9123683e
	fsInfoFSIDOffset    = 16
	quotaRescanArgsSize = 64

	// BTRFS_IOC_INO_LOOKUP, _IOWR(0x94, 18, 4096 bytes), and
	// BTRFS_IOC_TREE_SEARCH, _IOWR(0x94, 17, 4096 bytes): a subvolume's id,
	// and its quota group's item in the quota tree.
	iocInoLookup      = 3<<30 | 4096<<16 | 0x94<<8 | 18
	iocTreeSearch     = 3<<30 | 4096<<16 | 0x94<<8 | 17
	firstFreeObjectID = 256
	quotaTreeID       = 8
	qgroupInfoKey     = 242
	searchKeySize     = 104 // struct btrfs_ioctl_search_key
	searchHeaderSize  = 32  // struct btrfs_ioctl_search_header
)

// quotaGuard watches the quota groups of the filesystem at dir.
type quotaGuard struct {
	dir          string
	inconsistent string // its sysfs file, "" when there is none to read
	// simple: the filesystem keeps simple quotas (squota, Linux 6.7+;
	// scripts/incus-setup.sh turns them on): an extent counts against the
	// subvolume that wrote it, not against every one that shares it, so a
	// clone's size limits only what it writes, and none is ever
	// inconsistent.
	simple bool
}

// newQuotaGuard finds the sysfs file of dir's btrfs filesystem; a
// filesystem that is not btrfs, or a kernel without the file, gets a guard
// that never acts.
func newQuotaGuard(dir string) *quotaGuard {
	g := &quotaGuard{dir: dir}
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil || st.Type != btrfsSuperMagic {
		return g
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return g
	}
	defer unix.Close(fd)
	var info [1024]byte
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocFSInfo, uintptr(unsafe.Pointer(&info[0]))); e != 0 {
		return g
	}
	u := info[fsInfoFSIDOffset : fsInfoFSIDOffset+16]
	fsid := fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	p := filepath.Join("/sys/fs/btrfs", fsid, "qgroups", "inconsistent")
	if _, err := os.Stat(p); err == nil {
		g.inconsistent = p
	}
	mode, _ := os.ReadFile(filepath.Join("/sys/fs/btrfs", fsid, "qgroups", "mode"))
	g.simple = strings.TrimSpace(string(mode)) == "squota"
	return g
}

// check rescans the quota groups when the kernel has marked them
// inconsistent, and waits for the rescan (bounded by ctx). It reports
// whether it rescanned.
func (g *quotaGuard) check(ctx context.Context) (bool, error) {
	if g.inconsistent == "" {
		return false, nil
	}
	raw, err := os.ReadFile(g.inconsistent)
	if err != nil || strings.TrimSpace(string(raw)) != "1" {
		return false, nil
	}
	fd, err := unix.Open(g.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("btrfs quota rescan: %w", err)
	}
	var args [quotaRescanArgsSize]byte
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocQuotaRescan, uintptr(unsafe.Pointer(&args[0])))
	if e != 0 && !errors.Is(e, unix.EINPROGRESS) { // one under way is as good
		unix.Close(fd)
		return false, fmt.Errorf("btrfs quota rescan: %w", e)
	}
	done := make(chan error, 1)
	go func() { // owns fd: a wait that outlives ctx still has it
		defer unix.Close(fd)
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocQuotaRescanWait, 0)
		if e != 0 {
			done <- fmt.Errorf("btrfs quota rescan: wait: %w", e)
			return
		}
		done <- nil
	}()
	select {
	case err := <-done:
		return true, err
	case <-ctx.Done():
		// The rescan goes on in the kernel.
		return true, ctx.Err()
	}
}

// ensureQuota is quotaGuard.check with a log line when it rescanned.
func (b *Backend) ensureQuota(ctx context.Context) {
	rescanned, err := b.quota.check(ctx)
	switch {
	case err != nil:
		b.log.Warn("incus: btrfs quota groups are inconsistent, so sizes are not enforced; rescan failed", "err", err)
	case rescanned:
		b.log.Warn("incus: btrfs quota groups were inconsistent (sizes not enforced); rescanned")
	}
}

// watchQuota runs ensureQuota every quotaCheckEvery until Close.
func (b *Backend) watchQuota() {
	t := time.NewTicker(quotaCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-b.closing.Done():
			return
		case <-t.C:
			b.ensureQuota(b.closing)
		}
	}
}

// referencedBytes is what btrfs counts against the size of the subvolume at
// dir: the bytes its quota group references, shared or not. A layer's
// root holds that much of every root cloned from it, which Incus's size
// (a limit on the referenced bytes) must allow for. An error when dir is
// not a btrfs subvolume with quotas on.
func referencedBytes(dir string) (int64, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var lookup [4096]byte // treeid, objectid, name
	binary.LittleEndian.PutUint64(lookup[8:], firstFreeObjectID)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocInoLookup, uintptr(unsafe.Pointer(&lookup[0]))); e != 0 {
		return 0, fmt.Errorf("btrfs subvolume id of %s: %w", dir, e)
	}
	subvol := binary.LittleEndian.Uint64(lookup[0:])
	var args [4096]byte
	key := args[:searchKeySize]
	binary.LittleEndian.PutUint64(key[0:], quotaTreeID) // tree_id
	// min/max objectid 0 (a level-0 group's info item), min/max offset the
	// group id (the subvolume's), any transid.
	binary.LittleEndian.PutUint64(key[24:], subvol)
	binary.LittleEndian.PutUint64(key[32:], subvol)
	binary.LittleEndian.PutUint64(key[48:], ^uint64(0))
	binary.LittleEndian.PutUint32(key[56:], qgroupInfoKey)
	binary.LittleEndian.PutUint32(key[60:], qgroupInfoKey)
	binary.LittleEndian.PutUint32(key[64:], 1) // nr_items
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocTreeSearch, uintptr(unsafe.Pointer(&args[0]))); e != 0 {
		return 0, fmt.Errorf("btrfs quota group of %s: %w", dir, e)
	}
	if binary.LittleEndian.Uint32(key[64:]) != 1 {
		return 0, fmt.Errorf("btrfs quota group of %s: none (quotas off?)", dir)
	}
	hdr := args[searchKeySize:]
	if binary.LittleEndian.Uint64(hdr[8:]) != 0 || binary.LittleEndian.Uint64(hdr[16:]) != subvol ||
		binary.LittleEndian.Uint32(hdr[24:]) != qgroupInfoKey || binary.LittleEndian.Uint32(hdr[28:]) < 16 {
		return 0, fmt.Errorf("btrfs quota group of %s: unexpected item", dir)
	}
	item := hdr[searchHeaderSize:] // generation, rfer, rfer_cmpr, excl, excl_cmpr
	return int64(binary.LittleEndian.Uint64(item[8:])), nil
}
