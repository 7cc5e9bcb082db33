// Package testimage makes what the template tests pull: an OCI image of
// the host's static busybox (a shell and the tools a build's steps use, in
// a few hundred KiB) and a registry to serve it from on loopback, with or
// without basic auth. Both the Go end-to-end tests and the SDK suites'
// registry (compat-tests/registry) use it, so the two test the same image.
package testimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	goruntime "runtime"

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
	cf.Config.Env = []string{"PATH=/bin", "FROM_IMAGE=yes"}
	return mutate.ConfigFile(img, cf)
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
