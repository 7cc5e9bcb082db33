package spawn

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/opencontainers/cgroups"
	devices "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime/runtimetest"
)

// config is a libcontainer config of the kind the local backend makes.
func config() *configs.Config {
	caps := []string{"CAP_CHOWN", "CAP_KILL", "CAP_SETUID"}
	return &configs.Config{
		Rootfs:   "/run/x/rootfs",
		Hostname: "sbx",
		Namespaces: configs.Namespaces{
			{Type: configs.NEWNS}, {Type: configs.NEWPID}, {Type: configs.NEWNET},
			{Type: configs.NEWIPC}, {Type: configs.NEWUTS}, {Type: configs.NEWCGROUP}, {Type: configs.NEWUSER},
		},
		UIDMappings: []configs.IDMap{{ContainerID: 0, HostID: 1000000000, Size: 65536}},
		GIDMappings: []configs.IDMap{{ContainerID: 0, HostID: 1000000000, Size: 65536}},
		Networks:    []*configs.Network{{Type: "loopback"}},
		Mounts: []*configs.Mount{
			{Source: "proc", Destination: "/proc", Device: "proc", Flags: unix.MS_NOSUID},
			{Source: "tmpfs", Destination: "/dev", Device: "tmpfs", Flags: unix.MS_NOSUID, Data: "mode=755"},
			{Source: "/host/envd", Destination: "/opt/envd", Device: "bind", Flags: unix.MS_BIND | unix.MS_RDONLY},
		},
		Devices: []*devices.Device{
			{Rule: devices.Rule{Type: devices.CharDevice, Major: 1, Minor: 3}, Path: "/dev/null", FileMode: 0o666},
		},
		MaskPaths:     []string{"/proc/kcore"},
		ReadonlyPaths: []string{"/proc/sys"},
		Capabilities:  &configs.Capabilities{Bounding: caps, Effective: caps, Permitted: caps},
		NoNewKeyring:  true,
		Cgroups:       &cgroups.Cgroup{Path: "/x", Resources: &cgroups.Resources{}},
	}
}

func tokens(b []byte) []string {
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

func TestEncode(t *testing.T) {
	req, err := Encode(config(), Process{Args: []string{"/opt/envd", "--init"}, Env: []string{"A=1"}, Cwd: "/"}, []string{"/sys/fs/cgroup/pids/x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(tokens(req), " ")
	flags := unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWUSER
	for _, want := range []string{
		"cgroupns", "ns " + itoa(flags), "uidmap 0 1000000000 65536\n", "binddevs", "cgroup /sys/fs/cgroup/pids/x",
		"loopback", "hostname sbx", "rootfs /run/x/rootfs",
		"mount proc /proc proc " + itoa(unix.MS_NOSUID) + " ",
		"mount tmpfs /dev tmpfs " + itoa(unix.MS_NOSUID) + " mode=755",
		"mount /host/envd /opt/envd bind " + itoa(unix.MS_BIND|unix.MS_RDONLY) + " ",
		"device /dev/null c 1 3 438 0 0", "symlink pts/ptmx /dev/ptmx", "symlink /proc/self/fd /dev/fd",
		"mask /proc/kcore", "readonly /proc/sys",
		"caps " + itoa(1<<unix.CAP_CHOWN|1<<unix.CAP_KILL|1<<unix.CAP_SETUID),
		"nice 0 cwd /", "arg /opt/envd arg --init", "env A=1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("request lacks %q:\n%q", want, got)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestEncodeNice: the init's nice value goes in the request, within the
// kernel's range.
func TestEncodeNice(t *testing.T) {
	for _, tc := range []struct {
		nice int
		ok   bool
	}{{-20, true}, {0, true}, {5, true}, {19, true}, {20, false}, {-21, false}} {
		req, err := Encode(config(), Process{Args: []string{"/opt/envd"}, Nice: tc.nice}, nil, nil)
		switch {
		case tc.ok && err != nil:
			t.Errorf("nice %d: %v", tc.nice, err)
		case tc.ok && !strings.Contains(strings.Join(tokens(req), " "), "nice "+itoa(tc.nice)+" "):
			t.Errorf("nice %d: request %q", tc.nice, req)
		case !tc.ok && err == nil:
			t.Errorf("nice %d: encoded; want an error", tc.nice)
		}
	}
}

// TestEncodeRefuses: whatever the spawner would not do as libcontainer
// does is refused with ErrUnsupported, so that libcontainer starts it.
func TestEncodeRefuses(t *testing.T) {
	one := 1
	for name, change := range map[string]func(c *configs.Config){
		"joined namespace": func(c *configs.Config) { c.Namespaces[2].Path = "/proc/1/ns/net" },
		"no pid namespace": func(c *configs.Config) { c.Namespaces = c.Namespaces[:1] },
		"time namespace":   func(c *configs.Config) { c.Namespaces = append(c.Namespaces, configs.Namespace{Type: configs.NEWTIME}) },
		"rlimits":          func(c *configs.Config) { c.Rlimits = []configs.Rlimit{{Type: unix.RLIMIT_NOFILE, Hard: 1, Soft: 1}} },
		"sysctl":           func(c *configs.Config) { c.Sysctl = map[string]string{"net.ipv4.ip_forward": "1"} },
		"oom score":        func(c *configs.Config) { c.OomScoreAdj = &one },
		"no_new_privs":     func(c *configs.Config) { c.NoNewPrivileges = true },
		"keyring":          func(c *configs.Config) { c.NoNewKeyring = false },
		"hooks":            func(c *configs.Config) { c.Hooks = configs.Hooks{configs.Prestart: nil} },
		"veth network":     func(c *configs.Config) { c.Networks = append(c.Networks, &configs.Network{Type: "veth"}) },
		"idmapped mount": func(c *configs.Config) {
			c.Mounts[2].IDMapping = &configs.MountIDMapping{UIDMappings: c.UIDMappings, GIDMappings: c.GIDMappings}
		},
		"propagation":         func(c *configs.Config) { c.Mounts[2].PropagationFlags = []int{unix.MS_SHARED} },
		"overlay mount":       func(c *configs.Config) { c.Mounts[0].Device = "overlay" },
		"fifo device":         func(c *configs.Config) { c.Devices[0].Type = devices.FifoDevice },
		"inheritable caps":    func(c *configs.Config) { c.Capabilities.Inheritable = []string{"CAP_KILL"} },
		"differing caps":      func(c *configs.Config) { c.Capabilities.Effective = c.Capabilities.Effective[:1] },
		"seccomp unsupported": func(c *configs.Config) { c.Seccomp = &configs.Seccomp{DefaultAction: configs.Allow} },
		"read-only root":      func(c *configs.Config) { c.Readonlyfs = true },
	} {
		t.Run(name, func(t *testing.T) {
			c := config()
			change(c)
			if _, err := Encode(c, Process{Args: []string{"/x"}}, nil, nil); !errors.Is(err, ErrUnsupported) {
				t.Fatalf("Encode = %v, want ErrUnsupported", err)
			}
		})
	}
}

func TestEncodeNUL(t *testing.T) {
	if _, err := Encode(config(), Process{Args: []string{"/x"}, Env: []string{"A=\x00"}}, nil, nil); err == nil || errors.Is(err, ErrUnsupported) {
		t.Fatalf("Encode with a NUL byte = %v, want an error", err)
	}
}

func TestParseAnswer(t *testing.T) {
	for _, c := range []struct {
		in   string
		pid  int
		rest string
	}{
		{"pid 12\n", 12, ""},
		{"pid 12\nerror: mount /x: EPERM\n", 12, "error: mount /x: EPERM\n"},
		{"error: read request: truncated\n", 0, "error: read request: truncated\n"},
		{"", 0, ""},
		{"pid x\n", 0, "pid x\n"},
	} {
		pid, rest := parseAnswer([]byte(c.in))
		if pid != c.pid || rest != c.rest {
			t.Errorf("parseAnswer(%q) = %d, %q; want %d, %q", c.in, pid, rest, c.pid, c.rest)
		}
	}
}

// TestStartFails runs the real spawner with requests it must refuse, before
// and after its clone: each fails with the spawner's reason, and leaves no
// child of this process behind (reaped, not a zombie).
func TestStartFails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the spawner clones namespaces: run as root")
	}
	bin, cleanup, err := runtimetest.SpawnBinary("spawn-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	if bin == "" {
		t.Skip("SANDBOXD_SPAWN=none")
	}
	log, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	nsFlags := itoa(unix.CLONE_NEWNS | unix.CLONE_NEWPID)
	for name, c := range map[string]struct {
		req   []string
		want  string
		mntns bool // Start gets this process's mount namespace
	}{
		"unknown keyword":                        {req: []string{"frobnicate", "1"}, want: "unknown keyword frobnicate"},
		"truncated":                              {req: []string{"rootfs"}, want: "truncated"},
		"no command":                             {req: []string{"ns", nsFlags, "rootfs", "/"}, want: "no rootfs or no command"},
		"bad namespaces":                         {req: []string{"ns", "1", "rootfs", "/", "arg", "/x"}, want: "namespaces"},
		"missing rootfs":                         {req: []string{"ns", nsFlags, "rootfs", filepath.Join(t.TempDir(), "none"), "arg", "/bin/true"}, want: "bind rootfs"},
		"mount namespace fd not 5":               {req: []string{"ns", nsFlags, "rootfs", "/", "arg", "/bin/true", "mntns", "6"}, want: "mount namespace fd 6"},
		"no mount namespace at fd 5":             {req: []string{"ns", nsFlags, "rootfs", "/", "arg", "/bin/true", "mntns", "5"}, want: "mount namespace fd"},
		"missing rootfs, from a mount namespace": {req: []string{"ns", nsFlags, "rootfs", filepath.Join(t.TempDir(), "none"), "arg", "/bin/true"}, want: "open rootfs", mntns: true},
		"missing command":                        {req: []string{"ns", nsFlags, "rootfs", t.TempDir(), "arg", "/no/such/binary"}, want: "exec /no/such/binary"},
	} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			for _, tok := range c.req {
				b.WriteString(tok)
				b.WriteByte(0)
			}
			var ns *os.File
			if c.mntns {
				if ns, err = os.Open("/proc/self/ns/mnt"); err != nil {
					t.Fatal(err)
				}
				defer ns.Close()
			}
			pid, err := Start(t.Context(), bin, b.Bytes(), log, ns, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Start = %d, %v; want an error with %q", pid, err, c.want)
			}
			var ws unix.WaitStatus
			if p, err := unix.Wait4(-1, &ws, unix.WALL|unix.WNOHANG, nil); !errors.Is(err, unix.ECHILD) {
				t.Fatalf("a child is left: wait4 = %d, %v", p, err)
			}
		})
	}
}
