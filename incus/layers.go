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
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/runtime"
)

// Layers (runtime.Layered) on Incus: a layer is a stopped instance that
// holds a whole root.
//
// Incus has no notion of a diff an instance can be started from: an
// instance's root is a copy-on-write clone of one image or instance. So a
// layer holds the complete root of the stack it was made on: Commit copies
// a snapshot of the build sandbox's root into a new stopped instance (on
// btrfs a subvolume snapshot: ~0.1 s whatever the size), ImportImage
// uploads the image's flattened root as an Incus image, creates the layer
// instance from it (incusd unpacks it once, inside the import) and deletes
// the image. A template is then just the top layer's instance, and a
// sandbox of it starts as one of a base image does: one clone, whatever the
// depth of the stack, with no unpack on its first create.
//
// Layers were Incus images before: publishing packed the root into a
// tarball (41.5 s for a 1.26 GiB root on this machine, quiet) that the
// first create unpacked again (10.7 s); the instance copy takes 0.03 s.
//
// Each layer instance records the stack it holds (keyStack: the base
// template or "" for an imported image, then the layer keys, bottom first),
// and DefineTemplate refuses a stack that differs from the top layer's: the
// instance holds that root and no other. The template builder's keys name
// the whole chain below them, so its stacks always match.
//
// A layer is made under a temporary name (layerTempPrefix, with the
// owner's mark) and renamed to its own (layerName) when complete, so a
// layer instance by its name is always whole; Reconcile deletes the
// temporary instances a dead process left. Layers survive restarts of
// sandboxd and of incusd; template definitions live in memory
// (Backend.defined), as the interface allows.

var _ runtime.Layered = (*Backend)(nil)

// Config keys of a layer instance; keyStack and keyNamespace too.
const (
	keyLayer     = "user.sandboxd.layer"
	keyOwner     = "user.sandboxd.owner"
	keyLayerSize = "user.sandboxd.layer-size" // bytes its root references
)

// Image properties of the image an ImportImage uploads (for Reconcile to
// find one a crash left), and of the layer images of older versions
// (propStack: the stack such an image holds; see migrateLayerImages).
const (
	propLayer     = "sandboxd.layer"
	propNamespace = "sandboxd.namespace"
	propNonce     = "sandboxd.nonce"
	propOwner     = "sandboxd.owner"
	propStack     = "sandboxd.stack"
)

// Instance name prefixes: of layers, and of layers being made.
const (
	layerPrefix     = "sbl-"
	layerTempPrefix = "sbt-"
)

// commitPrefix starts the name of the instance snapshots Commit copies.
const commitPrefix = "sandboxd-commit-"

// keyStack on an instance is the stack its root was made from: on a layer
// what it holds, on a sandbox what its root holds, so that Commit of an
// adopted sandbox knows.
const keyStack = "user.sandboxd.stack"

// definedTemplate is a template of DefineTemplate: the source of its roots
// and the stack it holds.
type definedTemplate struct {
	source *rootSource
	stack  []string
}

// layerName is the instance name of layer key: "sbl-" and 40 hex of a hash
// of the namespace and the key (keys may hold characters and lengths an
// instance name may not; instance names are global to the Incus project,
// and test runs must not see each other's).
func (b *Backend) layerName(key string) string {
	h := sha256.Sum256([]byte(b.opts.Namespace + "\x00" + key))
	return layerPrefix + hex.EncodeToString(h[:20])
}

// layerInstance returns layer key's instance, or an error that errors.Is
// runtime.ErrNotFound.
func (b *Backend) layerInstance(ctx context.Context, key string) (*Instance, error) {
	in, err := b.c.Instance(ctx, b.layerName(key))
	if err != nil {
		return nil, err
	}
	if in.Config[keyLayer] != key || in.Config[keyNamespace] != b.opts.Namespace {
		return nil, fmt.Errorf("instance %s: %w: not layer %s", in.Name, runtime.ErrNotFound, key)
	}
	return in, nil
}

// HasLayer reports whether layer key's instance exists.
func (b *Backend) HasLayer(ctx context.Context, key string) (bool, error) {
	if err := runtime.CheckLayerKey(key); err != nil {
		return false, err
	}
	_, err := b.layerInstance(ctx, key)
	if errors.Is(err, runtime.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("layer %s: %w", key, err)
	}
	return true, nil
}

// isLayer says whether in is a layer instance of this namespace, made
// (layerPrefix) or being made (layerTempPrefix).
func (b *Backend) isLayer(in *Instance) bool {
	return (strings.HasPrefix(in.Name, layerPrefix) || strings.HasPrefix(in.Name, layerTempPrefix)) &&
		in.Config[keyLayer] != "" && in.Config[keyNamespace] == b.opts.Namespace
}

// makeLayer makes layer key, holding stack, from src (a snapshot to copy or
// an image), a stopped instance named layerName(key) (makeStopped), its
// size measured unless quotas are simple. When that name is taken (a
// concurrent making of the same key), the layer is there. target is the
// cluster member to make it on ("": any; a copy must be on its source's
// member).
func (b *Backend) makeLayer(ctx context.Context, key string, stack []string, src InstanceSource, target string) error {
	cfg := map[string]string{keyLayer: key, keyStack: strings.Join(stack, ","), keyOwner: b.owner}
	err := b.makeStopped(ctx, src, "", target, cfg, b.layerName(key), !b.quota.simple, "sandboxd layer "+key,
		func() bool { return b.awaitLayer(ctx, key) })
	b.forgetLayerMember(b.layerName(key))
	return err
}

// makeStopped makes stopped instance final on member target ("": any)
// from src, with config cfg (plus the namespace, and what Incus keeps in
// volatile.* and image.*: a copy's other config, a sandbox's env and
// token, goes) and the pool's root device, of architecture arch when
// set (a copy from another member needs it): first under a temporary name
// (layerTempPrefix, with the owner's mark, which Reconcile deletes when a
// dead process left it), renamed to final once complete, so an instance
// by its final name is always whole. measure records the root's size
// (keyLayerSize). When final is taken (a concurrent making of the same),
// taken says whether that one will do; then the temporary instance goes.
// On any failure it goes too.
func (b *Backend) makeStopped(ctx context.Context, src InstanceSource, arch, target string, cfg map[string]string, final string, measure bool, description string, taken func() bool) (err error) {
	tmp := layerTempPrefix + b.owner + "-" + strings.ToLower(rand.Text()[:12])
	if b.opts.Namespace != "" {
		cfg[keyNamespace] = b.opts.Namespace
	}
	devices := map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": b.opts.Pool}}
	opID, err := b.postInstance(ctx, InstancesPost{
		Name: tmp, Type: "container", Architecture: arch, Source: src, Config: cfg, Devices: devices, Profiles: []string{}, Target: target,
	})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	dropTemp := func() {
		// Bounded, tightly when given up (at a stop Close waits for
		// this). What is left goes at the next start (another owner's
		// half-made instance).
		wait := time.Minute
		if ctx.Err() != nil {
			wait = abandonWait
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
		defer cancel()
		if derr := b.c.DeleteInstance(dctx, tmp); derr != nil && !errors.Is(derr, runtime.ErrNotFound) {
			b.log.Warn("incus: delete an instance left half made", "instance", tmp, "for", final, "err", derr)
		}
	}
	defer func() {
		if err != nil {
			dropTemp()
		}
	}()
	if _, err := b.c.Wait(ctx, opID); err != nil {
		if ctx.Err() != nil {
			b.abandonOperation(opID, "make "+final)
		}
		return fmt.Errorf("create: %w", err)
	}
	in, err := b.c.Instance(ctx, tmp)
	if err != nil {
		return err
	}
	if measure {
		cfg[keyLayerSize] = strconv.FormatInt(b.layerSize(tmp), 10)
	}
	for k, v := range in.Config {
		if strings.HasPrefix(k, "volatile.") || strings.HasPrefix(k, "image.") {
			cfg[k] = v
		}
	}
	if err := b.c.PutInstance(ctx, tmp, InstancePut{Config: cfg, Devices: devices, Profiles: []string{}, Description: description}); err != nil {
		return fmt.Errorf("set config: %w", err)
	}
	err = b.c.RenameInstance(ctx, tmp, final)
	if errors.Is(err, runtime.ErrAlreadyExists) && taken() {
		dropTemp()
		return nil
	}
	if err != nil {
		return fmt.Errorf("name: %w", err)
	}
	return nil
}

// postInstance posts the create of an instance and returns its operation.
// The POST itself is not cancelled half-way, whatever ctx does: Incus may
// have made the instance already, and the caller, not knowing, could not
// delete it (a stop cancelled a replica's copy this way and left its
// half-made instance). It returns as soon as the operation is queued; the
// caller's wait for it is what ctx cancels.
func (b *Backend) postInstance(ctx context.Context, req InstancesPost) (string, error) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return b.c.CreateInstance(pctx, req)
}

// abandonWait bounds each step of giving up an operation at a stop: a
// stopping sandboxd waits for it (Close), and a service manager's stop
// timeout does not.
const abandonWait = 5 * time.Second

// uncancellableWait bounds the wait, at a stop, for an operation Incus
// refuses to cancel: a copy between cluster members (a migration: "This
// operation can't be cancelled"), 30-100 s for a template's root on the
// test cluster, whose half-made instance cannot be deleted until it ends
// ("Instance is busy running a create operation"). Waiting lets the stop
// delete it rather than leave it to the next start; the systemd unit's
// TimeoutStopSec allows for it.
const uncancellableWait = 2 * time.Minute

// abandonOperation cancels operation id, whose waiter gave up (the
// backend is closing: a replica's copy takes a minute), and waits for it
// to end (abandonWait; uncancellableWait where Incus refuses to cancel
// it), so that what it made can be deleted.
func (b *Backend) abandonOperation(id, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), abandonWait)
	defer cancel()
	wait := abandonWait
	if err := b.c.CancelOperation(ctx, id); err != nil {
		b.log.Info("incus: an operation given up cannot be cancelled; waiting for its end", "operation", id, "for", what,
			"up_to", uncancellableWait.String(), "err", err)
		wait = uncancellableWait
	}
	wctx, wcancel := context.WithTimeout(context.Background(), wait)
	defer wcancel()
	if _, err := b.c.Wait(wctx, id); wctx.Err() != nil {
		b.log.Warn("incus: an operation given up did not end in time", "operation", id, "for", what, "waited", wait.String(), "err", err)
	}
}

// layerRenameWait bounds awaitLayer: a concurrent rename takes Incus
// well under a second.
const layerRenameWait = 30 * time.Second

// awaitLayer reports whether layer key's instance exists, waiting for it
// for up to layerRenameWait: a rename that lost to a concurrent one sees
// the name taken (its storage volume is renamed first) before the winner's
// instance answers by that name.
func (b *Backend) awaitLayer(ctx context.Context, key string) bool {
	deadline := time.Now().Add(layerRenameWait)
	for {
		_, err := b.layerInstance(ctx, key)
		if err == nil {
			return true
		}
		if !errors.Is(err, runtime.ErrNotFound) || time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// layerSize is what the root of new layer instance tmp references on the
// pool, which full quota groups count against every clone's size: btrfs'
// count, read where the pool is on this host. Elsewhere (a remote Incus
// with full quota groups) it is 0, and a clone's root then has its own
// disk size minus what the layer holds: logged.
func (b *Backend) layerSize(tmp string) int64 {
	n, err := referencedBytes(filepath.Join(b.opts.IncusDir, "storage-pools", b.opts.Pool, "containers", tmp))
	if err != nil {
		b.log.Warn("incus: a layer's size is not readable here (btrfs quota groups of a remote pool?); its clones get no allowance for it",
			"instance", tmp, "err", err)
		return 0
	}
	return n
}

// Commit makes layer key a copy of sandbox id's whole root as it is now:
// a snapshot of its volume (the sandbox keeps running) copied into the
// layer's instance, then the snapshot is deleted. The copy keeps owners
// inside as they are.
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
	if err := b.makeLayer(ctx, key, stack, InstanceSource{Type: "copy", Source: s.name + "/" + snap}, targetOf(s.member)); err != nil {
		return fmt.Errorf("commit sandbox %s: layer %s: %w", id, key, err)
	}
	return nil
}

// ImportImage makes layer key from img's flattened root, with E2B's users
// added where missing (see repack): uploaded as a unified image tarball,
// made a layer instance, and the image deleted.
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
	props := map[string]string{
		"description": "sandboxd layer " + key + " (being imported)",
		propLayer:     key,
		// Incus refuses a second image of the same fingerprint: two
		// concurrent imports of one key must each get their own.
		propNonce: rand.Text(),
		propOwner: b.owner,
	}
	if b.opts.Namespace != "" {
		props[propNamespace] = b.opts.Namespace
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(repack(img, imageMetadata(props), pw)) }()
	fp, err := b.c.UploadImage(ctx, pr)
	// Ends repack if the upload stopped early (its next write fails).
	pr.CloseWithError(errors.New("upload ended"))
	if err != nil {
		return fmt.Errorf("import image as layer %s: %w", key, err)
	}
	defer func() {
		if err := b.c.DeleteImage(context.WithoutCancel(ctx), fp); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			b.log.Warn("incus: delete an imported layer's image", "layer", key, "image", fp, "err", err)
		}
	}()
	if err := b.makeLayer(ctx, key, []string{"", key}, InstanceSource{Type: "image", Fingerprint: fp}, ""); err != nil {
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

// RemoveLayer deletes layer key's instance, unless a live sandbox of this
// backend was cloned from it (ErrInUse). Destroyed sandboxes whose
// instances are still being deleted do not count: RemoveLayer waits for
// those deletions first.
func (b *Backend) RemoveLayer(ctx context.Context, key string) error {
	if err := runtime.CheckLayerKey(key); err != nil {
		return fmt.Errorf("remove layer: %w", err)
	}
	in, err := b.layerInstance(ctx, key)
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
	var unknown []*Instance // listed users neither in memory nor being deleted
	b.mu.Lock()
	for _, s := range b.sbx {
		if s.source == in.Name {
			b.mu.Unlock()
			return fmt.Errorf("remove layer %s: %w: sandbox %s", key, runtime.ErrInUse, s.id)
		}
	}
	for _, sb := range all {
		if sb.Config[keySource] != in.Name || !b.ours(sb) {
			continue
		}
		if ch := b.deleting[sb.Config[keyID]]; ch != nil {
			waits = append(waits, ch)
			continue
		}
		unknown = append(unknown, sb)
	}
	b.mu.Unlock()
	for _, sb := range unknown {
		// The listing came before the lock: a destroyed sandbox's
		// deletion may have finished in between. One that is still
		// there and not being deleted is a live sandbox not adopted yet
		// (the next List adopts it).
		id := sb.Config[keyID]
		_, err := b.c.Instance(ctx, sb.Name)
		if errors.Is(err, runtime.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("remove layer %s: %w", key, err)
		}
		b.mu.Lock()
		ch := b.deleting[id]
		b.mu.Unlock()
		if ch == nil {
			return fmt.Errorf("remove layer %s: %w: sandbox %s", key, runtime.ErrInUse, id)
		}
		waits = append(waits, ch)
	}
	if err := waitClosed(ctx, waits); err != nil {
		return fmt.Errorf("remove layer %s: waiting for a destroyed sandbox's deletion: %w", key, err)
	}
	if err := b.removeReplicas(ctx, in.Name); err != nil {
		return fmt.Errorf("remove layer %s: %w", key, err)
	}
	err = b.c.DeleteInstance(ctx, in.Name)
	b.forgetLayerMember(in.Name) // made again, it may be on another member
	if err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return fmt.Errorf("remove layer %s: %w", key, err)
	}
	return nil
}

// DefineTemplate makes name the clone source of layers' top layer, which
// holds the whole root of base plus layers (or base's own image when
// layers is empty). base is a template of Options.Images, one of
// DefineTemplate, or "" when the bottom layer is an imported image.
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
	var src *rootSource
	switch {
	case base == "":
		below = []string{""}
	default:
		if _, own := b.opts.Images[base]; own {
			below = []string{base}
			if len(layers) == 0 {
				var err error
				if src, _, err = b.templateSource(ctx, base); err != nil {
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
		below, src = d.stack, d.source
	}
	stack := append(slices.Clone(below), layers...)
	if len(layers) > 0 {
		// Every layer must exist (the contract), though only the top one
		// is cloned.
		var top *Instance
		for _, key := range layers {
			in, err := b.layerInstance(ctx, key)
			if errors.Is(err, runtime.ErrNotFound) {
				return wrap(fmt.Errorf("%w: layer %s", runtime.ErrTemplateNotFound, key))
			}
			if err != nil {
				return wrap(fmt.Errorf("layer %s: %w", key, err))
			}
			top = in
		}
		if got := top.Config[keyStack]; got != strings.Join(stack, ",") {
			return wrap(fmt.Errorf("%w: layer %s holds the whole root of the stack it was made on (%q), not of %q: on Incus a layer is a complete root",
				runtime.ErrInvalidSpec, layers[len(layers)-1], got, strings.Join(stack, ",")))
		}
		size, _ := strconv.ParseInt(top.Config[keyLayerSize], 10, 64)
		src = &rootSource{layer: top.Name, size: size}
	}
	b.mu.Lock()
	b.defined[name] = &definedTemplate{source: src, stack: stack}
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

// templateSource resolves template name (of Options.Images or of
// DefineTemplate) to the source of its roots and the stack it holds; an
// unknown name or a missing image is ErrTemplateNotFound.
func (b *Backend) templateSource(ctx context.Context, name string) (*rootSource, []string, error) {
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
	return d.source, d.stack, nil
}

// definedNames are the names of DefineTemplate's templates.
func (b *Backend) definedNames() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Collect(maps.Keys(b.defined))
}

// collectLayerLeftovers deletes what a dead process's Commit or ImportImage
// left half made in this namespace: temporary layer instances, and layer
// images without an alias (an image lives only inside an ImportImage;
// older versions' named layer images are migrateLayerImages'). This
// process's own may be in a Commit or ImportImage under way, and are left
// alone. Run by Reconcile, once the operations of an earlier process have
// ended.
func (b *Backend) collectLayerLeftovers(ctx context.Context) error {
	var errs []error
	ins, err := b.c.Instances(ctx, keyLayer)
	if err != nil {
		errs = append(errs, fmt.Errorf("list instances: %w", err))
	}
	for _, in := range ins {
		if !b.isLayer(in) || !strings.HasPrefix(in.Name, layerTempPrefix) || in.Config[keyOwner] == b.owner {
			continue
		}
		if err := b.c.DeleteInstance(ctx, in.Name); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete half-made layer instance %s: %w", in.Name, err))
			continue
		}
		b.log.Info("incus: deleted a layer instance a dead process left half made", "instance", in.Name, "layer", in.Config[keyLayer])
	}
	all, err := b.c.Images(ctx)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list images: %w", err))...)
	}
	for _, im := range all {
		if _, layer := im.Properties[propLayer]; !layer || len(im.Aliases) > 0 ||
			im.Properties[propNamespace] != b.opts.Namespace || im.Properties[propOwner] == b.owner {
			continue
		}
		if err := b.c.DeleteImage(ctx, im.Fingerprint); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete layer image %s: %w", im.Fingerprint, err))
		}
	}
	return errors.Join(errs...)
}

// migrateLayerImages makes a layer instance of each named layer image of
// this namespace, what older versions of this backend made layers of
// (published images, aliased "sandboxd-layer-…"), then deletes the image:
// templates and snapshots built before an upgrade keep working. incusd
// unpacks each image once, here. A layer whose instance exists already
// just loses its image; one that fails keeps it, for the next start.
// Run by Reconcile, before the template service defines its templates.
func (b *Backend) migrateLayerImages(ctx context.Context) error {
	all, err := b.c.Images(ctx)
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	var errs []error
	for _, im := range all {
		key, layer := im.Properties[propLayer]
		if !layer || len(im.Aliases) == 0 || im.Properties[propNamespace] != b.opts.Namespace {
			continue
		}
		if err := runtime.CheckLayerKey(key); err != nil {
			continue
		}
		have, err := b.HasLayer(ctx, key)
		if err == nil && !have {
			t0 := time.Now()
			stack := strings.Split(im.Properties[propStack], ",")
			err = b.makeLayer(ctx, key, stack, InstanceSource{Type: "image", Fingerprint: im.Fingerprint}, "")
			if err == nil {
				b.log.Info("incus: layer image made a layer instance", "layer", key, "image", im.Fingerprint, "took", time.Since(t0))
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("migrate layer image %s (%s): %w", im.Fingerprint, key, err))
			continue
		}
		if err := b.c.DeleteImage(ctx, im.Fingerprint); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete migrated layer image %s: %w", im.Fingerprint, err))
		}
	}
	return errors.Join(errs...)
}

// BaseDigest names base's root: its image's fingerprint (a new image under
// the same alias is another base) or its top layer's instance.
func (b *Backend) BaseDigest(ctx context.Context, base string) (string, error) {
	im, _, err := b.templateSource(ctx, base)
	if err != nil {
		return "", fmt.Errorf("base digest: %w", err)
	}
	return im.id(), nil
}
