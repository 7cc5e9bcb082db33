// Package testimage makes what the template tests pull: an OCI image of
// the host's static busybox (a shell and the tools a build's steps use, in
// a few hundred KiB), one of a Debian rootfs made from Debian packages (for
// the Python and Node toolchain checks), and a registry to serve them from
// on loopback, with or without basic auth. Both the Go end-to-end tests and the SDK suites'
// registry (compat-tests/registry) use it, so the two test the same image.
package testimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// BusyboxPath is the static busybox the image is made of (Debian's
// busybox-static; scripts/deps.sh installs it).
const BusyboxPath = "/bin/busybox"

// tools are the busybox applets the image links in /bin.
var tools = []string{"sh", "tar", "cp", "mkdir", "chown", "chmod", "rm", "mktemp", "dirname", "cat", "echo",
	"test", "sleep", "id", "touch", "ls", "gzip", "[", "env", "stat", "wc", "grep", "mv", "ln"}

// Busybox returns a one-layer image with BusyboxPath and its applets in
// /bin (bash being its ash), and ENV PATH=/bin and FROM_IMAGE=yes.
func Busybox() (v1.Image, error) {
	bin, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return nil, fmt.Errorf("the test image needs a static busybox: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"bin/", "etc/", "tmp/", "root/", "home/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: mode}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	// E2B's SDKs run commands with /bin/bash -l -c: busybox has no bash
	// applet, so bash is ash under that name.
	bash := []byte("#!/bin/sh\nexec /bin/busybox sh \"$@\"\n")
	if err := tw.WriteHeader(&tar.Header{Name: "bin/bash", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bash))}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bash); err != nil {
		return nil, err
	}
	for _, tool := range tools {
		if err := tw.WriteHeader(&tar.Header{Name: "bin/" + tool, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return nil, err
	}
	return oneLayer(layer, "PATH=/bin", "FROM_IMAGE=yes")
}

// Registry returns an in-memory OCI registry (go-containerregistry's),
// quiet, behind basic auth when user is not empty.
func Registry(user, pass string) http.Handler {
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if user == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// DebianCache is where scripts/incus-setup.sh keeps its Debian image (the
// base root filesystem of scripts/base-rootfs.sh: Python, Node and npm,
// git, sudo …), an Incus unified tarball: metadata.yaml and rootfs/.
const DebianCache = "/var/cache/sandboxd/incus"

// DebianTarball is the file Debian makes its image of: the newest
// sandboxd-base tarball in dir (fs.ErrNotExist when there is none).
func DebianTarball(dir string) (string, error) {
	matches, err := filepath.Glob(filepath.Join(dir, "sandboxd-base-v*.tar"))
	if err != nil {
		return "", err
	}
	// sandboxd-base-v<N>.tar, or since v5 sandboxd-base-v<N>-<the base
	// root filesystem's directory>.tar: the highest N, the newest file of
	// it.
	newest, best := "", -1
	var bestTime time.Time
	for _, m := range matches {
		num, _, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), "sandboxd-base-v"), ".tar"), "-")
		v, err := strconv.Atoi(num)
		if err != nil {
			continue
		}
		fi, err := os.Stat(m)
		if err != nil {
			continue
		}
		if v > best || v == best && fi.ModTime().After(bestTime) {
			newest, best, bestTime = m, v, fi.ModTime()
		}
	}
	if newest == "" {
		return "", fmt.Errorf("no Debian test image in %s (run scripts/incus-setup.sh): %w", dir, fs.ErrNotExist)
	}
	return newest, nil
}

// Debian returns the newest of DebianCache's images as a one-layer OCI
// image: a rootfs made from Debian packages, for the toolchain checks of
// template builds. It fails with fs.ErrNotExist when incus-setup.sh has
// not built one.
func Debian(dir string) (v1.Image, error) {
	newest, err := DebianTarball(dir)
	if err != nil {
		return nil, err
	}
	// The layer is the rootfs/ subtree, renamed to the root. Stored, not
	// compressed: its 0.8 GiB go through gzip once for the digest and
	// again for the push, which compression made most of the time it
	// took (the layer still is gzip, as the pull under test expects).
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		f, err := os.Open(newest)
		if err != nil {
			return nil, err
		}
		pr, pw := io.Pipe()
		go func() {
			defer f.Close()
			pw.CloseWithError(rootfsOnly(tar.NewReader(f), pw))
		}()
		return pr, nil
	}, tarball.WithCompressionLevel(gzip.NoCompression))
	if err != nil {
		return nil, err
	}
	return oneLayer(layer, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
}

// rootfsOnly copies the entries under rootfs/ of an Incus image tarball to
// w with that prefix taken off (hard links' targets too).
func rootfsOnly(tr *tar.Reader, w io.Writer) error {
	tw := tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tw.Close()
		}
		if err != nil {
			return err
		}
		name, ok := strings.CutPrefix(strings.TrimPrefix(hdr.Name, "./"), "rootfs/")
		if !ok || name == "" {
			continue
		}
		hdr.Name = name
		if hdr.Typeflag == tar.TypeLink {
			hdr.Linkname = strings.TrimPrefix(strings.TrimPrefix(hdr.Linkname, "./"), "rootfs/")
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// oneLayer is an image of layer alone, for this machine's architecture,
// with ENV env.
func oneLayer(layer v1.Layer, env ...string) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	cf.Config.Env = env
	return mutate.ConfigFile(img, cf)
}
