// Package spawn starts a local-backend sandbox with sandboxd-spawn
// (cmd/sandboxd-spawn), a small C program, instead of libcontainer's start
// chain. It owns the request that program reads: the namespaces, mounts,
// devices, cgroups, seccomp program and capabilities of a libcontainer
// config, for the configurations the local backend makes. Encode refuses
// (ErrUnsupported) any config that asks for more, so that such a sandbox
// starts through libcontainer instead of starting differently.
//
// libcontainer still owns the container after its start: WriteState writes
// the state libcontainer would have written, and libcontainer.Load reads it
// for pause, stats, signals and destroy, as for a sandbox started before a
// restart of sandboxd.
package spawn

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/capability"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/system"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// ErrUnsupported says that a config asks for what sandboxd-spawn does not
// do; libcontainer can start it.
var ErrUnsupported = errors.New("not supported by sandboxd-spawn")

// Process is what the sandbox's init executes.
type Process struct {
	Args, Env []string
	Cwd       string
	// Nice is the init's nice value, given back by the spawner before
	// its clone: the spawner itself may run at a background create's.
	Nice int
}

// Encode builds sandboxd-spawn's request for the container cfg describes,
// whose init runs proc, in the cgroup directories cgroupDirs (one per
// hierarchy, made and configured by the caller), with the seccomp program
// bpf (CompileSeccomp; nil for none).
func Encode(cfg *configs.Config, proc Process, cgroupDirs []string, bpf []byte) ([]byte, error) {
	if err := supported(cfg, bpf); err != nil {
		return nil, err
	}
	var e encoder
	var flags uint64
	for _, ns := range cfg.Namespaces {
		if ns.Path != "" {
			return nil, fmt.Errorf("%w: joining namespace %s", ErrUnsupported, ns.Path)
		}
		if ns.Type == configs.NEWCGROUP {
			e.add("cgroupns") // unshared once the init is in its cgroup
			continue
		}
		f, ok := cloneFlags[ns.Type]
		if !ok {
			return nil, fmt.Errorf("%w: namespace %s", ErrUnsupported, ns.Type)
		}
		flags |= f
	}
	userNS := flags&unix.CLONE_NEWUSER != 0
	if flags&unix.CLONE_NEWNS == 0 || flags&unix.CLONE_NEWPID == 0 {
		return nil, fmt.Errorf("%w: no mount or pid namespace of its own", ErrUnsupported)
	}
	e.add("ns", strconv.FormatUint(flags, 10))
	if userNS {
		e.add("uidmap", idMap(cfg.UIDMappings), "gidmap", idMap(cfg.GIDMappings), "binddevs")
	}
	for _, d := range cgroupDirs {
		e.add("cgroup", d)
	}
	if len(cfg.Networks) > 0 { // loopback only (supported)
		e.add("loopback")
	}
	if cfg.Hostname != "" {
		e.add("hostname", cfg.Hostname)
	}
	e.add("rootfs", cfg.Rootfs)
	if cfg.RootPropagation != 0 {
		e.add("propagation", strconv.Itoa(cfg.RootPropagation))
	}
	devTmpfs := false
	for _, m := range cfg.Mounts {
		if m.IDMapping != nil || len(m.PropagationFlags) > 0 || m.Extensions != 0 || m.RecAttr != nil {
			return nil, fmt.Errorf("%w: mount %s (id mapping, propagation, copy-up or recursive attributes)", ErrUnsupported, m.Destination)
		}
		typ, src := m.Device, m.Source
		switch typ {
		case "bind":
		case "cgroup":
			// A cgroup namespace's own cgroup2 mount, as runc makes it on a
			// v2 host; v1's tmpfs of per-controller mounts is not done here.
			if !cgroup2Only() {
				return nil, fmt.Errorf("%w: cgroup v1 mount", ErrUnsupported)
			}
			typ, src = "cgroup2", "cgroup2"
		case "proc", "sysfs", "tmpfs", "devpts", "mqueue":
		default:
			return nil, fmt.Errorf("%w: %s mount at %s", ErrUnsupported, typ, m.Destination)
		}
		if m.Destination == "/dev" && typ == "tmpfs" {
			devTmpfs = true
		}
		e.add("mount", src, m.Destination, typ, strconv.Itoa(m.Flags), m.Data)
	}
	if devTmpfs {
		// What runc puts in a /dev of its own: the device nodes, the links
		// to the standard descriptors and the devpts instance's ptmx.
		for _, d := range cfg.Devices {
			if d.Path == "" {
				continue
			}
			if d.Type != 'c' && d.Type != 'b' {
				return nil, fmt.Errorf("%w: device %s of type %c", ErrUnsupported, d.Path, d.Type)
			}
			e.add("device", d.Path, string(d.Type), strconv.FormatInt(d.Major, 10), strconv.FormatInt(d.Minor, 10),
				strconv.FormatUint(uint64(d.FileMode.Perm()), 10), strconv.FormatUint(uint64(d.Uid), 10), strconv.FormatUint(uint64(d.Gid), 10))
		}
		for _, l := range devLinks() {
			e.add("symlink", l[0], l[1])
		}
	}
	for _, p := range cfg.MaskPaths {
		e.add("mask", p)
	}
	for _, p := range cfg.ReadonlyPaths {
		e.add("readonly", p)
	}
	if bpf != nil {
		flags, err := seccompFlags(cfg.Seccomp)
		if err != nil {
			return nil, err
		}
		e.add("seccomp", hex.EncodeToString(bpf), strconv.FormatUint(uint64(flags), 10))
	}
	caps, err := capMask(cfg.Capabilities)
	if err != nil {
		return nil, err
	}
	e.add("caps", strconv.FormatUint(caps, 10))
	if proc.Nice < -20 || proc.Nice > 19 {
		return nil, fmt.Errorf("spawn: nice value %d", proc.Nice)
	}
	e.add("nice", strconv.Itoa(proc.Nice))
	if proc.Cwd != "" {
		e.add("cwd", proc.Cwd)
	}
	if len(proc.Args) == 0 {
		return nil, errors.New("spawn: no command")
	}
	for _, a := range proc.Args {
		e.add("arg", a)
	}
	for _, v := range proc.Env {
		e.add("env", v)
	}
	if e.err != nil {
		return nil, e.err
	}
	return e.buf.Bytes(), nil
}

var cloneFlags = map[configs.NamespaceType]uint64{
	configs.NEWNS: unix.CLONE_NEWNS, configs.NEWPID: unix.CLONE_NEWPID, configs.NEWNET: unix.CLONE_NEWNET,
	configs.NEWIPC: unix.CLONE_NEWIPC, configs.NEWUTS: unix.CLONE_NEWUTS, configs.NEWUSER: unix.CLONE_NEWUSER,
}

// supported refuses what Encode does not translate: every field of the
// config that would change the sandbox and that the local backend does not
// set.
func supported(cfg *configs.Config, bpf []byte) error {
	var what []string
	check := func(set bool, name string) {
		if set {
			what = append(what, name)
		}
	}
	check(cfg.NoPivotRoot, "no pivot_root")
	check(cfg.ParentDeathSignal != 0, "parent death signal")
	check(cfg.Umask != nil, "umask")
	check(cfg.Readonlyfs, "read-only root")
	check(len(cfg.NetDevices) > 0, "network devices")
	check(cfg.MountLabel != "" || cfg.ProcessLabel != "" || cfg.AppArmorProfile != "", "security labels")
	check(cfg.Domainname != "", "domain name")
	check(slices.ContainsFunc(cfg.Networks, func(n *configs.Network) bool { return n.Type != "loopback" }) || len(cfg.Routes) > 0, "networks other than loopback")
	check(len(cfg.Rlimits) > 0, "rlimits")
	check(cfg.OomScoreAdj != nil, "oom_score_adj")
	check(len(cfg.Sysctl) > 0, "sysctls")
	check(cfg.Seccomp != nil && bpf == nil, "seccomp without a compiled program")
	check(cfg.Seccomp != nil && cfg.Seccomp.ListenerPath != "", "seccomp listener")
	check(cfg.NoNewPrivileges, "no_new_privs")
	check(len(cfg.Hooks) > 0, "hooks")
	check(!cfg.NoNewKeyring, "a session keyring")
	check(cfg.IntelRdt != nil, "Intel RDT")
	check(cfg.MemoryPolicy != nil, "memory policy")
	check(cfg.RootlessEUID || cfg.RootlessCgroups, "rootless")
	check(len(cfg.TimeOffsets) > 0, "time offsets")
	check(cfg.Scheduler != nil || cfg.IOPriority != nil || cfg.ExecCPUAffinity != nil, "scheduling")
	check(cfg.Personality != nil, "personality")
	if len(what) > 0 {
		return fmt.Errorf("%w: %s", ErrUnsupported, strings.Join(what, ", "))
	}
	return nil
}

// capMask turns the config's capabilities into the one set sandboxd-spawn
// gives the init (bounding, effective and permitted alike, none
// inheritable or ambient): what an execve as root keeps.
func capMask(c *configs.Capabilities) (uint64, error) {
	if c == nil {
		return 0, fmt.Errorf("%w: no capability sets", ErrUnsupported)
	}
	if !slices.Equal(c.Bounding, c.Effective) || !slices.Equal(c.Bounding, c.Permitted) || len(c.Inheritable) > 0 || len(c.Ambient) > 0 {
		return 0, fmt.Errorf("%w: capability sets that differ", ErrUnsupported)
	}
	byName := map[string]capability.Cap{}
	for _, cp := range capability.ListKnown() {
		byName["CAP_"+strings.ToUpper(cp.String())] = cp
	}
	var m uint64
	for _, name := range c.Bounding {
		cp, ok := byName[name]
		if !ok || cp > 63 {
			return 0, fmt.Errorf("spawn: unknown capability %q", name)
		}
		m |= 1 << uint(cp)
	}
	return m, nil
}

func idMap(ms []configs.IDMap) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "%d %d %d\n", m.ContainerID, m.HostID, m.Size)
	}
	return b.String()
}

// devLinks are runc's links in a /dev of the container's own.
func devLinks() [][2]string {
	links := [][2]string{
		{"/proc/self/fd", "/dev/fd"},
		{"/proc/self/fd/0", "/dev/stdin"},
		{"/proc/self/fd/1", "/dev/stdout"},
		{"/proc/self/fd/2", "/dev/stderr"},
		{"pts/ptmx", "/dev/ptmx"},
	}
	if _, err := os.Stat("/proc/kcore"); err == nil {
		links = append(links, [2]string{"/proc/kcore", "/dev/core"})
	}
	return links
}

func cgroup2Only() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

type encoder struct {
	buf bytes.Buffer
	err error
}

func (e *encoder) add(tokens ...string) {
	for _, t := range tokens {
		if strings.IndexByte(t, 0) >= 0 {
			e.err = fmt.Errorf("spawn: NUL byte in %q", t)
		}
		e.buf.WriteString(t)
		e.buf.WriteByte(0)
	}
}

// Start runs the sandboxd-spawn binary at path with request req; the init
// writes to out (its stdout and stderr). With mntns (an nsfs file of a mount
// namespace; nil for none) the spawner clones the init's mount namespace
// from that one instead of its own, handing it the root as a detached copy.
// With listener (a listening socket; nil for none) the init gets it as its
// fd 3, envd's --socket-fd 3.
// It returns the init's pid once the init has executed its command: the
// init is this process's child, for the caller to reap. On error no process
// is left: an init that failed is reaped here.
func Start(ctx context.Context, path string, req []byte, out, mntns, listener *os.File) (int, error) {
	extra := []*os.File{nil, nil} // the request (3) and the answer (4)
	if mntns != nil {
		req = append(slices.Clip(req), "mntns\x005\x00"...)
		extra = append(extra, mntns)
	}
	if listener != nil {
		req = append(slices.Clip(req), "listen\x00"+strconv.Itoa(3+len(extra))+"\x00"...)
		extra = append(extra, listener)
	}
	reqFile, err := memfile(req)
	if err != nil {
		return 0, fmt.Errorf("spawn: request: %w", err)
	}
	defer reqFile.Close()
	ar, aw, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("spawn: %w", err)
	}
	defer ar.Close()
	cmd := exec.Command(path)
	cmd.Env = []string{} // the init gets the request's, and the spawner needs none
	cmd.Stdout, cmd.Stderr = out, out
	extra[0], extra[1] = reqFile, aw
	cmd.ExtraFiles = extra
	err = cmd.Start()
	aw.Close()
	if err != nil {
		return 0, fmt.Errorf("spawn: %w", err)
	}
	// Until the spawner exits and the init has executed its command (the
	// pipe's writers are both): system calls in a row, a few milliseconds.
	// ctx is not let stop the spawner half-way: between its clone and its
	// answer, the init would be a child of this process that nobody knows
	// to reap.
	answer, rerr := io.ReadAll(ar)
	werr := cmd.Wait()
	pid, rest := parseAnswer(answer)
	cerr := ctx.Err()
	if pid > 0 && (werr != nil || rest != "" || rerr != nil || cerr != nil) {
		// The init exits by itself on any error before its exec; after
		// it, it is envd, which nobody wants any more.
		_ = unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WALL, nil)
	}
	switch {
	case rest != "":
		return 0, fmt.Errorf("spawn: %s", strings.TrimPrefix(strings.TrimSpace(rest), "error: "))
	case rerr != nil:
		return 0, fmt.Errorf("spawn: answer: %w", rerr)
	case werr != nil:
		return 0, fmt.Errorf("spawn: %w", werr)
	case pid <= 0:
		return 0, fmt.Errorf("spawn: no pid in the answer %q", answer)
	case cerr != nil:
		return 0, fmt.Errorf("spawn: %w", cerr)
	}
	return pid, nil
}

func parseAnswer(b []byte) (int, string) {
	s := string(b)
	line, rest, _ := strings.Cut(s, "\n")
	n, ok := strings.CutPrefix(line, "pid ")
	if !ok {
		return 0, s
	}
	pid, err := strconv.Atoi(n)
	if err != nil {
		return 0, s
	}
	return pid, rest
}

// memfile holds b in an anonymous in-memory file, read from its start.
func memfile(b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("sandboxd-spawn-request", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "sandboxd-spawn-request")
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// WriteState writes, under root, the state libcontainer would have written
// for container id with config cfg, whose init is pid and whose cgroups are
// cgroupPaths, so that libcontainer.Load finds it running.
func WriteState(root, id string, cfg *configs.Config, pid int, cgroupPaths map[string]string) error {
	st, err := system.Stat(pid)
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	state := libcontainer.State{
		BaseState: libcontainer.BaseState{
			ID: id, InitProcessPid: pid, InitProcessStartTime: st.StartTime,
			Created: time.Now().UTC(), Config: *cfg,
		},
		CgroupPaths:    cgroupPaths,
		NamespacePaths: map[configs.NamespaceType]string{},
	}
	for _, t := range configs.NamespaceTypes() {
		if configs.IsNamespaceSupported(t) {
			state.NamespacePaths[t] = (&configs.Namespace{Type: t}).GetPath(pid)
		}
	}
	dir := filepath.Join(root, id)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	b, err := json.Marshal(state)
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	tmp := filepath.Join(dir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, "state.json"))
}

// seccompFlags are the flags of seccomp(2) the profile's flags ask for:
// specconv asks for SPEC_ALLOW (no forced speculative store bypass
// mitigation) wherever the kernel has it, and libcontainer loads the
// program with it.
func seccompFlags(c *configs.Seccomp) (uint, error) {
	var f uint
	for _, flag := range c.Flags {
		switch flag {
		case specs.LinuxSeccompFlagSpecAllow:
			f |= unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW
		default:
			return 0, fmt.Errorf("%w: seccomp flag %s", ErrUnsupported, flag)
		}
	}
	return f, nil
}
