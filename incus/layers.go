package incus

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	goruntime "runtime"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/runtime"
)

// Layers (runtime.Layered) on Incus: a layer is a whole-root Incus image.
//
// Incus has no notion of a diff an instance can be started from: an
// instance's root is a copy-on-write clone of one image. So a layer holds
// the complete root of the stack it was made on: Commit publishes a
// snapshot of the build sandbox's root (Incus unshifts the idmapped files,
// so owners are kept), ImportImage uploads the image's flattened root. A
// template is then just the top layer's image. Layers of a build share
// nothing on the pool but what btrfs shares between an image volume and
// the instances cloned from it; in exchange a sandbox of a built template
// starts exactly like one of the base template (one clone), whatever the
// depth of the stack.
//
// Each layer image records the stack it holds (propStack: the base template
// or "" for an imported image, then the layer keys, bottom first), and
// DefineTemplate refuses a stack that differs from the top layer's: the
// image holds that root and no other. The template builder's keys name the
// whole chain below them, so its stacks always match.
//
// Layers are images with an alias (layerAlias), so they survive restarts
// of sandboxd and of incusd; template definitions live in memory
// (Backend.defined), as the interface allows.

var _ runtime.Layered = (*Backend)(nil)

// Image properties of a layer image.
const (
	propLayer     = "sandboxd.layer"
	propStack     = "sandboxd.stack"
	propNamespace = "sandboxd.namespace"
	propNonce     = "sandboxd.nonce"
	propOwner     = "sandboxd.owner"
)

// commitPrefix starts the name of the instance snapshots Commit publishes.
const commitPrefix = "sandboxd-commit-"

// keyStack on an instance is the stack its root was made from (see
// propStack), so that Commit of an adopted sandbox knows what it holds.
const keyStack = "user.sandboxd.stack"

// definedTemplate is a template of DefineTemplate: an image and the stack
// it holds.
type definedTemplate struct {
	image *imageInfo
	stack []string
}

// layerAlias is the Incus image alias of layer key: "sandboxd-layer-<key>",
// with a tag of the namespace before the key when there is one (aliases are
// global to the Incus project, and test runs must not see each other's).
func (b *Backend) layerAlias(key string) string {
	if b.opts.Namespace == "" {
		return "sandboxd-layer-" + key
	}
	h := sha256.Sum256([]byte(b.opts.Namespace))
	return "sandboxd-layer-" + hex.EncodeToString(h[:6]) + "-" + key
}

// layerImage returns layer key's image, or an error that errors.Is
// runtime.ErrNotFound.
func (b *Backend) layerImage(ctx context.Context, key string) (*Image, error) {
	fp, err := b.c.ImageAlias(ctx, b.layerAlias(key))
	if err != nil {
		return nil, err
	}
	return b.c.Image(ctx, fp)
}

// HasLayer reports whether layer key's image exists.
func (b *Backend) HasLayer(ctx context.Context, key string) (bool, error) {
	if err := runtime.CheckLayerKey(key); err != nil {
		return false, err
	}
	_, err := b.c.ImageAlias(ctx, b.layerAlias(key))
	if errors.Is(err, runtime.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("layer %s: %w", key, err)
	}
	return true, nil
}

// layerProperties are the properties of the image of layer key holding
// stack (which ends with key).
func (b *Backend) layerProperties(key string, stack []string) map[string]string {
	p := map[string]string{
		"description": "sandboxd layer " + key,
		propLayer:     key,
		propStack:     strings.Join(stack, ","),
		// Incus refuses a second image of the same fingerprint: two
		// concurrent makings of one key (same content, same second) must
		// each get their own image, of which nameLayer keeps one.
		propNonce: rand.Text(),
		propOwner: b.owner,
	}
	if b.opts.Namespace != "" {
		p[propNamespace] = b.opts.Namespace
	}
	return p
}

// nameLayer gives the new image fp the alias of layer key. When the alias
// exists already (a concurrent Commit or import of the same key), the
// layer is there: fp is deleted and that is success. On any other failure
// fp is deleted too, so no unnamed image is left behind.
func (b *Backend) nameLayer(ctx context.Context, key, fp string) error {
	err := b.c.CreateImageAlias(ctx, b.layerAlias(key), fp, "sandboxd layer")
	if err == nil {
		return nil
	}
	if target, aerr := b.c.ImageAlias(context.WithoutCancel(ctx), b.layerAlias(key)); aerr == nil && target == fp {
		return nil // named after all (the answer was lost)
	}
	if derr := b.c.DeleteImage(context.WithoutCancel(ctx), fp); derr != nil {
		b.log.Warn("incus: delete an unnamed layer image", "layer", key, "image", fp, "err", derr)
	}
	if errors.Is(err, runtime.ErrAlreadyExists) {
		return nil
	}
	return err
}

// Commit makes layer key an image of sandbox id's whole root as it is now:
// a snapshot of its volume (the sandbox keeps running), published
// uncompressed, then the snapshot is deleted. Incus unshifts the
// container's files while it packs them, so owners inside are kept.
func (b *Backend) Commit(ctx context.Context, id, key string) error {
	if err := runtime.CheckLayerKey(key); err != nil {
		return fmt.Errorf("commit sandbox %s: %w", id, err)
	}
	if have, err := b.HasLayer(ctx, key); err != nil || have {
		return err
	}
	s, err := b.lockLive(ctx, id, "commit")
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	// A Commit of the same key may have finished while we waited.
	if have, err := b.HasLayer(ctx, key); err != nil || have {
		return err
	}
	snap := commitPrefix + b.owner + "-" + strings.ToLower(rand.Text()[:12])
	if err := b.c.CreateSnapshot(ctx, s.name, snap); err != nil {
		return fmt.Errorf("commit sandbox %s: snapshot: %w", id, err)
	}
	defer func() {
		// The snapshot pins the blocks it shares with the running root;
		// an ephemeral instance's snapshots would go with it anyway.
		if err := b.c.DeleteSnapshot(context.WithoutCancel(ctx), s.name, snap); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			b.log.Warn("incus: delete a commit's snapshot", "sandbox", id, "snapshot", snap, "err", err)
		}
	}()
	stack := append(slices.Clone(s.stack), key)
	fp, err := b.c.CreateImage(ctx, ImagesPost{
		Source:               ImageSource{Type: "snapshot", Name: s.name + "/" + snap},
		CompressionAlgorithm: "none",
		Properties:           b.layerProperties(key, stack),
	})
	if err != nil {
		return fmt.Errorf("commit sandbox %s: publish: %w", id, err)
	}
	if err := b.nameLayer(ctx, key, fp); err != nil {
		return fmt.Errorf("commit sandbox %s: name layer %s: %w", id, key, err)
	}
	return nil
}

// ImportImage makes layer key from img's flattened root, with E2B's users
// added where missing (see repack), uploaded as a unified image tarball.
func (b *Backend) ImportImage(ctx context.Context, key string, img v1.Image) error {
	if err := runtime.CheckLayerKey(key); err != nil {
		return fmt.Errorf("import image: %w", err)
	}
	if img == nil {
		return fmt.Errorf("import image as layer %s: %w: no image", key, runtime.ErrInvalidSpec)
	}
	if have, err := b.HasLayer(ctx, key); err != nil || have {
		return err
	}
	meta := imageMetadata(b.layerProperties(key, []string{"", key}))
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(repack(img, meta, pw)) }()
	fp, err := b.c.UploadImage(ctx, pr)
	// Ends repack if the upload stopped early (its next write fails).
	pr.CloseWithError(errors.New("upload ended"))
	if err != nil {
		return fmt.Errorf("import image as layer %s: %w", key, err)
	}
	if err := b.nameLayer(ctx, key, fp); err != nil {
		return fmt.Errorf("import image as layer %s: %w", key, err)
	}
	return nil
}

// incusArch is Incus's name of the host's architecture (images are pulled
// for it).
func incusArch() string {
	switch goruntime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	case "386":
		return "i686"
	}
	return goruntime.GOARCH
}

// RemoveLayer deletes layer key's image, unless a live sandbox of this
// backend runs on it (ErrInUse). Destroyed sandboxes whose instances are
// still being deleted do not count: RemoveLayer waits for those deletions
// first, so that Incus does not see the image in use.
func (b *Backend) RemoveLayer(ctx context.Context, key string) error {
	if err := runtime.CheckLayerKey(key); err != nil {
		return fmt.Errorf("remove layer: %w", err)
	}
	fp, err := b.c.ImageAlias(ctx, b.layerAlias(key))
	if errors.Is(err, runtime.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove layer %s: %w", key, err)
	}
	all, err := b.c.Instances(ctx, keyID)
	if err != nil {
		return fmt.Errorf("remove layer %s: %w", key, err)
	}
	var waits []chan struct{}
	b.mu.Lock()
	for _, s := range b.sbx {
		if s.fingerprint == fp {
			b.mu.Unlock()
			return fmt.Errorf("remove layer %s: %w: sandbox %s", key, runtime.ErrInUse, s.id)
		}
	}
	for _, in := range all {
		if in.Config["volatile.base_image"] != fp || !b.ours(in) {
			continue
		}
		id := in.Config[keyID]
		if ch := b.deleting[id]; ch != nil {
			waits = append(waits, ch)
			continue
		}
		b.mu.Unlock()
		// Not in memory and not being deleted: a live sandbox not
		// adopted yet (the next List adopts it).
		return fmt.Errorf("remove layer %s: %w: sandbox %s", key, runtime.ErrInUse, id)
	}
	b.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return fmt.Errorf("remove layer %s: waiting for a destroyed sandbox's deletion: %w", key, ctx.Err())
		}
	}
	if err := b.c.DeleteImage(ctx, fp); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return fmt.Errorf("remove layer %s: %w", key, err)
	}
	return nil
}

// DefineTemplate makes name the image of layers' top layer, which holds
// the whole root of base plus layers (or base's own image when layers is
// empty). base is a template of Options.Images, one of DefineTemplate, or
// "" when the bottom layer is an imported image.
func (b *Backend) DefineTemplate(ctx context.Context, name, base string, layers []string) error {
	wrap := func(err error) error { return fmt.Errorf("define template %q: %w", name, err) }
	if !runtime.ValidID(name) {
		return wrap(fmt.Errorf("%w: bad template name", runtime.ErrInvalidSpec))
	}
	if _, own := b.opts.Images[name]; own {
		return wrap(fmt.Errorf("%w: a template of the backend", runtime.ErrInvalidSpec))
	}
	if base == "" && len(layers) == 0 {
		return wrap(fmt.Errorf("%w: no base and no layer", runtime.ErrInvalidSpec))
	}
	for i, key := range layers {
		if err := runtime.CheckLayerKey(key); err != nil {
			return wrap(err)
		}
		if slices.Contains(layers[i+1:], key) {
			return wrap(fmt.Errorf("%w: layer %s twice", runtime.ErrInvalidSpec, key))
		}
	}
	var below []string // the stack under layers
	var im *imageInfo
	switch {
	case base == "":
		below = []string{""}
	default:
		if _, own := b.opts.Images[base]; own {
			below = []string{base}
			if len(layers) == 0 {
				var err error
				if im, _, err = b.templateImage(ctx, base); err != nil {
					return wrap(err)
				}
			}
			break
		}
		b.mu.Lock()
		d := b.defined[base]
		b.mu.Unlock()
		if d == nil {
			return wrap(fmt.Errorf("%w: base %q", runtime.ErrTemplateNotFound, base))
		}
		below, im = d.stack, d.image
	}
	stack := append(slices.Clone(below), layers...)
	if len(layers) > 0 {
		// Every layer must exist (the contract), though only the top one's
		// image is used.
		var top *Image
		for _, key := range layers {
			img, err := b.layerImage(ctx, key)
			if errors.Is(err, runtime.ErrNotFound) {
				return wrap(fmt.Errorf("%w: layer %s", runtime.ErrTemplateNotFound, key))
			}
			if err != nil {
				return wrap(fmt.Errorf("layer %s: %w", key, err))
			}
			top = img
		}
		if got := top.Properties[propStack]; got != strings.Join(stack, ",") {
			return wrap(fmt.Errorf("%w: layer %s holds the whole root of the stack it was made on (%q), not of %q: on Incus a layer is an image of a complete root",
				runtime.ErrInvalidSpec, layers[len(layers)-1], got, strings.Join(stack, ",")))
		}
		im = &imageInfo{fingerprint: top.Fingerprint, size: top.Size}
	}
	b.mu.Lock()
	b.defined[name] = &definedTemplate{image: im, stack: stack}
	b.mu.Unlock()
	return nil
}

// UndefineTemplate forgets name.
func (b *Backend) UndefineTemplate(_ context.Context, name string) error {
	if _, own := b.opts.Images[name]; own {
		return fmt.Errorf("undefine template %q: %w: a template of the backend", name, runtime.ErrInvalidSpec)
	}
	b.mu.Lock()
	delete(b.defined, name)
	b.mu.Unlock()
	return nil
}

// templateImage resolves template name (of Options.Images or of
// DefineTemplate) to its image and the stack the image holds; an unknown
// name or a missing image is ErrTemplateNotFound.
func (b *Backend) templateImage(ctx context.Context, name string) (*imageInfo, []string, error) {
	if ref, ok := b.opts.Images[name]; ok {
		im, err := b.image(ctx, ref)
		if errors.Is(err, runtime.ErrNotFound) {
			return nil, nil, fmt.Errorf("%w: image %q of template %q", runtime.ErrTemplateNotFound, ref, name)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("image: %w", err)
		}
		return im, []string{name}, nil
	}
	b.mu.Lock()
	d := b.defined[name]
	b.mu.Unlock()
	if d == nil {
		return nil, nil, fmt.Errorf("%w: %q", runtime.ErrTemplateNotFound, name)
	}
	return d.image, d.stack, nil
}

// definedNames are the names of DefineTemplate's templates.
func (b *Backend) definedNames() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Collect(maps.Keys(b.defined))
}

// collectUnnamedLayers deletes the layer images of this namespace that have
// no alias and another owner: a crash between publishing (or uploading) a
// layer and naming it leaves one, and nothing else would ever find it.
// This process's own may be between the two steps of a Commit or
// ImportImage under way, and are left alone. Run by Reconcile.
func (b *Backend) collectUnnamedLayers(ctx context.Context) error {
	all, err := b.c.Images(ctx)
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	var errs []error
	for _, im := range all {
		if _, layer := im.Properties[propLayer]; !layer || len(im.Aliases) > 0 ||
			im.Properties[propNamespace] != b.opts.Namespace || im.Properties[propOwner] == b.owner {
			continue
		}
		if err := b.c.DeleteImage(ctx, im.Fingerprint); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete unnamed layer image %s: %w", im.Fingerprint, err))
		}
	}
	return errors.Join(errs...)
}

// BaseDigest is the fingerprint of base's image: a new image under the same
// alias is another base.
func (b *Backend) BaseDigest(ctx context.Context, base string) (string, error) {
	im, _, err := b.templateImage(ctx, base)
	if err != nil {
		return "", fmt.Errorf("base digest: %w", err)
	}
	return im.fingerprint, nil
}
