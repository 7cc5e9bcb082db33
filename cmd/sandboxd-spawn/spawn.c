// sandboxd-spawn starts one sandbox of the local backend: it clones the
// sandbox's init into new namespaces, as a child of its own caller
// (CLONE_PARENT), sets up the root filesystem, the cgroup, the seccomp
// filter and the capabilities, and executes envd as the sandbox's pid 1.
// It then exits; the caller (sandboxd) reaps the init.
//
// It replaces libcontainer's start chain for the configurations the local
// backend makes (package runtime/local/spawn says which and encodes the
// request): that chain re-executes a 9 MB Go binary, starts a Go runtime in
// it and resolves every path component by component, about 16 ms of CPU per
// sandbox against the ≈ 2-3 ms of the system calls themselves. libcontainer
// still owns everything after the start: sandboxd writes the state it would
// have written and loads the container from it.
//
// Interface (all set up by the caller):
//   fd 0, 1, 2  the init's stdin, stdout and stderr (kept as they are)
//   fd 3        the request: NUL-terminated tokens, a keyword and its
//               arguments per record (see parse below); read to its end
//   fd 4        the answer: "pid N\n" once the init exists, then nothing
//               more when it has executed envd, or "error: <text>\n"
//   fd 5        with the request's "mntns 5": a mount namespace to clone the
//               init's from (runtime/local's spawn namespace, which lacks
//               the other sandboxes' mounts); the root is then handed to the
//               init as a detached copy
//   fd N        with the request's "listen N" (N the next descriptor, 5 or
//               6): envd's listening socket, which the init gets as fd 3
//               (envd's --socket-fd 3); nothing else of the spawner's passes
// Exit status 0 when envd was executed, 1 otherwise. On an error after the
// clone the init exits at once, and the caller still reaps it.
//
// Everything here is system calls in order; no allocation after the parse
// in the child beyond the stack, and no library state shared with a parent
// thread (the process is single-threaded).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <linux/keyctl.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ITEMS 256

struct mnt {
	const char *src, *dst, *type, *data;
	unsigned long flags;
	int srcfd;  // a bind's source, opened by the spawner (open_sources)
	int srcdir; // ... and whether it is a directory
};

struct dev {
	const char *path;
	char type; // 'c' or 'b'
	unsigned major, minor, mode, uid, gid;
	struct mnt bind; // with binddevs: the host's node, bound over an empty file
};

struct link {
	const char *target, *path;
};

static struct {
	unsigned long long nsflags; // namespaces cloned (never CLONE_NEWCGROUP)
	int cgroupns;               // unshare a cgroup namespace once in the cgroup
	int loopback;               // bring lo up in the new network namespace
	int nice;                   // the init's nice value
	int mntns;                  // fd of the mount namespace to clone from; -1: this one's
	int roottree;               // the root, a detached copy for the init (with mntns)
	int listen;                 // fd of envd's listening socket, the init's fd 3; -1: none
	const char *uidmap, *gidmap;
	const char *cgroups[16];
	int ncgroups;
	const char *hostname, *rootfs, *cwd;
	unsigned long propagation;
	struct mnt mounts[MAX_ITEMS];
	int nmounts;
	struct dev devs[32];
	int ndevs;
	int bind_devs; // bind the host's nodes instead of mknod (user namespace)
	struct link links[16];
	int nlinks;
	const char *masked[64], *readonly[64];
	int nmasked, nreadonly;
	unsigned char *bpf;
	size_t bpflen;
	unsigned bpfflags; // seccomp(2)'s flags
	unsigned long long caps;
	char *argv[MAX_ITEMS + 1], *envp[MAX_ITEMS + 1];
	int argc, envc;
} rq;

static int answer_fd = 4;

// fail reports an error on the answer and exits; in the init, the answer
// goes to the spawner through the error pipe instead.
static void __attribute__((noreturn, format(printf, 1, 2))) fail(const char *fmt, ...)
{
	char buf[1024];
	int e = errno;
	va_list ap;
	va_start(ap, fmt);
	int n = snprintf(buf, sizeof buf, "error: ");
	n += vsnprintf(buf + n, sizeof buf - n, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 64)
		n = sizeof buf - 64;
	n += snprintf(buf + n, sizeof buf - n, ": %s\n", e ? strerror(e) : "invalid");
	if (write(answer_fd, buf, n) < 0) {
		// nobody to tell
	}
	_exit(1);
}

static char *readall(int fd, size_t *len)
{
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (!buf)
			fail("read request: out of memory");
		ssize_t r = read(fd, buf + n, cap - n - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			fail("read request");
		if (r == 0)
			break;
		n += r;
		if (n + 1 == cap)
			buf = realloc(buf, cap *= 2);
	}
	buf[n] = 0;
	*len = n;
	return buf;
}

static unsigned long long num(const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end || !*s) {
		errno = 0;
		fail("request: bad number %.40s", s);
	}
	return v;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

// parse reads the request's records. Each keyword takes a fixed number of
// argument tokens; an unknown keyword is an error, so that a newer sandboxd
// never has a request half understood.
static void parse(char *buf, size_t len)
{
	char *tok[8];
	char *p = buf, *end = buf + len;
	rq.propagation = MS_SLAVE | MS_REC;
#define NEXT() ({ if (p >= end) { errno = 0; fail("request: truncated"); } char *t_ = p; p += strlen(p) + 1; t_; })
#define TAKE(k) for (int i_ = 0; i_ < (k); i_++) tok[i_] = NEXT()
#define ROOM(n, max) if ((n) >= (max)) { errno = 0; fail("request: too many %s", kw); }
	while (p < end) {
		const char *kw = NEXT();
		if (!strcmp(kw, "ns")) {
			TAKE(1);
			rq.nsflags = num(tok[0]);
		} else if (!strcmp(kw, "cgroupns")) {
			rq.cgroupns = 1;
		} else if (!strcmp(kw, "loopback")) {
			rq.loopback = 1;
		} else if (!strcmp(kw, "nice")) {
			TAKE(1);
			char *e;
			errno = 0;
			long v = strtol(tok[0], &e, 10);
			if (errno || *e || !*tok[0] || v < -20 || v > 19) {
				errno = 0;
				fail("request: bad nice value %.20s", tok[0]);
			}
			rq.nice = (int)v;
		} else if (!strcmp(kw, "mntns")) {
			TAKE(1);
			// sandboxd passes it as fd 5, after the request and the answer.
			if (strcmp(tok[0], "5")) {
				errno = 0;
				fail("request: mount namespace fd %.20s", tok[0]);
			}
			rq.mntns = 5;
		} else if (!strcmp(kw, "listen")) {
			TAKE(1);
			// After the request, the answer and the mount namespace.
			if (strcmp(tok[0], "5") && strcmp(tok[0], "6")) {
				errno = 0;
				fail("request: listening socket fd %.20s", tok[0]);
			}
			rq.listen = tok[0][0] - '0';
		} else if (!strcmp(kw, "uidmap")) {
			TAKE(1);
			rq.uidmap = tok[0];
		} else if (!strcmp(kw, "gidmap")) {
			TAKE(1);
			rq.gidmap = tok[0];
		} else if (!strcmp(kw, "cgroup")) {
			TAKE(1);
			ROOM(rq.ncgroups, 16);
			rq.cgroups[rq.ncgroups++] = tok[0];
		} else if (!strcmp(kw, "hostname")) {
			TAKE(1);
			rq.hostname = tok[0];
		} else if (!strcmp(kw, "rootfs")) {
			TAKE(1);
			rq.rootfs = tok[0];
		} else if (!strcmp(kw, "propagation")) {
			TAKE(1);
			rq.propagation = num(tok[0]);
		} else if (!strcmp(kw, "mount")) {
			TAKE(5);
			ROOM(rq.nmounts, MAX_ITEMS);
			rq.mounts[rq.nmounts++] = (struct mnt){tok[0], tok[1], tok[2], tok[4], num(tok[3])};
		} else if (!strcmp(kw, "device")) {
			TAKE(7);
			ROOM(rq.ndevs, 32);
			rq.devs[rq.ndevs++] = (struct dev){tok[0], tok[1][0], num(tok[2]), num(tok[3]), num(tok[4]), num(tok[5]), num(tok[6])};
		} else if (!strcmp(kw, "binddevs")) {
			rq.bind_devs = 1;
		} else if (!strcmp(kw, "symlink")) {
			TAKE(2);
			ROOM(rq.nlinks, 16);
			rq.links[rq.nlinks++] = (struct link){tok[0], tok[1]};
		} else if (!strcmp(kw, "mask")) {
			TAKE(1);
			ROOM(rq.nmasked, 64);
			rq.masked[rq.nmasked++] = tok[0];
		} else if (!strcmp(kw, "readonly")) {
			TAKE(1);
			ROOM(rq.nreadonly, 64);
			rq.readonly[rq.nreadonly++] = tok[0];
		} else if (!strcmp(kw, "seccomp")) {
			TAKE(2);
			rq.bpfflags = num(tok[1]);
			size_t n = strlen(tok[0]);
			if (n % 16) {
				errno = 0;
				fail("request: seccomp program of %zu hex digits", n);
			}
			rq.bpflen = n / 2;
			rq.bpf = malloc(rq.bpflen);
			for (size_t i = 0; i < rq.bpflen; i++) {
				int hi = hexval(tok[0][2 * i]), lo = hexval(tok[0][2 * i + 1]);
				if (hi < 0 || lo < 0) {
					errno = 0;
					fail("request: seccomp program is not hex");
				}
				rq.bpf[i] = hi << 4 | lo;
			}
		} else if (!strcmp(kw, "caps")) {
			TAKE(1);
			rq.caps = num(tok[0]);
		} else if (!strcmp(kw, "cwd")) {
			TAKE(1);
			rq.cwd = tok[0];
		} else if (!strcmp(kw, "arg")) {
			TAKE(1);
			ROOM(rq.argc, MAX_ITEMS);
			rq.argv[rq.argc++] = tok[0];
		} else if (!strcmp(kw, "env")) {
			TAKE(1);
			ROOM(rq.envc, MAX_ITEMS);
			rq.envp[rq.envc++] = tok[0];
		} else {
			errno = 0;
			fail("request: unknown keyword %.40s", kw);
		}
	}
	if (!rq.rootfs || !rq.argc || rq.rootfs[0] != '/') {
		errno = 0;
		fail("request: no rootfs or no command");
	}
	if (rq.nsflags & ~(unsigned long long)(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWUSER)) {
		errno = 0;
		fail("request: namespaces %#llx", rq.nsflags);
	}
	if (!(rq.nsflags & CLONE_NEWNS) || !(rq.nsflags & CLONE_NEWPID)) {
		errno = 0;
		fail("request: a sandbox needs its own mount and pid namespaces");
	}
}

static void write_file(const char *path, const char *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		fail("open %s", path);
	if (write(fd, data, len) != (ssize_t)len)
		fail("write %s", path);
	close(fd);
}

// in_root opens path (absolute, as the sandbox will see it) below the root
// directory rootfd, resolving every symlink as if rootfd were "/": a
// symlink in a restored or forked layer cannot send a mount outside the
// sandbox's root. With mk, missing directories are made (0755), and a
// missing last component is made a directory, or an empty file when file.
static int in_root(int rootfd, const char *path, int mk, int file)
{
	struct open_how how = {.flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
	int fd = syscall(SYS_openat2, rootfd, path, &how, sizeof how);
	if (fd >= 0 || errno != ENOENT || !mk)
		return fd;
	// Make it one component at a time, each relative to its resolved
	// parent.
	char buf[4096];
	if (strlen(path) >= sizeof buf) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(buf, path);
	int dir = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
	char *c = buf;
	while (dir >= 0) {
		while (*c == '/')
			c++;
		if (!*c)
			return dir;
		char *slash = strchr(c, '/');
		int last = !slash || !slash[strspn(slash, "/")];
		if (slash)
			*slash = 0;
		struct open_how h = {.flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
		// Resolving from dir with IN_ROOT would make dir the root; resolve
		// the prefix from the sandbox's root instead.
		int next = syscall(SYS_openat2, rootfd, buf, &h, sizeof h);
		if (next < 0 && errno == ENOENT) {
			if (last && file) {
				int f = openat(dir, c, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
				if (f >= 0)
					close(f);
			} else if (mkdirat(dir, c, 0755) < 0 && errno != EEXIST) {
				close(dir);
				return -1;
			}
			next = syscall(SYS_openat2, rootfd, buf, &h, sizeof h);
		}
		close(dir);
		dir = next;
		if (last)
			return dir;
		*slash = '/';
		c = slash + 1;
	}
	return -1;
}

static void fdpath(char *buf, size_t n, int fd)
{
	snprintf(buf, n, "/proc/self/fd/%d", fd);
}

// locked are the flags a bind mount keeps from its source in a user
// namespace: a remount without them is refused (EPERM).
static unsigned long locked_flags(const char *target)
{
	struct statvfs st;
	if (statvfs(target, &st) < 0)
		return 0;
	unsigned long f = 0;
	if (st.f_flag & ST_NOSUID)
		f |= MS_NOSUID;
	if (st.f_flag & ST_NODEV)
		f |= MS_NODEV;
	if (st.f_flag & ST_NOEXEC)
		f |= MS_NOEXEC;
	if (st.f_flag & ST_RDONLY)
		f |= MS_RDONLY;
	if (st.f_flag & ST_NOATIME)
		f |= MS_NOATIME;
	if (st.f_flag & ST_NODIRATIME)
		f |= MS_NODIRATIME;
	if (st.f_flag & ST_RELATIME)
		f |= MS_RELATIME;
	return f;
}

// open_source makes a bind mount's source a detached copy of its mount
// (open_tree), as the spawner, root on the host and in the host's mount
// namespace: with a user namespace the init is no one on the host, the way
// to a source (a volume's view, the state directory) is closed to it, and a
// mount of another mount namespace cannot be bound from there; a detached
// copy can be attached anywhere (move_mount), as runc does. The mount's
// flags are set on the copy (the top mount only, as a bind's remount does),
// before the sandbox's namespace could lock them.
static void open_source(struct mnt *m)
{
	unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC;
	if (m->flags & MS_REC)
		flags |= AT_RECURSIVE;
	m->srcfd = syscall(SYS_open_tree, AT_FDCWD, m->src, flags);
	struct stat st;
	if (m->srcfd < 0 || fstat(m->srcfd, &st) < 0)
		fail("mount %s: source %s", m->dst, m->src);
	m->srcdir = S_ISDIR(st.st_mode);
	unsigned long rest = m->flags & ~(MS_BIND | MS_REC);
	struct mount_attr attr = {0};
	const struct {
		unsigned long ms;
		unsigned long long attr;
	} map[] = {
		{MS_RDONLY, MOUNT_ATTR_RDONLY}, {MS_NOSUID, MOUNT_ATTR_NOSUID},
		{MS_NODEV, MOUNT_ATTR_NODEV}, {MS_NOEXEC, MOUNT_ATTR_NOEXEC},
		{MS_NODIRATIME, MOUNT_ATTR_NODIRATIME},
	};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
		if (rest & map[i].ms) {
			attr.attr_set |= map[i].attr;
			rest &= ~map[i].ms;
		}
	if (rest & (MS_NOATIME | MS_STRICTATIME | MS_RELATIME)) {
		attr.attr_clr |= MOUNT_ATTR__ATIME;
		attr.attr_set |= rest & MS_NOATIME ? MOUNT_ATTR_NOATIME : rest & MS_STRICTATIME ? MOUNT_ATTR_STRICTATIME : MOUNT_ATTR_RELATIME;
		rest &= ~(MS_NOATIME | MS_STRICTATIME | MS_RELATIME);
	}
	if (rest) {
		errno = 0;
		fail("mount %s: bind flags %#lx", m->dst, rest);
	}
	if ((attr.attr_set || attr.attr_clr) && syscall(SYS_mount_setattr, m->srcfd, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
		fail("mount %s: attributes", m->dst);
}

static void do_mount(int rootfd, const struct mnt *m)
{
	int bind = m->flags & MS_BIND;
	int fd = in_root(rootfd, m->dst, 1, bind && !m->srcdir);
	if (fd < 0)
		fail("mount %s: mount point", m->dst);
	if (bind) {
		if (syscall(SYS_move_mount, m->srcfd, "", fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
			fail("bind %s on %s", m->src, m->dst);
		close(m->srcfd);
	} else {
		char target[64];
		fdpath(target, sizeof target, fd);
		if (mount(m->src, target, m->type, m->flags, m->data[0] ? m->data : NULL) < 0)
			fail("mount %s (%s)", m->dst, m->type);
	}
	close(fd);
}

// in_root_parent opens, for making an entry at path below rootfd, the
// directory that holds it (made if missing) for *at calls, and sets *base
// to the entry's name.
static int in_root_parent(int rootfd, const char *path, const char **base, const char *what)
{
	const char *slash = strrchr(path, '/');
	char dir[256];
	if (!slash || (size_t)(slash - path) >= sizeof dir) {
		errno = 0;
		fail("%s %s", what, path);
	}
	memcpy(dir, path, slash - path);
	dir[slash - path] = 0;
	int dfd = in_root(rootfd, dir[0] ? dir : "/", 1, 0);
	if (dfd < 0)
		fail("%s %s: directory", what, path);
	int d = openat(dfd, ".", O_DIRECTORY | O_CLOEXEC); // O_PATH fds cannot mknodat or symlinkat
	close(dfd);
	if (d < 0)
		fail("%s %s: directory", what, path);
	*base = slash + 1;
	unlinkat(d, *base, 0);
	return d;
}

static void make_dev(int rootfd, const struct dev *d)
{
	if (rq.bind_devs) {
		do_mount(rootfd, &d->bind);
		return;
	}
	const char *base;
	int dir = in_root_parent(rootfd, d->path, &base, "device");
	mode_t type = d->type == 'b' ? S_IFBLK : S_IFCHR;
	mode_t old = umask(0); // the node's mode as given, as runc makes it
	int r = mknodat(dir, base, type | (d->mode & 07777), makedev(d->major, d->minor));
	umask(old);
	if (r < 0)
		fail("mknod %s", d->path);
	if (fchownat(dir, base, d->uid, d->gid, AT_SYMLINK_NOFOLLOW) < 0)
		fail("chown %s", d->path);
	close(dir);
}

static void make_link(int rootfd, const struct link *l)
{
	const char *base;
	int dir = in_root_parent(rootfd, l->path, &base, "symlink");
	if (symlinkat(l->target, dir, base) < 0)
		fail("symlink %s", l->path);
	close(dir);
}

// mask hides path (after pivot_root): /dev/null over a file, an empty
// read-only tmpfs over a directory, as runc does. A path the kernel does
// not have is skipped.
static void mask(const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0) {
		if (errno == ENOENT)
			return;
		fail("mask %s", path);
	}
	int r = S_ISDIR(st.st_mode) ? mount("tmpfs", path, "tmpfs", MS_RDONLY, "size=4k,nr_inodes=1") : mount("/dev/null", path, NULL, MS_BIND, NULL);
	if (r < 0)
		fail("mask %s", path);
}

static void readonly(const char *path)
{
	if (mount(path, path, NULL, MS_BIND | MS_REC, NULL) < 0) {
		if (errno == ENOENT)
			return;
		fail("read-only %s", path);
	}
	if (mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC | locked_flags(path), NULL) < 0)
		fail("read-only %s: remount", path);
}

static void loopback_up(void)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		fail("loopback: socket");
	struct ifreq ifr = {0};
	strcpy(ifr.ifr_name, "lo");
	if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
		fail("loopback: flags");
	ifr.ifr_flags |= IFF_UP;
	if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
		fail("loopback: up");
	close(s);
}

static void pivot(void)
{
	int oldroot = open("/", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
	if (oldroot < 0)
		fail("open /");
	if (chdir(rq.rootfs) < 0)
		fail("chdir %s", rq.rootfs);
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		fail("pivot_root");
	// The old root is now stacked under the new one at "/": detach it,
	// without letting the unmount reach the host's mounts.
	if (fchdir(oldroot) < 0)
		fail("fchdir old root");
	if (mount(NULL, ".", NULL, MS_SLAVE | MS_REC, NULL) < 0)
		fail("old root: slave");
	if (umount2(".", MNT_DETACH) < 0)
		fail("old root: umount");
	close(oldroot);
	if (chdir("/") < 0)
		fail("chdir /");
}

static void set_caps(void)
{
	int last = 63;
	for (int c = 0; c <= last; c++) {
		if (rq.caps & (1ULL << c))
			continue;
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
			if (errno == EINVAL) {
				last = c - 1; // beyond the kernel's last capability
				break;
			}
			fail("drop capability %d from the bounding set", c);
		}
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		fail("clear ambient capabilities");
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[2] = {
		{.effective = (uint32_t)rq.caps, .permitted = (uint32_t)rq.caps},
		{.effective = (uint32_t)(rq.caps >> 32), .permitted = (uint32_t)(rq.caps >> 32)},
	};
	if (syscall(SYS_capset, &h, d) < 0)
		fail("capset");
}

// init is the sandbox's pid 1 until it executes envd. sync is where the
// spawner says the user namespace is mapped and the cgroup joined; errors go
// to errfd, which closes on a successful exec.
static void __attribute__((noreturn)) init(int sync, int errfd)
{
	answer_fd = errfd;
	// envd's socket at fd 3, where the request was: dup2 leaves it open
	// across the exec, and the request's descriptor goes.
	if (rq.listen >= 0 && dup2(rq.listen, 3) < 0)
		fail("listening socket");
	char c;
	ssize_t n;
	while ((n = read(sync, &c, 1)) < 0 && errno == EINTR)
		;
	if (n != 1)
		_exit(1); // the spawner gave up; it says why
	close(sync);
	if (rq.nsflags & CLONE_NEWUSER) {
		// The namespaces other than the pid namespace are made now, by
		// root of the new user namespace, as libcontainer's nsexec makes
		// them: an ipc namespace's mqueue filesystem belongs to whoever
		// makes it (root, and the group it has then: none of the sandbox's).
		if (setresuid(0, 0, 0) < 0)
			fail("become root in the user namespace");
		if (unshare(rq.nsflags & ~(CLONE_NEWUSER | CLONE_NEWPID)) < 0)
			fail("namespaces");
		if (setresgid(0, 0, 0) < 0)
			fail("become root's group in the user namespace");
	}
	if (setgroups(0, NULL) < 0)
		fail("setgroups");
	if (rq.cgroupns && unshare(CLONE_NEWCGROUP) < 0)
		fail("cgroup namespace");
	if (setsid() < 0)
		fail("setsid");
	if (rq.loopback)
		loopback_up();
	if (rq.hostname && sethostname(rq.hostname, strlen(rq.hostname)) < 0)
		fail("sethostname");

	if (mount(NULL, "/", NULL, rq.propagation, NULL) < 0)
		fail("root propagation");
	if (rq.roottree >= 0) {
		// The root's mounts are not in the namespace this one copies
		// (sandboxd's spawn namespace): the spawner opened them.
		if (syscall(SYS_move_mount, rq.roottree, "", AT_FDCWD, rq.rootfs, MOVE_MOUNT_F_EMPTY_PATH) < 0)
			fail("attach rootfs %s", rq.rootfs);
		close(rq.roottree);
	} else if (mount(rq.rootfs, rq.rootfs, NULL, MS_BIND | MS_REC, NULL) < 0)
		fail("bind rootfs");
	int rootfd = open(rq.rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		fail("open rootfs");
	for (int i = 0; i < rq.nmounts; i++)
		do_mount(rootfd, &rq.mounts[i]);
	for (int i = 0; i < rq.ndevs; i++)
		make_dev(rootfd, &rq.devs[i]);
	for (int i = 0; i < rq.nlinks; i++)
		make_link(rootfd, &rq.links[i]);
	close(rootfd);
	pivot();
	// In runc's order: read-only paths, then masks.
	for (int i = 0; i < rq.nreadonly; i++)
		readonly(rq.readonly[i]);
	for (int i = 0; i < rq.nmasked; i++)
		mask(rq.masked[i]);

	umask(022);
	if (rq.cwd && chdir(rq.cwd) < 0)
		fail("chdir %s", rq.cwd);
	// The filter goes on while the init still has CAP_SYS_ADMIN (there is
	// no no_new_privs); it denies none of what follows.
	if (rq.bpf) {
		struct sock_fprog prog = {.len = rq.bpflen / sizeof(struct sock_filter), .filter = (struct sock_filter *)rq.bpf};
		if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, rq.bpfflags, &prog) < 0)
			fail("seccomp");
	}
	set_caps();
	sigset_t all;
	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	rq.argv[rq.argc] = NULL;
	rq.envp[rq.envc] = NULL;
	execve(rq.argv[0], rq.argv, rq.envp);
	fail("exec %s", rq.argv[0]);
}

int main(void)
{
	// Nothing of the request or the answer may reach envd.
	for (int fd = 3; fd <= 4; fd++)
		if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
			dprintf(2, "sandboxd-spawn: fd %d: %s (run by sandboxd, with its request on fd 3 and its answer on fd 4)\n", fd, strerror(errno));
			return 2;
		}
	size_t len;
	char *buf = readall(3, &len);
	rq.mntns = rq.roottree = rq.listen = -1;
	parse(buf, len);
	if (rq.mntns >= 0 && fcntl(rq.mntns, F_SETFD, FD_CLOEXEC) < 0)
		fail("mount namespace fd");
	if (rq.listen >= 0 && (rq.listen == rq.mntns || fcntl(rq.listen, F_SETFD, FD_CLOEXEC) < 0))
		fail("listening socket fd");

	for (int i = 0; i < rq.nmounts; i++)
		if (rq.mounts[i].flags & MS_BIND)
			open_source(&rq.mounts[i]);
	for (int i = 0; rq.bind_devs && i < rq.ndevs; i++) {
		struct dev *d = &rq.devs[i];
		d->bind = (struct mnt){d->path, d->path, "bind", "", MS_BIND};
		open_source(&d->bind);
	}

	if (rq.mntns >= 0) {
		// The root as a detached copy (with what is mounted below it),
		// opened here where it is mounted; then into the namespace the
		// init's is copied from, which lacks every sandbox's mounts.
		rq.roottree = syscall(SYS_open_tree, AT_FDCWD, rq.rootfs, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
		if (rq.roottree < 0)
			fail("open rootfs %s", rq.rootfs);
		if (setns(rq.mntns, CLONE_NEWNS) < 0)
			fail("enter the spawn mount namespace");
		close(rq.mntns);
	}

	int syncp[2], errp[2];
	if (pipe2(syncp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0)
		fail("pipe");
	// With CLONE_PARENT the init takes this process's exit signal (clone3
	// wants none given): SIGCHLD, as the caller started this process.
	unsigned long long ns = rq.nsflags;
	if (ns & CLONE_NEWUSER)
		ns &= CLONE_NEWUSER | CLONE_NEWPID; // the rest once mapped (init)
	// sandboxd runs a background create's work at a low priority, this
	// process included: the init gets sandboxd's own nice value back (the
	// sandbox's cgroup weighs its start against the others).
	if (setpriority(PRIO_PROCESS, 0, rq.nice) < 0)
		fail("setpriority %d", rq.nice);
	struct clone_args args = {.flags = CLONE_PARENT | ns};
	pid_t pid = syscall(SYS_clone3, &args, sizeof args);
	if (pid < 0)
		fail("clone3");
	if (pid == 0) {
		close(syncp[1]);
		close(errp[0]);
		init(syncp[0], errp[1]);
	}
	close(syncp[0]);
	close(errp[1]);
	char line[32];
	int n = snprintf(line, sizeof line, "pid %d\n", pid);
	if (write(answer_fd, line, n) != n)
		fail("answer");

	char path[128];
	if (rq.nsflags & CLONE_NEWUSER) {
		// Written by this process, root in the parent namespace: the
		// init has no rights there.
		snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
		write_file(path, rq.uidmap, strlen(rq.uidmap));
		snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
		write_file(path, rq.gidmap, strlen(rq.gidmap));
	}
	n = snprintf(line, sizeof line, "%d", pid);
	for (int i = 0; i < rq.ncgroups; i++) {
		snprintf(path, sizeof path, "%s/cgroup.procs", rq.cgroups[i]);
		write_file(path, line, n);
	}
	if (write(syncp[1], "g", 1) != 1)
		fail("start the init");
	close(syncp[1]);

	// The init's errors, or nothing once it has executed envd.
	char ebuf[1024];
	size_t got = 0;
	ssize_t r;
	while (got < sizeof ebuf && (r = read(errp[0], ebuf + got, sizeof ebuf - got)) != 0) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			fail("read the init's answer");
		got += r;
	}
	if (got) {
		if (write(answer_fd, ebuf, got) < 0) {
			// the caller is gone
		}
		return 1;
	}
	return 0;
}
