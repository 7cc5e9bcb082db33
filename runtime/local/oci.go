package local

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/ociflat"
)

// ociRefAnnotation names an image in an OCI layout's index.json.
const ociRefAnnotation = "org.opencontainers.image.ref.name"

// ociImportVersion goes into the name of imported templates: bump it when
// what an import produces changes, so old imports are not reused.
const ociImportVersion = "oci-import-v2" // v2: opaque whiteouts

// ImportOCI unpacks the flattened root filesystem of a local image archive
// into destDir, which must be empty or not exist yet. archivePath is either
// a docker-save tarball (a single image) or an OCI image layout directory;
// "LAYOUT:REF" selects the image whose org.opencontainers.image.ref.name is
// REF when the layout holds several (otherwise its single image, or the one
// for this machine's platform). No registry is contacted.
//
// The layers are flattened as overlayfs would stack them (see flatten:
// ".wh.NAME" deletes NAME of lower layers, ".wh..wh..opq" hides all a lower
// layer has in its directory) and unpacked without ever following a symlink: entries with absolute names or
// ".." escapes, and entries (or hard-link targets) whose parent is a symlink,
// are refused with an error. Modes (with setuid, setgid, sticky), owners
// (uid/gid as in the tar headers) and file times are kept; device nodes and
// FIFOs are skipped (a sandbox gets its own /dev); extended attributes are
// not restored.
func ImportOCI(ctx context.Context, archivePath, destDir string) error {
	img, _, err := openOCI(archivePath)
	if err != nil {
		return err
	}
	return unpackImage(ctx, img, destDir)
}

// openOCI opens the image at src (see ImportOCI) and returns it with a key
// that identifies its content: the manifest digest for a layout, the
// file's sha256 for a tarball.
func openOCI(src string) (v1.Image, string, error) {
	p, ref := src, ""
	fi, err := os.Stat(p)
	if err != nil {
		if i := strings.LastIndexByte(src, ':'); i > 0 {
			if fi2, err2 := os.Stat(src[:i]); err2 == nil && fi2.IsDir() {
				p, ref, fi, err = src[:i], src[i+1:], fi2, nil
			}
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("image archive: %w", err)
	}
	switch {
	case fi.IsDir():
		if _, err := os.Stat(filepath.Join(p, "oci-layout")); err != nil {
			return nil, "", fmt.Errorf("image archive %s: not an OCI image layout: %w", p, err)
		}
		img, err := layoutImage(p, ref)
		if err != nil {
			return nil, "", fmt.Errorf("image archive %s: %w", src, err)
		}
		d, err := img.Digest()
		if err != nil {
			return nil, "", fmt.Errorf("image archive %s: %w", src, err)
		}
		return img, "layout:" + d.String(), nil
	case fi.Mode().IsRegular():
		if ref != "" {
			return nil, "", fmt.Errorf("image archive %s: selecting an image by name works for OCI layouts only", src)
		}
		img, err := tarball.ImageFromPath(p, nil)
		if err != nil {
			return nil, "", fmt.Errorf("image archive %s: %w", p, err)
		}
		sum, err := fileSHA256(p)
		if err != nil {
			return nil, "", fmt.Errorf("image archive %s: %w", p, err)
		}
		return img, "tarball:sha256:" + sum, nil
	default:
		return nil, "", fmt.Errorf("image archive %s: neither a file nor a directory", p)
	}
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// layoutImage picks one image of the OCI layout at p: the one named ref,
// or the only one, descending into nested indexes by this machine's
// platform.
func layoutImage(p, ref string) (v1.Image, error) {
	lp, err := layout.FromPath(p)
	if err != nil {
		return nil, err
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	descs := im.Manifests
	if ref != "" {
		descs = nil
		for _, d := range im.Manifests {
			if d.Annotations[ociRefAnnotation] == ref {
				descs = append(descs, d)
			}
		}
		if len(descs) == 0 {
			return nil, fmt.Errorf("no image named %q (annotation %s)", ref, ociRefAnnotation)
		}
	}
	return pickImage(idx, descs, 0)
}

func pickImage(idx v1.ImageIndex, descs []v1.Descriptor, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errors.New("image indexes nested too deep")
	}
	if len(descs) > 1 {
		var here []v1.Descriptor
		for _, d := range descs {
			if d.Platform != nil && d.Platform.OS == goruntime.GOOS && d.Platform.Architecture == goruntime.GOARCH {
				here = append(here, d)
			}
		}
		if len(here) > 0 {
			descs = here
		}
	}
	switch len(descs) {
	case 0:
		return nil, errors.New("no image in the index")
	case 1:
	default:
		return nil, fmt.Errorf("%d images: select one with PATH:REF (annotation %s)", len(descs), ociRefAnnotation)
	}
	d := descs[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		im, err := child.IndexManifest()
		if err != nil {
			return nil, err
		}
		return pickImage(child, im.Manifests, depth+1)
	}
	return idx.Image(d.Digest)
}

// unpackImage writes img's flattened filesystem into destDir.
func unpackImage(ctx context.Context, img v1.Image, destDir string) (err error) {
	if err := os.MkdirAll(destDir, 0o700); err != nil {
		return err
	}
	if ents, err := os.ReadDir(destDir); err != nil {
		return err
	} else if len(ents) > 0 {
		return fmt.Errorf("unpack image into %s: directory not empty", destDir)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(ociflat.Flatten(img, pw)) }()
	// Closing the reader ends flatten (its next write fails) if unpacking
	// stops early.
	defer pr.Close()
	rc := pr
	u, err := newUnpacker(destDir)
	if err != nil {
		return err
	}
	defer u.close()
	if err := u.unpack(ctx, tar.NewReader(rc)); err != nil {
		return fmt.Errorf("unpack image into %s: %w", destDir, err)
	}
	return nil
}

// unpacker creates tar entries under root without following symlinks: every
// path is walked from root's descriptor one component at a time with
// O_NOFOLLOW, and new entries are created relative to their parent's
// descriptor.
type unpacker struct {
	root int
	// implicit are directories created as parents of other entries, before
	// (or without) their own header: flatten emits the top layer first, so
	// a directory's header may come after its children.
	implicit map[string]bool
}

func newUnpacker(dir string) (*unpacker, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	if err := unix.Fchown(fd, 0, 0); err == nil {
		err = unix.Fchmod(fd, 0o755)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &unpacker{root: fd, implicit: map[string]bool{}}, nil
}

func (u *unpacker) close() { unix.Close(u.root) }

// entryName validates a tar entry's name: relative, and never above the
// root. It returns the cleaned name ("." for the root itself).
func entryName(n string) (string, error) {
	if n == "" {
		return "", errors.New("empty entry name")
	}
	if strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("refused entry %q: absolute name", n)
	}
	c := path.Clean(n)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("refused entry %q: outside the root", n)
	}
	return c, nil
}

// parent opens the directory holding rel and returns it with rel's last
// component. Missing directories are created (root-owned, 0755) when create
// is set. A symlink or non-directory on the way is an error.
func (u *unpacker) parent(rel string, create bool) (int, string, error) {
	fd, err := unix.Dup(u.root)
	if err != nil {
		return -1, "", err
	}
	dir, base := path.Split(rel)
	walked := ""
	for _, c := range strings.Split(strings.TrimSuffix(dir, "/"), "/") {
		if c == "" || c == "." {
			continue
		}
		walked = path.Join(walked, c)
		next, err := unix.Openat(fd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, c, 0o700); err == nil {
				next, err = unix.Openat(fd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err == nil {
					if err = unix.Fchmod(next, 0o755); err != nil {
						unix.Close(next)
					}
				}
			}
			if err == nil {
				u.implicit[walked] = true
			}
		}
		unix.Close(fd)
		switch {
		case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
			return -1, "", fmt.Errorf("refused %q: %s is a symlink or not a directory", rel, walked)
		case err != nil:
			return -1, "", &os.PathError{Op: "open", Path: walked, Err: err}
		}
		fd = next
	}
	return fd, base, nil
}

type hardlink struct{ name, target string }

func (u *unpacker) unpack(ctx context.Context, tr *tar.Reader) error {
	var links []hardlink
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue // the root stays root-owned 0755
		}
		switch hdr.Typeflag {
		case tar.TypeLink:
			target, err := entryName(hdr.Linkname)
			if err != nil {
				return fmt.Errorf("hard link %q: %w", name, err)
			}
			// The target may come from a lower layer, which flatten
			// emits later: link once everything else is there.
			links = append(links, hardlink{name, target})
			continue
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		default:
			continue // devices, FIFOs and the like
		}
		if err := u.create(name, hdr, tr); err != nil {
			return err
		}
	}
	for _, l := range links {
		if err := u.link(l); err != nil {
			return err
		}
	}
	return nil
}

// create makes one file, directory or symlink. The first entry for a path
// wins: flatten emits upper layers first.
func (u *unpacker) create(name string, hdr *tar.Header, r io.Reader) error {
	pfd, base, err := u.parent(name, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	mode := uint32(hdr.Mode) & 0o7777
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if hdr.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR && u.implicit[name] {
			delete(u.implicit, name)
			return u.dirMeta(pfd, base, hdr, mode)
		}
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return &os.PathError{Op: "mkdir", Path: name, Err: err}
		}
		return u.dirMeta(pfd, base, hdr, mode)
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return &os.PathError{Op: "symlink", Path: name, Err: err}
		}
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "chown", Path: name, Err: err}
		}
		return u.times(pfd, base, hdr)
	default: // regular file
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return &os.PathError{Op: "create", Path: name, Err: err}
		}
		f := os.NewFile(uintptr(fd), name)
		_, err = io.CopyN(f, r, hdr.Size)
		if err == nil {
			err = unix.Fchown(fd, hdr.Uid, hdr.Gid)
		}
		if err == nil {
			err = unix.Fchmod(fd, mode) // after chown, which clears setuid
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		return u.times(pfd, base, hdr)
	}
}

func (u *unpacker) dirMeta(pfd int, base string, hdr *tar.Header, mode uint32) error {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: hdr.Name, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return &os.PathError{Op: "chown", Path: hdr.Name, Err: err}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return &os.PathError{Op: "chmod", Path: hdr.Name, Err: err}
	}
	return nil
}

func (u *unpacker) times(pfd int, base string, hdr *tar.Header) error {
	if hdr.ModTime.IsZero() {
		return nil
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: hdr.Name, Err: err}
	}
	return nil
}

// link makes a hard link. Its target must be a regular file or symlink
// reached without following symlinks; a missing target (whited out) skips
// the link.
func (u *unpacker) link(l hardlink) error {
	opfd, obase, err := u.parent(l.target, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hard link %q: %w", l.name, err)
	}
	defer unix.Close(opfd)
	npfd, nbase, err := u.parent(l.name, true)
	if err != nil {
		return err
	}
	defer unix.Close(npfd)
	var st unix.Stat_t
	if err := unix.Fstatat(npfd, nbase, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		return nil // an upper layer's entry wins
	}
	if err := unix.Fstatat(opfd, obase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil // target whited out or never there
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFLNK {
		return fmt.Errorf("refused hard link %q: target %q is not a file", l.name, l.target)
	}
	// Flags 0: linkat does not follow a symlink target.
	if err := unix.Linkat(opfd, obase, npfd, nbase, 0); err != nil {
		return &os.PathError{Op: "link", Path: l.name, Err: err}
	}
	return nil
}

// ociTemplate returns the lower directory of the template at src, a
// directory or an image archive. Archives are imported once into
// <tplRoot>/oci-<hash of the image's identity>, which later calls reuse.
func ociTemplate(ctx context.Context, tplRoot, src string) (string, map[string]string, error) {
	if fi, err := os.Stat(src); err == nil && fi.IsDir() {
		if _, err := os.Stat(filepath.Join(src, "oci-layout")); err != nil {
			dir, err := filepath.Abs(src) // a plain directory, used as it is
			return dir, nil, err
		}
	}
	img, key, err := openOCI(src)
	if err != nil {
		return "", nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", nil, fmt.Errorf("image %s: config: %w", src, err)
	}
	sum := sha256.Sum256([]byte(ociImportVersion + "\x00" + key))
	dst := filepath.Join(tplRoot, "oci-"+hex.EncodeToString(sum[:])[:32])
	if err := buildDir(dst, tempSibling(dst), func(tmp string) error { return importImage(ctx, img, tmp) }); err != nil {
		return "", nil, fmt.Errorf("image %s: %w", src, err)
	}
	return dst, imageEnv(cf.Config.Env), nil
}

// imageEnv is an image's ENV as a map; as with template builds, the image's
// USER and WORKDIR are not applied (sandboxes run as E2B's user in
// /home/user).
func imageEnv(kvs []string) map[string]string {
	env := map[string]string{}
	for _, kv := range kvs {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	return env
}

// importImage writes img's root filesystem into the empty directory dir,
// flattened, with the users E2B's conventions need (ensureUsers).
func importImage(ctx context.Context, img v1.Image, dir string) error {
	if err := unpackImage(ctx, img, dir); err != nil {
		return err
	}
	return ensureUsers(dir)
}

// ensureUsers gives an imported image what envd needs: root and user
// (uid/gid 1000, home /home/user) in /etc/passwd and /etc/group, added to
// what the image has if missing, and /home/user if missing. Nothing else of
// the image changes. An image that already has uid 1000 under another name
// gets user as a second name for it.
func ensureUsers(dir string) error {
	u, err := newUnpacker(dir)
	if err != nil {
		return err
	}
	defer u.close()
	if err := u.ensureLines("etc/passwd", []string{
		"root:x:0:0:root:/root:/bin/sh",
		"user:x:1000:1000:user:/home/user:/bin/sh",
	}); err != nil {
		return err
	}
	if err := u.ensureLines("etc/group", []string{"root:x:0:", "user:x:1000:"}); err != nil {
		return err
	}
	pfd, base, err := u.parent("home/user", true)
	if err != nil {
		return nil // /home is a symlink in the image: leave it
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		return nil
	}
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
		return err
	}
	return u.dirMeta(pfd, base, &tar.Header{Name: "home/user", Uid: 1000, Gid: 1000}, 0o755)
}

// ensureLines appends to the colon-separated database rel the lines whose
// first field no line of it has. The file is replaced by rename, never
// written through a symlink.
func (u *unpacker) ensureLines(rel string, lines []string) error {
	pfd, base, err := u.parent(rel, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var old []byte
	mode, uid, gid := uint32(0o644), 0, 0
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("/%s is a symlink", rel)
	case err != nil:
		return &os.PathError{Op: "open", Path: rel, Err: err}
	default:
		f := os.NewFile(uintptr(fd), rel)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			f.Close()
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			f.Close()
			return fmt.Errorf("/%s is not a regular file", rel)
		}
		mode, uid, gid = st.Mode&0o7777, int(st.Uid), int(st.Gid)
		old, err = io.ReadAll(io.LimitReader(f, 16<<20))
		f.Close()
		if err != nil {
			return err
		}
	}
	have := map[string]bool{}
	for _, l := range strings.Split(string(old), "\n") {
		if n, _, ok := strings.Cut(l, ":"); ok {
			have[n] = true
		}
	}
	out := string(old)
	changed := false
	for _, l := range lines {
		n, _, _ := strings.Cut(l, ":")
		if have[n] {
			continue
		}
		if out != "" && !strings.HasSuffix(out, "\n") {
			out += "\n"
		}
		out += l + "\n"
		changed = true
	}
	if !changed {
		return nil
	}
	tmp := base + ".sandboxd-new"
	_ = unix.Unlinkat(pfd, tmp, 0)
	fd, err = unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: rel, Err: err}
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.WriteString(out)
	if err == nil {
		err = unix.Fchown(fd, uid, gid)
	}
	if err == nil {
		err = unix.Fchmod(fd, mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(pfd, tmp, pfd, base)
	}
	if err != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return fmt.Errorf("write /%s: %w", rel, err)
	}
	return nil
}
