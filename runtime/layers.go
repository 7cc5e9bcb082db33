package runtime

import (
	"context"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Layered is a backend that can hold templates built by the control plane
// (package template): a template is a stack of layers on a base, where a
// layer is an image's root filesystem or what one build step changed. Layers
// are content-addressed by the caller: a key names the same content for the
// life of the backend's state, so two templates that share a prefix of
// steps share its layers on disk, and a build whose prefix is unchanged
// finds its layers already there.
//
// Layers and definitions are the caller's to keep track of: after a restart
// of sandboxd, layers are still there (HasLayer) but templates must be
// defined again. A sandbox keeps what it was created from, whatever happens
// to its template or layers afterwards.
type Layered interface {
	// ImportImage makes layer key from img's root filesystem, flattened
	// (whiteouts applied), with E2B's conventions added where the image
	// lacks them: a user "user" (uid 1000) with home /home/user. A key
	// that exists already is left as it is (nil).
	ImportImage(ctx context.Context, key string, img v1.Image) error
	// Commit makes layer key from what sandbox id changed in its root
	// filesystem since it was created (its writable layer, deletions
	// included). The sandbox keeps running. A key that exists already is
	// left as it is (nil).
	Commit(ctx context.Context, id, key string) error
	// HasLayer reports whether layer key exists.
	HasLayer(ctx context.Context, key string) (bool, error)
	// RemoveLayer deletes layer key. A layer a live sandbox uses is kept
	// (ErrInUse); a missing one is not an error.
	RemoveLayer(ctx context.Context, key string) error
	// DefineTemplate makes name a template whose root filesystem is
	// layers (bottom first) on top of base's: a template of the backend
	// (such as "base"), or "" when the bottom layer is an image's whole
	// root. Redefining a name replaces it for sandboxes created afterwards.
	// It fails with ErrTemplateNotFound for an unknown base or layer, and
	// ErrInvalidSpec for a name that is not a ValidID or is one of the
	// backend's own templates.
	DefineTemplate(ctx context.Context, name, base string, layers []string) error
	// BaseDigest names the content of template base (one of the backend's
	// own, or defined): it changes whenever that content may have changed
	// (another image, a changed host directory), so that layers built on the
	// old content are never taken for the new one's. ErrTemplateNotFound
	// for an unknown base.
	BaseDigest(ctx context.Context, base string) (string, error)
	// UndefineTemplate forgets name; sandboxes already created from it are
	// not affected. Forgetting an undefined name is not an error.
	UndefineTemplate(ctx context.Context, name string) error
}

// MaxLayerKey is the longest layer key.
const MaxLayerKey = 128

// CheckLayerKey refuses (ErrInvalidSpec) a key that is not 1 to
// MaxLayerKey ASCII letters, digits, '_', '.' and '-', starting with a
// letter or digit: keys name directories and Incus aliases, and go into
// overlay options, where ':' and ',' separate. (No regexp: sandbox starts
// re-execute the binary, and a package-level one would be compiled at
// every start.)
func CheckLayerKey(key string) error {
	ok := key != "" && len(key) <= MaxLayerKey
	for i := 0; ok && i < len(key); i++ {
		c := key[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		ok = alnum || i > 0 && (c == '_' || c == '.' || c == '-')
	}
	if !ok {
		return fmt.Errorf("%w: bad layer key %q", ErrInvalidSpec, key)
	}
	return nil
}
