// Command registry serves the SDK suites' test image on loopback: two
// in-memory OCI registries, one open and one behind basic auth, each
// holding sandboxd-test/busybox:1 (internal/testimage). compat-tests/run.sh
// starts it for the sandboxd and incus modes and passes the addresses to
// sandboxd (--plain-http-registries) and to the suites (COMPAT_REGISTRY,
// COMPAT_PRIVATE_REGISTRY). It prints "registry ADDR" for each, then
// "ready" once they hold their images, and serves until killed.
//
// --debian adds sandboxd-test/debian:bookworm (testimage.Debian, 0.8 GiB)
// to the open one, for cmd/sandboxd's TestTemplateFromDebianImageE2E: made
// and pushed in a process of its own because in the -race test binary the
// same took two minutes.
package main

import (
	"flag"
	"fmt"
	"log"
	"maps"
	"net"
	"net/http"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sandboxd/sandboxd/internal/testimage"
)

// Repo is the test image's repository and tag in both registries;
// DebianRepo the Debian image's, with --debian, in the open one.
const (
	Repo       = "sandboxd-test/busybox:1"
	DebianRepo = "sandboxd-test/debian:bookworm"
)

func main() {
	open := flag.String("open", "127.0.0.1:0", "address of the registry without auth")
	private := flag.String("private", "127.0.0.1:0", "address of the registry with basic auth; \"\": none")
	user := flag.String("user", "compat", "user of the private registry")
	pass := flag.String("pass", "compat-secret", "password of the private registry")
	debian := flag.Bool("debian", false, "also push "+DebianRepo+" to the open registry (from "+testimage.DebianCache+", scripts/incus-setup.sh)")
	flag.Parse()
	img, err := testimage.Busybox()
	if err != nil {
		log.Fatal(err)
	}
	type registry struct {
		addr, user, pass string
		extra            map[string]v1.Image
	}
	regs := []registry{{addr: *open}}
	if *debian {
		deb, err := testimage.Debian(testimage.DebianCache)
		if err != nil {
			log.Fatal(err)
		}
		regs[0].extra = map[string]v1.Image{DebianRepo: deb}
	}
	if *private != "" {
		regs = append(regs, registry{addr: *private, user: *user, pass: *pass})
	}
	for _, r := range regs {
		ln, err := net.Listen("tcp", r.addr)
		if err != nil {
			log.Fatal(err)
		}
		go func() { log.Fatal(http.Serve(ln, testimage.Registry(r.user, r.pass))) }()
		var auth authn.Authenticator = authn.Anonymous
		if r.user != "" {
			auth = &authn.Basic{Username: r.user, Password: r.pass}
		}
		images := map[string]v1.Image{Repo: img}
		maps.Copy(images, r.extra)
		for repo, img := range images {
			ref, err := name.ParseReference(ln.Addr().String()+"/"+repo, name.Insecure)
			if err != nil {
				log.Fatal(err)
			}
			if err := remote.Write(ref, img, remote.WithAuth(auth)); err != nil {
				log.Fatalf("push %s: %v", ref, err)
			}
		}
		fmt.Fprintln(os.Stdout, "registry", ln.Addr().String())
	}
	fmt.Fprintln(os.Stdout, "ready")
	select {}
}
