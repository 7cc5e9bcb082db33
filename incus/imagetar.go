package incus

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/ociflat"
)

// An imported image goes to Incus as a unified image tarball: metadata.yaml
// and rootfs/, which incusd unpacks with GNU tar (--numeric-owner, the
// owners as the container sees them; an unprivileged container's idmap
// shifts them at its start).

// imageMetadata is the metadata.yaml of a unified image tarball with props
// (the values as JSON strings, which are YAML's double-quoted scalars).
func imageMetadata(props map[string]string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "architecture: %s\ncreation_date: %d\nproperties:\n", incusArch(), time.Now().Unix())
	for _, k := range slices.Sorted(maps.Keys(props)) {
		v, _ := json.Marshal(props[k])
		fmt.Fprintf(&b, "  %s: %s\n", k, v)
	}
	return b.Bytes()
}

// E2B's users, added to an image's /etc/passwd and /etc/group when a line
// of that name is missing (as runtime/local's import does).
var (
	e2bPasswd = []string{"root:x:0:0:root:/root:/bin/sh", "user:x:1000:1000:user:/home/user:/bin/sh"}
	e2bGroup  = []string{"root:x:0:", "user:x:1000:"}
)

// maxAccountFile bounds what repack reads of /etc/passwd or /etc/group.
const maxAccountFile = 16 << 20

// repack writes img's root, flattened (ociflat), as a unified image tarball
// with metadata meta to w. On top of the image it adds what sandboxes need
// when the image lacks it: root and user (uid/gid 1000) in /etc/passwd and
// /etc/group, their homes (/root, and /home/user owned by user), and /usr (which the backend binds
// read-only over itself). Entries GNU tar would refuse or that could leave
// rootfs/ (absolute or ".." names and link targets) and device nodes (an
// unprivileged container cannot use them) are dropped. Hard links are
// written last: the flattened stream has upper layers first, so a link
// may come before its target; one whose target is not in the root is
// dropped.
func repack(img v1.Image, meta []byte, w io.Writer) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(ociflat.Flatten(img, pw)) }()
	defer pr.Close() // ends Flatten if we stop early
	tw := tar.NewWriter(w)
	if err := writeFile(tw, &tar.Header{Name: "metadata.yaml", Mode: 0o644}, meta); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "rootfs/", Typeflag: tar.TypeDir, Mode: 0o755, Format: tar.FormatPAX}); err != nil {
		return err
	}
	kinds := map[string]byte{} // what the root has, by clean relative name
	var links []*tar.Header
	tr := tar.NewReader(pr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("flatten image: %w", err)
		}
		name, ok := rootName(hdr.Name)
		if !ok || hdr.Typeflag == tar.TypeChar || hdr.Typeflag == tar.TypeBlock {
			continue
		}
		if _, dup := kinds[name]; dup {
			continue // Flatten keeps the first (upper) one; so do we
		}
		hdr.Format = tar.FormatPAX
		switch hdr.Typeflag {
		case tar.TypeLink:
			target, ok := rootName(hdr.Linkname)
			if !ok {
				continue
			}
			hdr.Name, hdr.Linkname = name, target
			links = append(links, hdr)
			continue
		case tar.TypeReg, tar.TypeRegA:
			kinds[name] = tar.TypeReg
			if name == "etc/passwd" || name == "etc/group" {
				raw, err := io.ReadAll(io.LimitReader(tr, maxAccountFile))
				if err != nil {
					return fmt.Errorf("flatten image: %w", err)
				}
				want := e2bPasswd
				if name == "etc/group" {
					want = e2bGroup
				}
				hdr.Name = "rootfs/" + name
				if err := writeFile(tw, hdr, ensureLines(raw, want)); err != nil {
					return err
				}
				continue
			}
		default:
			kinds[name] = hdr.Typeflag
		}
		hdr.Name = "rootfs/" + name
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Size > 0 && (hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA) {
			if _, err := io.CopyN(tw, tr, hdr.Size); err != nil {
				return fmt.Errorf("flatten image: %w", err)
			}
		}
	}
	// Hard links whose target is written, until no more can be.
	for progress := true; progress; {
		progress = false
		rest := links[:0]
		for _, l := range links {
			if _, dup := kinds[l.Name]; dup {
				continue
			}
			if kinds[l.Linkname] != tar.TypeReg {
				rest = append(rest, l)
				continue
			}
			kinds[l.Name] = tar.TypeReg
			l.Name, l.Linkname, l.Size = "rootfs/"+l.Name, "rootfs/"+l.Linkname, 0
			if err := tw.WriteHeader(l); err != nil {
				return err
			}
			progress = true
		}
		links = rest
	}
	if err := addConventions(tw, kinds); err != nil {
		return err
	}
	return tw.Close()
}

// addConventions writes what repack adds to an image that lacks it. Nothing
// is written below a path the image has as a non-directory (a symlinked
// /home is left alone).
func addConventions(tw *tar.Writer, kinds map[string]byte) error {
	isDirOrAbsent := func(name string) bool {
		k, ok := kinds[name]
		return !ok || k == tar.TypeDir
	}
	dir := func(name string, mode int64, uid int) error {
		if _, ok := kinds[name]; ok {
			return nil
		}
		kinds[name] = tar.TypeDir
		return tw.WriteHeader(&tar.Header{Name: "rootfs/" + name + "/", Typeflag: tar.TypeDir, Mode: mode,
			Uid: uid, Gid: uid, Format: tar.FormatPAX})
	}
	if isDirOrAbsent("etc") {
		if err := dir("etc", 0o755, 0); err != nil {
			return err
		}
		for _, f := range []struct {
			name  string
			lines []string
		}{{"etc/passwd", e2bPasswd}, {"etc/group", e2bGroup}} {
			if _, ok := kinds[f.name]; ok {
				continue
			}
			if err := writeFile(tw, &tar.Header{Name: "rootfs/" + f.name, Mode: 0o644}, ensureLines(nil, f.lines)); err != nil {
				return err
			}
		}
	}
	// Homes of both users: envd starts processes in them.
	if err := dir("root", 0o700, 0); err != nil {
		return err
	}
	if isDirOrAbsent("home") {
		if err := dir("home", 0o755, 0); err != nil {
			return err
		}
		if err := dir("home/user", 0o755, 1000); err != nil {
			return err
		}
	}
	return dir("usr", 0o755, 0)
}

// rootName is name relative to the root, cleaned; false for the root
// itself and for names that would leave it.
func rootName(name string) (string, bool) {
	if strings.HasPrefix(name, "/") {
		return "", false
	}
	n := path.Clean(name)
	if n == "." || n == ".." || strings.HasPrefix(n, "../") {
		return "", false
	}
	return n, true
}

// writeFile writes a regular file of content with hdr's name and metadata.
func writeFile(tw *tar.Writer, hdr *tar.Header, content []byte) error {
	hdr.Typeflag, hdr.Size, hdr.Format = tar.TypeReg, int64(len(content)), tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := tw.Write(content)
	return err
}

// ensureLines appends to a colon-separated database (passwd, group) the
// lines whose first field none of its lines has.
func ensureLines(db []byte, lines []string) []byte {
	have := map[string]bool{}
	for l := range strings.SplitSeq(string(db), "\n") {
		name, _, _ := strings.Cut(l, ":")
		have[name] = true
	}
	out := slices.Clone(db)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	for _, l := range lines {
		name, _, _ := strings.Cut(l, ":")
		if !have[name] {
			out = append(out, l+"\n"...)
		}
	}
	return out
}
