package incus

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

// What a SIGKILLed sandboxd began in Incus goes on without it: incusd
// finishes copying and starting a fork's instance, making a commit's
// snapshot, copying it into a layer instance, unpacking an imported image.
// Reconcile must act on the outcome, not on the middle, or the outcome (an
// instance, an unnamed image) appears after it ran and is never cleaned
// up. These are its steps for that; the e2e TestIncusSnapshotCrashE2E
// kills sandboxd inside a snapshot and a fork.

// opWaitLimit bounds each wait for the operations of an earlier process,
// all of them together: they run side by side in incusd.
const opWaitLimit = 2 * time.Minute

// awaitInstanceOps waits for the Incus operations under way on this
// backend's instances (a create, a copy, a snapshot) and volumes (a create
// or delete the volume service's Prune, after Reconcile, must see done),
// for at most opWaitLimit in all. Failures to look are logged: Reconcile
// goes on regardless.
func (b *Backend) awaitInstanceOps(ctx context.Context) {
	ops, err := b.c.RunningOperations(ctx)
	if err != nil {
		b.log.Warn("incus: list operations under way", "err", err)
		return
	}
	var ours []string
	for _, op := range ops {
		if b.onOurInstance(ctx, op) {
			b.log.Info("incus: waiting for an operation an earlier process began", "operation", op.ID, "description", op.Description)
			ours = append(ours, op.ID)
		}
	}
	b.waitOps(ctx, ours)
}

// waitOps waits for the operations ids, side by side, until they have all
// ended, opWaitLimit has passed or ctx ends. An operation's failure is an
// outcome too: only its end matters.
func (b *Backend) waitOps(ctx context.Context, ids []string) {
	ctx, cancel := context.WithTimeout(ctx, opWaitLimit)
	defer cancel()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() { _, _ = b.c.Wait(ctx, id) })
	}
	wg.Wait()
}

// onOurInstance says whether op acts on an instance or a volume of this
// backend.
func (b *Backend) onOurInstance(ctx context.Context, op *Operation) bool {
	for _, p := range op.Resources["storage_volumes"] {
		if strings.HasPrefix(path.Base(p), b.volumeName("")) {
			return true
		}
	}
	for _, p := range op.Resources["instances"] {
		name := path.Base(p)
		switch {
		case strings.HasPrefix(name, "sbx-"), strings.HasPrefix(name, "sbh-"):
			if in, err := b.c.Instance(ctx, name); err == nil && b.ours(in) {
				return true
			}
		case strings.HasPrefix(name, layerPrefix), strings.HasPrefix(name, layerTempPrefix):
			if in, err := b.c.Instance(ctx, name); err == nil && b.isLayer(in) {
				return true
			}
		}
	}
	return false
}

// staleCommits lists, by instance, the commit snapshots (commitPrefix) of
// this backend's instances that an earlier process made: its Commit was
// cut short, and the snapshot would pin the blocks it shares with the
// sandbox's root, and keep its instance from being deleted, for as long as
// it exists.
func (b *Backend) staleCommits(ctx context.Context, all []*Instance) (map[string][]string, error) {
	out := map[string][]string{}
	var errs []error
	for _, in := range all {
		if !b.ours(in) {
			continue
		}
		snaps, err := b.c.Snapshots(ctx, in.Name)
		if errors.Is(err, runtime.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("snapshots of %s: %w", in.Name, err))
			continue
		}
		for _, s := range snaps {
			if strings.HasPrefix(s, commitPrefix) && !strings.HasPrefix(s, commitPrefix+b.owner+"-") {
				out[in.Name] = append(out[in.Name], s)
			}
		}
	}
	return out, errors.Join(errs...)
}

// removeStaleCommits deletes the snapshots of staleCommits, then collects
// what layer makings cut short left (collectLayerLeftovers), once the
// image operations under way have ended: an image an import of the
// earlier process uploads appears when its operation ends, after
// Reconcile's first collection would have looked. (The copies of commit
// snapshots into layers are instance operations: awaitInstanceOps waited
// for them.) Incus does not say which instance an image operation reads,
// so every one under way is waited for (waitOps), in the background when
// there are any; Close cancels and joins that (the next start redoes it).
func (b *Backend) removeStaleCommits(ctx context.Context, stale map[string][]string) error {
	ops, err := b.c.RunningOperations(ctx)
	if err != nil {
		return fmt.Errorf("list operations under way: %w", err)
	}
	var images []string
	for _, op := range ops {
		if strings.Contains(strings.ToLower(op.Description), "image") {
			images = append(images, op.ID)
		}
	}
	finish := func(ctx context.Context) error {
		var errs []error
		for name, snaps := range stale {
			for _, s := range snaps {
				if err := b.c.DeleteSnapshot(ctx, name, s); err != nil && !errors.Is(err, runtime.ErrNotFound) {
					errs = append(errs, fmt.Errorf("delete the stale commit snapshot %s/%s: %w", name, s, err))
					continue
				}
				b.log.Info("incus: deleted the snapshot of a commit cut short", "instance", name, "snapshot", s)
			}
		}
		if err := b.collectLayerLeftovers(ctx); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	if len(images) == 0 {
		return finish(ctx)
	}
	b.log.Info("incus: image operations under way; the stale commits and unnamed layers go once they end", "operations", len(images))
	b.background.Go(func() {
		b.waitOps(b.closing, images)
		if b.closing.Err() != nil {
			return
		}
		fctx, cancel := context.WithTimeout(b.closing, time.Minute)
		defer cancel()
		if err := finish(fctx); err != nil {
			b.log.Warn("incus: remove what commits cut short left", "err", err)
		}
	})
	return nil
}
