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

// pull resolves ref in its registry and makes its root filesystem a layer
// (unless one of the same manifest digest exists already), returning the
// layer's key and the image's ENV.
func (s *Service) pull(ctx context.Context, ref string, auth *RegistryAuth, l *buildLog) (string, []string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", nil, fmt.Errorf("not an image reference: %w", err)
	}
	if slices.Contains(s.cfg.PlainHTTPRegistries, r.Context().RegistryStr()) {
		if r, err = name.ParseReference(ref, name.Insecure); err != nil {
			return "", nil, fmt.Errorf("not an image reference: %w", err)
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
		return "", nil, fmt.Errorf("%s registries are not supported by sandboxd; use a registry with a username and password", auth.Kind)
	}
	img, err := remote.Image(r, opts...)
	if err != nil {
		return "", nil, registryError(err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", nil, registryError(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", nil, registryError(err)
	}
	key := hashKey("image", d.String())
	have, err := s.cfg.Layered.HasLayer(ctx, key)
	if err != nil {
		return "", nil, err
	}
	if have {
		l.add("info", phaseBase, "CACHED "+ref+"@"+d.String())
	} else {
		l.add("info", phaseBase, "Pulling "+ref+"@"+d.String())
		if err := s.cfg.Layered.ImportImage(ctx, key, img); err != nil {
			return "", nil, registryError(err)
		}
	}
	return key, cf.Config.Env, nil
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
