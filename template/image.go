package template

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	goruntime "runtime"
	"slices"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// remoteImage is an image resolved in its registry: its layer's key (of
// its manifest digest), the image and its ENV.
type remoteImage struct {
	key, digest string
	img         v1.Image
	env         []string
}

// resolveImage resolves ref in its registry; its root filesystem is not
// fetched yet (Layered.ImportImage does that).
func (s *Service) resolveImage(ctx context.Context, ref string, auth *RegistryAuth) (remoteImage, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return remoteImage{}, fmt.Errorf("not an image reference: %w", err)
	}
	if slices.Contains(s.cfg.PlainHTTPRegistries, r.Context().RegistryStr()) {
		if r, err = name.ParseReference(ref, name.Insecure); err != nil {
			return remoteImage{}, fmt.Errorf("not an image reference: %w", err)
		}
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}),
	}
	switch {
	case auth == nil:
		opts = append(opts, remote.WithAuth(authn.Anonymous))
	case auth.Kind == "registry" || auth.Kind == "":
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: auth.Username, Password: auth.Password}))
	default:
		return remoteImage{}, fmt.Errorf("%s registries are not supported by sandboxd; use a registry with a username and password", auth.Kind)
	}
	img, err := remote.Image(r, opts...)
	if err != nil {
		return remoteImage{}, registryError(err)
	}
	d, err := img.Digest()
	if err != nil {
		return remoteImage{}, registryError(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return remoteImage{}, registryError(err)
	}
	return remoteImage{key: hashKey("image", d.String()), digest: d.String(), img: img, env: cf.Config.Env}, nil
}

// registryError says what a registry's refusal means.
func registryError(err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("the registry refused access (check the credentials): %w", err)
		case http.StatusNotFound:
			return fmt.Errorf("no such image in the registry: %w", err)
		}
	}
	return err
}
