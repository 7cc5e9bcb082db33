package incus

import (
	"context"
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
)

// quotaGuard watches the quota groups of the filesystem at dir.
type quotaGuard struct {
	dir          string
	inconsistent string // its sysfs file, "" when there is none to read
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
