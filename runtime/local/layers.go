package local

// The layer store (runtime.Layered): layers are directories under
// <Root>/templates/layers, inside the templates directory so that its
// idmapped view (userns.go) covers them, and stored as templates are,
// unshifted: a file root owns inside is host root's. A template of
// DefineTemplate is an overlay of its layers, top first, on its base
// template's directory.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/runc/libcontainer"

	"github.com/sandboxd/sandboxd/runtime"
)

// layersDir is where the layers of a backend with root root are.
func layersDir(root string) string { return filepath.Join(root, "templates", "layers") }

func (b *Backend) layersDir() string { return layersDir(b.opts.Root) }

func (b *Backend) layerDir(key string) string { return filepath.Join(b.layersDir(), key) }

// layerKeys returns the keys of the layers among lowers.
func (b *Backend) layerKeys(lowers []string) []string {
	var keys []string
	for _, l := range lowers {
		if filepath.Dir(l) == b.layersDir() {
			keys = append(keys, filepath.Base(l))
		}
	}
	return keys
}

// layerTemp makes the temporary directories buildDir fills for layer key,
// registered so that Reconcile leaves them alone until released.
func (b *Backend) layerTemp(key string) func() (string, func(), error) {
	return func() (string, func(), error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		tmp, err := os.MkdirTemp(b.layersDir(), ".tmp-"+key+"-")
		if err != nil {
			return "", nil, err
		}
		b.layerTemps[tmp] = true
		return tmp, func() { b.releaseLayerTemp(tmp) }, nil
	}
}

func (b *Backend) releaseLayerTemp(tmp string) {
	b.mu.Lock()
	delete(b.layerTemps, tmp)
	b.mu.Unlock()
}

// ImportImage makes layer key from img's root filesystem, as an image
// archive of Options.Templates is imported (importImage).
func (b *Backend) ImportImage(ctx context.Context, key string, img v1.Image) error {
	if err := runtime.CheckLayerKey(key); err != nil {
		return fmt.Errorf("import image: %w", err)
	}
	if img == nil {
		return fmt.Errorf("import image as layer %s: %w: no image", key, runtime.ErrInvalidSpec)
	}
	err := buildDir(b.layerDir(key), b.layerTemp(key), func(tmp string) error { return importImage(ctx, img, tmp) })
	if err != nil {
		return fmt.Errorf("import image as layer %s: %w", key, err)
	}
	return nil
}

// Commit makes layer key from sandbox id's overlay upper directory: a copy
// with all overlayfs reads from a lower layer (whiteouts, opaque
// directories, xattrs, owners, modes, times, hard links), owners shifted
// back out of the sandboxes' range when the sandbox has a user namespace.
//
// A running sandbox is frozen (the cgroup freezer, as Pause) for the copy,
// so that the layer is one moment of its files and not a mix of before and
// after a write; it is thawed afterwards. One paused in memory stays
// paused; one paused to disk is copied from its saved layer, which nothing
// writes.
func (b *Backend) Commit(ctx context.Context, id, key string) error {
	if err := runtime.CheckLayerKey(key); err != nil {
		return fmt.Errorf("commit sandbox %s: %w", id, err)
	}
	dst := b.layerDir(key)
	if _, err := os.Lstat(dst); err == nil {
		return nil // no need to freeze the sandbox
	}
	err := b.withFrozenUpper(ctx, id, func(s *sandbox, upper string) error {
		var idBase uint32
		if s.meta.UserNS {
			idBase = userNSBase
		}
		return buildDir(dst, b.layerTemp(key), func(tmp string) error { return copyTreeIDs(upper, tmp, idBase) })
	})
	if err != nil {
		return fmt.Errorf("commit sandbox %s as layer %s: %w", id, key, err)
	}
	return nil
}

// withFrozenUpper runs fn on sandbox id's writable layer (the saved one of
// a sandbox paused to disk) while its processes are frozen, so that what fn
// reads is one moment's files, and under its lock, so that it is not
// destroyed, paused or resumed meanwhile. A sandbox paused in memory stays
// frozen; a running one is thawed afterwards.
func (b *Backend) withFrozenUpper(ctx context.Context, id string, fn func(s *sandbox, upper string) error) error {
	s, err := b.lockLive(ctx, id)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	upper := s.upperDir()
	var thaw func() error
	if s.meta.Paused == pausedDisk {
		upper = filepath.Join(b.savedDir(id), "upper")
	} else {
		ctr, err := s.container()
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		switch st, err := ctr.Status(); {
		case err != nil:
			return fmt.Errorf("sandbox %s: %w", id, err)
		case st == libcontainer.Running:
			if err := freeze(ctx, ctr); err != nil {
				return fmt.Errorf("sandbox %s: freeze: %w", id, err)
			}
			thaw = ctr.Resume
		case st != libcontainer.Paused:
			return fmt.Errorf("sandbox %s: %w", id, runtime.ErrNotRunning)
		}
	}
	err = fn(s, upper)
	if thaw != nil {
		if terr := thaw(); terr != nil {
			err = errors.Join(err, fmt.Errorf("thaw: %w", terr))
		}
	}
	return err
}

// HasLayer reports whether layer key exists.
func (b *Backend) HasLayer(_ context.Context, key string) (bool, error) {
	if err := runtime.CheckLayerKey(key); err != nil {
		return false, err
	}
	_, err := os.Lstat(b.layerDir(key))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, err
}

// RemoveLayer deletes layer key unless a live sandbox (one being created,
// running, paused, paused to disk) has it in its root. The layer is renamed
// away under the lock that registers sandboxes, then deleted: a create
// that resolved its template before the rename fails to mount (the
// caller removed a layer its template has).
func (b *Backend) RemoveLayer(_ context.Context, key string) error {
	if err := runtime.CheckLayerKey(key); err != nil {
		return fmt.Errorf("remove layer: %w", err)
	}
	tmp := filepath.Join(b.layersDir(), ".tmp-rm-"+key+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	b.mu.Lock()
	for id, s := range b.sbx {
		if slices.Contains(s.layers, key) {
			b.mu.Unlock()
			return fmt.Errorf("remove layer %s: %w: sandbox %s", key, runtime.ErrInUse, id)
		}
	}
	err := os.Rename(b.layerDir(key), tmp)
	if err == nil {
		b.layerTemps[tmp] = true
	}
	b.mu.Unlock()
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove layer %s: %w", key, err)
	}
	defer b.releaseLayerTemp(tmp)
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("remove layer %s: %w", key, err)
	}
	return nil
}

// reconcileLayers removes what writes and removals of layers that a crash
// interrupted left in the layer store.
func (b *Backend) reconcileLayers() error {
	b.mu.Lock()
	ents, err := os.ReadDir(b.layersDir())
	var stale []string
	for _, e := range ents {
		p := filepath.Join(b.layersDir(), e.Name())
		if strings.HasPrefix(e.Name(), ".tmp-") && !b.layerTemps[p] {
			stale = append(stale, p)
		}
	}
	b.mu.Unlock()
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	errs := []error{err}
	for _, p := range stale {
		errs = append(errs, os.RemoveAll(p))
	}
	return errors.Join(errs...)
}

// DefineTemplate makes name an overlay of layers (bottom first) on base's
// root: base's directories, with base's bind mounts (the host's /usr for
// "host"). base may itself be a template of DefineTemplate.
func (b *Backend) DefineTemplate(_ context.Context, name, base string, layers []string) error {
	t, err := b.stack(name, base, layers)
	if err != nil {
		return fmt.Errorf("define template %q: %w", name, err)
	}
	b.tplMu.Lock()
	defer b.tplMu.Unlock()
	if cur := b.templates[name]; cur != nil && !cur.defined {
		return fmt.Errorf("define template %q: %w: a template of the backend", name, runtime.ErrInvalidSpec)
	}
	b.templates[name] = t
	return nil
}

// stack resolves DefineTemplate's arguments into a template.
func (b *Backend) stack(name, base string, layers []string) (*template, error) {
	if !runtime.ValidID(name) {
		return nil, fmt.Errorf("%w: bad template name", runtime.ErrInvalidSpec)
	}
	if base == "" && len(layers) == 0 {
		return nil, fmt.Errorf("%w: no base and no layer", runtime.ErrInvalidSpec)
	}
	t := &template{name: name, defined: true, userNS: true}
	for i := len(layers) - 1; i >= 0; i-- {
		key := layers[i]
		if err := runtime.CheckLayerKey(key); err != nil {
			return nil, err
		}
		if slices.Contains(layers[i+1:], key) {
			return nil, fmt.Errorf("%w: layer %s twice", runtime.ErrInvalidSpec, key)
		}
		fi, err := os.Lstat(b.layerDir(key))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: layer %s", runtime.ErrTemplateNotFound, key)
		}
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("layer %s: not a directory", key)
		}
		t.lowers = append(t.lowers, b.layerDir(key))
	}
	if base != "" {
		bt := b.template(base)
		if bt == nil {
			return nil, fmt.Errorf("%w: base %q", runtime.ErrTemplateNotFound, base)
		}
		for _, l := range bt.lowers {
			if slices.Contains(t.lowers, l) {
				return nil, fmt.Errorf("%w: layer %s is in base %q too", runtime.ErrInvalidSpec, filepath.Base(l), base)
			}
		}
		t.lowers = append(t.lowers, bt.lowers...)
		t.base, t.mounts, t.userNS = bt.base, bt.mounts, bt.userNS
	}
	// A sandbox's overlay takes the longest options with the longest id
	// and, with a user namespace, the views' paths.
	lowers := t.lowers
	if b.userNS && t.userNS {
		lowers = make([]string, len(t.lowers))
		for i, l := range t.lowers {
			lowers[i] = b.viewPath(l)
		}
	}
	s := &sandbox{dir: filepath.Join(b.sandboxesDir(), strings.Repeat("x", 63))}
	if _, err := overlayOptions(lowers, s.upperDir(), filepath.Join(s.diskDir(), "work")); err != nil {
		return nil, err
	}
	return t, nil
}

// UndefineTemplate forgets a template of DefineTemplate.
func (b *Backend) UndefineTemplate(_ context.Context, name string) error {
	b.tplMu.Lock()
	defer b.tplMu.Unlock()
	cur := b.templates[name]
	if cur == nil {
		return nil
	}
	if !cur.defined {
		return fmt.Errorf("undefine template %q: %w: a template of the backend", name, runtime.ErrInvalidSpec)
	}
	delete(b.templates, name)
	return nil
}

// unshiftID maps a host id of the sandboxes' range back to the sandbox's.
func unshiftID(id, base uint32) uint32 {
	if base != 0 && id >= base && id < base+userNSSize {
		return id - base
	}
	return id
}

// unshiftXattr returns val, the value of xattr name, with the host ids it
// holds unshifted: the root id of namespaced file capabilities (v3) and
// the user and group entries of POSIX ACLs.
func unshiftXattr(name string, val []byte, base uint32) []byte {
	const (
		capV3      = 0x03000000
		capV3Size  = 24
		aclHeader  = 4
		aclEntry   = 8
		aclUser    = 0x02
		aclGroup   = 0x08
		aclVersion = 2
	)
	le := binary.LittleEndian
	switch name {
	case "security.capability":
		if len(val) == capV3Size && le.Uint32(val)&0xff000000 == capV3 {
			out := slices.Clone(val)
			le.PutUint32(out[20:], unshiftID(le.Uint32(val[20:]), base))
			return out
		}
	case "system.posix_acl_access", "system.posix_acl_default":
		if len(val) < aclHeader || (len(val)-aclHeader)%aclEntry != 0 || le.Uint32(val) != aclVersion {
			return val
		}
		out := slices.Clone(val)
		for off := aclHeader; off < len(out); off += aclEntry {
			if tag := le.Uint16(out[off:]); tag == aclUser || tag == aclGroup {
				le.PutUint32(out[off+4:], unshiftID(le.Uint32(out[off+4:]), base))
			}
		}
		return out
	}
	return val
}

// BaseDigest hashes base's directories (the backend's own are named after
// their content's digest) and, for a bind-mounted host directory (base's
// /usr), the change times of it and its main subdirectories: a package
// installed or removed on the host changes one of them.
func (b *Backend) BaseDigest(_ context.Context, base string) (string, error) {
	t := b.template(base)
	if t == nil {
		return "", fmt.Errorf("base digest: %w: %q", runtime.ErrTemplateNotFound, base)
	}
	h := sha256.New()
	for _, l := range t.lowers {
		fmt.Fprintf(h, "lower %s\n", l)
	}
	for _, m := range t.mounts {
		fmt.Fprintf(h, "mount %s %s\n", m.Source, m.Destination)
		for _, sub := range []string{"", "bin", "sbin", "lib", "lib64", "libexec", "share", "local/bin", "local/lib"} {
			if fi, err := os.Stat(filepath.Join(m.Source, sub)); err == nil {
				fmt.Fprintf(h, "%s %d\n", sub, fi.ModTime().UnixNano())
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}
