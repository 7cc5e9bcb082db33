// Command registry serves the SDK suites' test image on loopback: two
// in-memory OCI registries, one open and one behind basic auth, each
// holding sandboxd-test/busybox:1 (internal/testimage). compat-tests/run.sh
// starts it for the sandboxd and incus modes and passes the addresses to
// sandboxd (--plain-http-registries) and to the suites (COMPAT_REGISTRY,
// COMPAT_PRIVATE_REGISTRY). It prints "ready" once both hold the image and
// serves until killed.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sandboxd/sandboxd/internal/testimage"
)

// Repo is the test image's repository and tag in both registries.
const Repo = "sandboxd-test/busybox:1"

func main() {
	open := flag.String("open", "127.0.0.1:0", "address of the registry without auth")
	private := flag.String("private", "127.0.0.1:0", "address of the registry with basic auth")
	user := flag.String("user", "compat", "user of the private registry")
	pass := flag.String("pass", "compat-secret", "password of the private registry")
	flag.Parse()
	img, err := testimage.Busybox()
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range []struct {
		addr, user, pass string
	}{{*open, "", ""}, {*private, *user, *pass}} {
		ln, err := net.Listen("tcp", r.addr)
		if err != nil {
			log.Fatal(err)
		}
		go func() { log.Fatal(http.Serve(ln, testimage.Registry(r.user, r.pass))) }()
		ref, err := name.ParseReference(ln.Addr().String()+"/"+Repo, name.Insecure)
		if err != nil {
			log.Fatal(err)
		}
		auth := authn.Anonymous
		if r.user != "" {
			auth = &authn.Basic{Username: r.user, Password: r.pass}
		}
		if err := remote.Write(ref, img, remote.WithAuth(auth)); err != nil {
			log.Fatalf("push %s: %v", ref, err)
		}
		fmt.Fprintln(os.Stdout, "registry", ln.Addr().String())
	}
	fmt.Fprintln(os.Stdout, "ready")
	select {}
}
