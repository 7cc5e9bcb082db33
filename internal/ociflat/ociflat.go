// Package ociflat flattens an OCI image's layers into one tar stream with
// the whiteouts applied: the root filesystem as a container would see it.
// Shared by the backends that import images (runtime/local unpacks the
// stream, incus re-packs it as an Incus image).
package ociflat

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Whiteout names of the OCI image spec (layer.md, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Flatten writes img's layers to w as one tar stream, top layer first, with
// the OCI whiteouts applied: an entry is dropped when an upper layer has
// the same path (the first entry for a path wins), when an upper layer
// deleted it or one of its parents (".wh.NAME", or a non-directory
// replacing a parent) or when an upper layer made one of its parent
// directories opaque (".wh..wh..opq": the lower layers' content of that
// directory is hidden, the layer's own is kept). Whiteout entries
// themselves are not written. It is mutate.Extract plus opaque directories,
// which mutate.Extract ignores.
func Flatten(img v1.Image, w io.Writer) error {
	tw := tar.NewWriter(w)
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("image layers: %w", err)
	}
	// seen: paths an upper layer had; true if nothing below them may
	// appear (not a directory). opaque: directories made opaque, and
	// deleted: paths whited out (".wh.NAME"), each with the index of the
	// layer that did it: both act on lower layers only, never on what
	// their own layer has (a ".wh.foo" sorts before the layer's own "foo").
	seen := map[string]bool{}
	opaque := map[string]int{}
	deleted := map[string]int{}
	hidden := func(name string, layer int) bool {
		if i, ok := deleted[name]; ok && i > layer {
			return true
		}
		for d := path.Dir(name); ; d = path.Dir(d) {
			if seen[d] {
				return true
			}
			if i, ok := opaque[d]; ok && i > layer {
				return true
			}
			if i, ok := deleted[d]; ok && i > layer {
				return true
			}
			if d == "." || d == "/" {
				return false
			}
		}
	}
	for i := len(layers) - 1; i >= 0; i-- {
		if err := flattenLayer(layers[i], i, tw, seen, opaque, deleted, hidden); err != nil {
			return err
		}
	}
	return tw.Close()
}

func flattenLayer(l v1.Layer, i int, tw *tar.Writer, seen map[string]bool, opaque, deleted map[string]int, hidden func(string, int) bool) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return fmt.Errorf("layer %d: %w", i, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		// Absolute and escaping names pass through: the unpacker refuses
		// them.
		name := path.Clean(hdr.Name)
		dir, base := path.Split(name)
		dir = path.Clean(dir)
		if base == whiteoutOpaque {
			if _, ok := opaque[dir]; !ok && !hidden(name, i) {
				opaque[dir] = i
			}
			continue
		}
		tombstone := strings.HasPrefix(base, whiteoutPrefix)
		if tombstone {
			name = path.Join(dir, strings.TrimPrefix(base, whiteoutPrefix))
		}
		if hidden(name, i) {
			continue
		}
		if gone, ok := seen[name]; ok {
			// An upper layer has name. If that is a directory and this
			// layer deletes or replaces it, the upper directory is a new
			// one: what lower layers have below it is hidden.
			if _, set := opaque[name]; !gone && !set && (tombstone || hdr.Typeflag != tar.TypeDir) {
				opaque[name] = i
			}
			continue
		}
		if tombstone {
			if _, ok := deleted[name]; !ok {
				deleted[name] = i
			}
			continue
		}
		seen[name] = hdr.Typeflag != tar.TypeDir
		hdr.Name = name
		hdr.Format = tar.FormatPAX // no USTAR length limits on names
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Size > 0 {
			if _, err := io.CopyN(tw, tr, hdr.Size); err != nil {
				return err
			}
		}
	}
}
