package local

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// BaseTemplate is the template every local backend has and sandboxes get
// when they name none: the root filesystem of Options.BaseRootfs (a Debian
// made from packages by scripts/base-rootfs.sh), or the host view when
// there is none.
const BaseTemplate = "base"

// HostTemplate is the host view every local backend has: the host's /usr
// read-only, a synthesized /etc, writable /home/user and /tmp. Whatever
// the host has installed, and nothing its /usr lacks.
const HostTemplate = "host"

// envdPath is where the envd binary appears inside every sandbox, bind-mounted
// read-only from the host.
const envdPath = "/opt/sandboxd/envd"

// envdSocketDir is where the per-sandbox host socket directory appears inside
// the sandbox; envd listens on envdSocketDir/envd.sock.
const envdSocketDir = "/run/envd"

// template is what a sandbox's root is built from: lowers are the
// read-only overlay lower directories, top first (one for a template of
// the backend; layers on that for one of DefineTemplate), mounts are bind
// mounts added on top (for host, the host's /usr).
type template struct {
	name   string
	lowers []string
	mounts []specs.Mount
	// base is the template of the backend whose directory is the bottom of
	// lowers and whose mounts these are: name itself for one of the
	// backend's, "" for a layer stack that is a whole root on its own.
	base string
	// defined: made by DefineTemplate, not by New.
	defined bool
	// env is an imported image's ENV, under every sandbox's own.
	env map[string]string
	// userNS: its lower directories can be read idmapped (setupUserNS), so
	// its sandboxes get a user namespace when the backend has them.
	userNS bool
}

// lower is the one lower directory of a template of the backend.
func (t *template) lower() string { return t.lowers[len(t.lowers)-1] }

// entry is one file, directory or symlink of a synthesized template.
type entry struct {
	path     string // relative, slash-separated
	mode     fs.FileMode
	uid, gid int
	data     string // file content, or symlink target
}

func dir(p string, mode fs.FileMode) entry { return entry{path: p, mode: fs.ModeDir | mode} }
func file(p, data string) entry            { return entry{path: p, mode: 0o644, data: data} }
func symlink(p, target string) entry {
	return entry{path: p, mode: fs.ModeSymlink | 0o777, data: target}
}

const (
	etcPasswd = "root:x:0:0:root:/root:/bin/bash\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" +
		"user:x:1000:1000:user:/home/user:/bin/bash\n"
	etcGroup = "root:x:0:\ntty:x:5:\nusers:x:100:user\nnogroup:x:65534:\nuser:x:1000:\n"
	etcHosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	// No egress yet: point DNS at the sandbox's own loopback, where nothing
	// listens, so lookups fail at once instead of timing out.
	etcResolv = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
	etcNSS    = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n" +
		"protocols: files\nservices: files\nethers: files\nrpc: files\n"
)

// hostEtc are host /etc paths copied into the host template when present:
// what the dynamic loader, Debian's alternatives, TLS and Python need. Nothing
// secret (no shadow, keys or host names).
var hostEtc = []string{
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl/certs",
	"ca-certificates.conf", "localtime", "timezone", "protocols", "services",
	"bash.bashrc", "profile", "profile.d", "inputrc", "mime.types",
	"python3", "python3.11", "python3.12", "python3.13", "gitconfig",
	"debian_version", "os-release", "lsb-release",
}

// hostEntries returns the synthesized content of the host template, and the
// bind mounts that go with it (host /usr, and /bin etc. where the host has
// no merged /usr).
func hostEntries() ([]entry, []specs.Mount, error) {
	ents := []entry{
		dir(".", 0o755),
		dir("usr", 0o755), dir("proc", 0o555), dir("sys", 0o555), dir("dev", 0o755),
		dir("etc", 0o755), dir("root", 0o700), dir("home", 0o755),
		{path: "home/user", mode: fs.ModeDir | 0o755, uid: 1000, gid: 1000},
		dir("tmp", 0o1777), dir("var", 0o755), dir("var/tmp", 0o1777),
		dir("var/lib", 0o755), dir("var/cache", 0o755), dir("var/log", 0o755),
		dir("run", 0o755), dir("run/envd", 0o700), dir("opt", 0o755),
		dir("opt/sandboxd", 0o755), {path: "opt/sandboxd/envd", mode: 0o755},
		dir("mnt", 0o755), dir("srv", 0o755), dir("media", 0o755),
		file("etc/passwd", etcPasswd), file("etc/group", etcGroup),
		file("etc/hosts", etcHosts), file("etc/resolv.conf", etcResolv),
		file("etc/nsswitch.conf", etcNSS), file("etc/hostname", "sandbox\n"),
		{path: "etc/shadow", mode: 0o640, data: "root:*:1::::::\nnobody:*:1::::::\nuser:*:1::::::\n"},
		file("etc/shells", "/bin/sh\n/bin/bash\n/usr/bin/sh\n/usr/bin/bash\n"),
	}
	mounts := []specs.Mount{roBind("/usr", "/usr")}
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		fi, err := os.Lstat("/" + d)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return nil, nil, err
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink("/" + d)
			if err != nil {
				return nil, nil, err
			}
			if !strings.HasPrefix(target, "usr/") && !strings.HasPrefix(target, "/usr/") {
				return nil, nil, fmt.Errorf("host /%s links outside /usr (%s)", d, target)
			}
			ents = append(ents, symlink(d, target))
		case fi.IsDir():
			ents = append(ents, dir(d, 0o755))
			mounts = append(mounts, roBind("/"+d, "/"+d))
		}
	}
	for _, p := range hostEtc {
		copied, err := hostTree("/etc/"+p, "etc/"+p)
		if err != nil {
			return nil, nil, err
		}
		ents = append(ents, copied...)
	}
	// Parents of copied entries that are not in the list yet (etc/ssl).
	seen := map[string]bool{}
	for _, e := range ents {
		seen[e.path] = true
	}
	var parents []entry
	for _, e := range ents {
		for d := pathDir(e.path); d != "." && !seen[d]; d = pathDir(d) {
			seen[d] = true
			parents = append(parents, dir(d, 0o755))
		}
	}
	ents = append(ents, parents...)
	slices.SortFunc(ents, func(a, b entry) int { return strings.Compare(a.path, b.path) })
	return ents, mounts, nil
}

func pathDir(p string) string { return filepath.Dir(p) }

// baseRootfs resolves Options.BaseRootfs to the directory it names and
// checks that it holds a root filesystem envd can start in (a shell).
func baseRootfs(p string) (string, error) {
	dir, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("root filesystem %s: %w", p, err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return "", err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("root filesystem %s: not a directory", p)
	}
	if _, err := os.Stat(filepath.Join(dir, "bin", "sh")); err != nil {
		return "", fmt.Errorf("root filesystem %s: no /bin/sh: %w", p, err)
	}
	return dir, nil
}

// hostTree reads a host file, symlink or directory tree (regular files up to
// 1 MiB each) as entries under rel. A missing path yields nothing.
func hostTree(host, rel string) ([]entry, error) {
	var ents []entry
	err := filepath.WalkDir(host, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil
			}
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		r := rel
		if p != host {
			r = rel + "/" + filepath.ToSlash(strings.TrimPrefix(p, host+"/"))
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			ents = append(ents, symlink(r, target))
		case fi.IsDir():
			ents = append(ents, dir(r, fi.Mode().Perm()))
		case fi.Mode().IsRegular() && fi.Size() <= 1<<20:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			ents = append(ents, entry{path: r, mode: fi.Mode().Perm(), data: string(b)})
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return ents, err
}

// digest names a template's content, so that a changed host /etc gives a new
// directory instead of rewriting one that live overlays use as lower.
func digest(ents []entry) string {
	h := sha256.New()
	for _, e := range ents {
		fmt.Fprintf(h, "%s\x00%o\x00%d\x00%d\x00%d\x00%s\x00", e.path, uint32(e.mode), e.uid, e.gid, len(e.data), e.data)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// writeTemplate materializes ents at dst if dst does not exist yet. It
// builds in a temporary sibling and renames it into place, so a crash never
// leaves a half-written template under the final name.
func writeTemplate(dst string, ents []entry) error {
	return buildDir(dst, tempSibling(dst), func(tmp string) error { return writeEntries(tmp, ents) })
}

// tempSibling makes the temporary directories buildDir fills for dst:
// next to it, on the same filesystem, with a name Reconcile knows as debris.
func tempSibling(dst string) func() (string, func(), error) {
	return func() (string, func(), error) {
		tmp, err := os.MkdirTemp(filepath.Dir(dst), ".tmp-"+filepath.Base(dst)+"-")
		return tmp, func() {}, err
	}
}

// buildDir makes the directory dst with fill, unless it exists: fill
// writes into an empty temporary directory from mkTemp, which is renamed
// into place once complete, so that a crash never leaves a half-made
// directory under the final name (what mkTemp made, it removes with its
// release func after the rename or the failure). A concurrent builder that
// renamed first wins: its dst is kept, and nil returned.
func buildDir(dst string, mkTemp func() (tmp string, release func(), err error), fill func(tmp string) error) error {
	if _, err := os.Lstat(dst); err == nil {
		return nil
	}
	tmp, release, err := mkTemp()
	if err != nil {
		return err
	}
	defer release()
	defer os.RemoveAll(tmp)
	if err := fill(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		if _, statErr := os.Lstat(dst); statErr == nil {
			return nil // a concurrent writer won
		}
		return err
	}
	return nil
}

// writeEntries materializes ents in the directory dir.
func writeEntries(dir string, ents []entry) error {
	for _, e := range ents {
		p := filepath.Join(dir, filepath.FromSlash(e.path))
		switch {
		case e.mode&fs.ModeDir != 0:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case e.mode&fs.ModeSymlink != 0:
			if err := os.Symlink(e.data, p); err != nil {
				return err
			}
			continue // no chmod/chown on links
		default:
			if err := os.WriteFile(p, []byte(e.data), 0o600); err != nil {
				return err
			}
		}
		if err := os.Lchown(p, e.uid, e.gid); err != nil {
			return err
		}
		if err := os.Chmod(p, e.mode&(fs.ModePerm|fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid)); err != nil {
			return err
		}
	}
	return nil
}

func roBind(src, dst string) specs.Mount {
	return specs.Mount{
		Destination: dst, Source: src, Type: "bind",
		Options: []string{"rbind", "ro", "nosuid", "nodev"},
	}
}
