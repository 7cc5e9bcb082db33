package local

import (
	"maps"
	"slices"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime"
)

// capabilities are what a dev box needs as root: Docker's default set
// without CAP_NET_RAW and CAP_MKNOD. No CAP_SYS_ADMIN, so no mounts, no
// namespaces of its own and no device access; no CAP_SYS_PTRACE beyond the
// sandbox (the pid namespace bounds ptrace anyway).
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_SETFCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE",
}

// maskedPaths and readonlyPaths are runc's and Docker's defaults.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
		"/proc/sched_debug", "/proc/scsi", "/sys/firmware",
		"/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// specInput is what ociSpec needs to describe one sandbox.
type specInput struct {
	spec      runtime.Spec // resources defaulted
	pidsMax   int64
	swap      bool // the memory cgroup has memsw files
	rootfs    string
	tpl       *template
	envdHost  string // host path of the envd binary
	socketDir string // host path of the per-sandbox socket directory
	cgroup    string // cgroup path, e.g. /sandboxd/<id>
	seccomp   bool
	logLevel  string // envd's --log-level
	resolv    string // host file bind-mounted as /etc/resolv.conf; empty: the template's
	userNS    bool
	// delegate mounts the sandbox's cgroup (its cgroup namespace's root)
	// read-write at /sys/fs/cgroup, a subtree delegated to its root
	// (delegateCgroup).
	delegate bool
	// volumes are the bind mounts of the sandbox's volumes
	// (Backend.volumeMounts).
	volumes []specs.Mount
}

// cpuShares is a running sandbox's share of the CPU against the others:
// one CPU's worth (1024, the kernel's default) per CPU it may use.
func cpuShares(cpus int) uint64 { return uint64(1024 * cpus) }

// backgroundCPUShares is the least share the kernel takes (cpu.weight 1 on
// cgroup v2): a background create's start (runtime.Spec.Background) runs
// on the CPU time the creates someone waits for leave.
const backgroundCPUShares = 2

// ociSpec describes a sandbox as an OCI runtime spec, which specconv turns
// into libcontainer's config the way runc does, with runc's defaults for
// devices.
func ociSpec(in specInput) *specs.Spec {
	s := in.spec
	// The writable layer is a tmpfs, and tmpfs pages are charged to the
	// memory cgroup of whoever writes them. With a limit of MemoryMB alone, a
	// sandbox filling its disk would be OOM-killed (envd first) instead of
	// getting ENOSPC. So the cgroup also holds the disk's worth: files are
	// still bounded by the tmpfs size (DiskSizeMB), and processes by
	// MemoryMB plus whatever the disk does not use.
	mem := int64(s.MemoryMB+s.DiskSizeMB) << 20
	cpuPeriod := uint64(100000)
	cpuQuota := int64(s.CPUCount) * int64(cpuPeriod)
	cpuShares := cpuShares(s.CPUCount)
	if s.Background {
		cpuShares = backgroundCPUShares // until envd answers (start)
	}
	memory := &specs.LinuxMemory{Limit: &mem}
	if in.swap {
		memory.Swap = &mem // memory+swap = memory: no swap
	}

	// The spec's variables override the defaults: one entry per name, since
	// getenv takes the first of duplicates.
	vars := map[string]string{"PATH": defaultPath, "HOME": "/root", "E2B_SANDBOX": "true", "E2B_SANDBOX_ID": s.ID}
	maps.Copy(vars, s.Env)
	var env []string
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		env = append(env, k+"="+vars[k])
	}

	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	if in.delegate {
		// With its own cgroup namespace the sandbox gets a cgroup2 mount
		// whose root is its cgroup (libcontainer mounts it afresh, not a
		// bind of the host's), read-write below the read-only /sys: what
		// root inside may change there is what delegateCgroup gave it.
		mounts = append(mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "rw"}})
	}
	mounts = append(mounts, in.tpl.mounts...)
	mounts = append(mounts,
		specs.Mount{Destination: envdPath, Source: in.envdHost, Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: envdSocketDir, Source: in.socketDir, Type: "bind", Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
	)

	if in.resolv != "" {
		mounts = append(mounts, specs.Mount{Destination: "/etc/resolv.conf", Source: in.resolv, Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	mounts = append(mounts, in.volumes...)

	sp := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: in.rootfs},
		Hostname: s.ID,
		Process: &specs.Process{
			Args: []string{
				envdPath, "--init",
				"--socket", envdSocketDir + "/envd.sock",
				"--listen", "127.0.0.1:" + strconv.Itoa(runtime.EnvdPort),
				"--log-level", in.logLevel,
			},
			Env: env,
			Cwd: "/",
			// Setuid programs work (sudo, as in E2B's sandboxes): what they
			// give is root inside, which the API gives anyone with the
			// sandbox anyway; root inside keeps the bounding set above and
			// the seccomp profile, and with a user namespace is no one on
			// the host. Docker's default too.
			NoNewPrivileges: false,
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  capabilities,
				Effective: capabilities,
				Permitted: capabilities,
			},
		},
		Mounts: mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
			},
			CgroupsPath:   in.cgroup,
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  memory,
				CPU:     &specs.LinuxCPU{Quota: &cpuQuota, Period: &cpuPeriod, Shares: &cpuShares},
				Pids:    &specs.LinuxPids{Limit: &in.pidsMax},
			},
		},
	}
	if in.seccomp {
		sp.Linux.Seccomp = seccompProfile()
	}
	if in.userNS {
		userNSSpec(sp)
	}
	return sp
}

// seccompProfile blocks what containers normally block, as a deny list
// (default allow) so that new syscalls that compilers, runtimes and package
// managers adopt keep working: kernel keyrings, BPF, perf, userfaultfd,
// io_uring, module and kexec loading, handle-based opens, every mount API,
// new namespaces (unshare, setns, and clone with namespace flags; clone3 says
// ENOSYS so libc falls back to clone, whose flags seccomp can see), clock and
// swap changes, and other host-wide knobs. Only the native architecture is
// allowed, so 32-bit syscall numbers cannot slip past the names.
func seccompProfile() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	deny := []string{
		"keyctl", "add_key", "request_key",
		"bpf", "perf_event_open", "userfaultfd", "fanotify_init", "lookup_dcookie",
		"io_uring_setup", "io_uring_enter", "io_uring_register",
		"init_module", "finit_module", "delete_module", "create_module",
		"query_module", "get_kernel_syms", "kexec_load", "kexec_file_load",
		"open_by_handle_at", "name_to_handle_at",
		"mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree",
		"fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
		"unshare", "setns",
		"acct", "swapon", "swapoff", "reboot", "syslog", "quotactl", "quotactl_fd",
		"nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "vm86", "vm86old",
		"iopl", "ioperm", "settimeofday", "stime", "clock_settime", "clock_settime64",
		"clock_adjtime", "clock_adjtime64",
	}
	p := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Syscalls: []specs.LinuxSyscall{
			{Names: deny, Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
	for _, flag := range []uint64{
		unix.CLONE_NEWNS, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER,
		unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWCGROUP,
	} {
		p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{
			Names:    []string{"clone"},
			Action:   specs.ActErrno,
			ErrnoRet: &eperm,
			Args:     []specs.LinuxSeccompArg{{Index: 0, Value: flag, ValueTwo: flag, Op: specs.OpMaskedEqual}},
		})
	}
	return p
}
