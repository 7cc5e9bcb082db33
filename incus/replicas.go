package incus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/runtime"
)

// Replicas of layers, on a cluster: a template built by sandboxd is built
// once, on one member, and then available on every member.
//
// A layer is a stopped instance on one member's local pool (layers.go). A
// sandbox is a copy-on-write clone of it, which Incus can only make on the
// same member. So the top layer of every defined template is copied once
// to each other member (an Incus instance copy between members, which
// moves the whole root once), as a stopped instance named
// replicaName(layer, member). Placement then chooses among the members
// that hold the layer or a replica, and a sandbox on a replica's member is
// cloned from the replica, as fast as from the layer.
//
// The replicator (replicateLoop) runs beside the member refresh. Every
// pass lists the replicas that exist, which is also how a restarted
// sandboxd learns them. It then makes the missing ones, one copy at a
// time, for members that are usable: a new template within a pass of its
// build, a new member or one that returns within a pass of that.
// RemoveLayer deletes a layer's replicas with it; a pass deletes replicas
// whose layer is gone (a crash between the two) and half-made copies of a
// dead process.
//
// Space: a replica is made only on a member whose pool keeps its reserve
// (ClusterOptions.PoolReserve) free after the copy, by what a replica of
// the layer takes (replicaSize) and the pool's free space read at the
// last member refresh. A member whose pool falls short of the reserve (its sandboxes
// wrote) gives up its replicas, largest first, one a pass: they are the
// only space sandboxd can free there, and its creates go to the members
// that hold the layer meanwhile. A replica given up this way is made again
// only once the pool has room for it above the reserve, so the two do not
// alternate.

// keyReplicaOf on a replica is the name of the layer instance it copies.
const keyReplicaOf = "user.sandboxd.replica-of"

// replicaPrefix starts replicas' instance names.
const replicaPrefix = "sbr-"

// replicaName is the instance name of layer's replica on member: instance
// names are global to the project, and member names may be long.
func replicaName(layer, member string) string {
	h := sha256.Sum256([]byte(layer + "\x00" + member))
	return replicaPrefix + hex.EncodeToString(h[:20])
}

// replicaMembers are the members that hold a replica of layer.
func (c *cluster) replicaMembers(layer string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Collect(maps.Keys(c.replicas[layer]))
}

// replicaOn is the name of layer's replica on member, "" if it has none.
func (c *cluster) replicaOn(layer, member string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replicas[layer][member]
}

// replicateLoop runs replicatePass every RefreshInterval until the backend
// closes. A pass may take long (copies of whole roots), and the next
// starts only after it.
func (b *Backend) replicateLoop() {
	t := time.NewTicker(b.cluster.opts.RefreshInterval)
	defer t.Stop()
	for {
		if err := b.replicatePass(b.closing); err != nil && b.closing.Err() == nil {
			b.log.Warn("incus cluster: layer replicas", "err", err)
		}
		select {
		case <-b.closing.Done():
			return
		case <-t.C:
		}
	}
}

// replicatePass learns the replicas that exist, removes the leftovers and
// makes the missing ones.
func (b *Backend) replicatePass(ctx context.Context) error {
	found, err := b.learnReplicas(ctx)
	if found == nil {
		return err
	}
	return errors.Join(err, b.replicateMissing(ctx, found))
}

// learnReplicas reads the replicas that exist into the placement's view
// (startCluster does it first, so that a restarted sandboxd places on
// them at once) and deletes half-made copies of a dead process. nil on a
// server that is not clustered.
func (b *Backend) learnReplicas(ctx context.Context) (map[string]map[string]string, error) {
	c := b.cluster
	if c.single != "" {
		return nil, nil // one member: nothing to copy to
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ins, err := b.c.Instances(lctx, keyReplicaOf)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("list replicas: %w", err)
	}
	var errs []error
	found := map[string]map[string]string{}
	for _, in := range ins {
		layer := in.Config[keyReplicaOf]
		if in.Config[keyNamespace] != b.opts.Namespace {
			continue
		}
		switch {
		case strings.HasPrefix(in.Name, layerTempPrefix):
			// Half made: by a dead process unless by this one's
			// copy in progress (which the replicator alone makes).
			if in.Config[keyOwner] != b.owner {
				errs = append(errs, b.deleteReplica(ctx, in.Name, "left half made by an earlier process"))
			}
		case strings.HasPrefix(in.Name, replicaPrefix):
			if found[layer] == nil {
				found[layer] = map[string]string{}
			}
			found[layer][in.Location] = in.Name
		}
	}
	c.mu.Lock()
	c.replicas = found
	c.mu.Unlock()
	return found, errors.Join(errs...)
}

// replicateMissing deletes the replicas of layers that are gone, gives
// one up on a member short of its pool's reserve, and (with Replicas)
// makes the missing replicas of the defined templates' layers, one at a
// time. Without Replicas, the replicas a sandboxd made before are still
// used, so they are still kept in bounds.
func (b *Backend) replicateMissing(ctx context.Context, found map[string]map[string]string) error {
	c := b.cluster
	var errs []error
	wanted := b.definedLayers()
	for layer, on := range found {
		if slices.Contains(wanted, layer) {
			continue
		}
		// Not the top of a template now: kept while its layer is (a
		// template defined again finds it), removed once it is gone.
		if _, err := b.c.Instance(ctx, layer); errors.Is(err, runtime.ErrNotFound) {
			for _, name := range on {
				errs = append(errs, b.deleteReplica(ctx, name, "its layer is gone"))
			}
			c.mu.Lock()
			delete(c.replicas, layer)
			c.mu.Unlock()
		}
	}
	if member, name := b.replicaToGiveUp(found); name != "" {
		errs = append(errs, b.deleteReplica(ctx, name, "its member's pool is short of its reserve"))
		c.mu.Lock()
		for _, on := range c.replicas {
			if on[member] == name {
				delete(on, member)
			}
		}
		c.mu.Unlock()
	}
	if !c.opts.Replicas {
		return errors.Join(errs...)
	}
	for _, layer := range wanted {
		home, err := b.layerMember(ctx, layer)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		in, err := b.c.Instance(ctx, layer)
		if err != nil {
			errs = append(errs, fmt.Errorf("replica of %s: %w", layer, err))
			continue
		}
		size := b.replicaSize(layer, in)
		for _, member := range b.replicaTargets(layer, home, size) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			errs = append(errs, b.makeReplica(ctx, in, member, size))
		}
	}
	return errors.Join(errs...)
}

// replicaSizeGuess is what a layer's replica is taken to cost before any
// is measured: a code interpreter's root is ≈ 1.4 GiB, a small template's
// a few hundred MiB.
const replicaSizeGuess = 1 << 30

// replicaSize is what a replica of layer instance in costs its member's
// pool: the most of its recorded size (keyLayerSize, measured where
// sandboxd is beside the pool), what a replica of it was measured to take
// (Incus' disk usage of the copy, a whole root: the layer's own usage
// counts only what it added to the layer below), or, with neither, the
// largest replica measured of any layer, at least replicaSizeGuess.
func (b *Backend) replicaSize(layer string, in *Instance) uint64 {
	size, _ := strconv.ParseUint(in.Config[keyLayerSize], 10, 64)
	c := b.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, ok := c.layerSizes[layer]; ok {
		return max(size, m)
	}
	guess := uint64(replicaSizeGuess)
	for _, m := range c.layerSizes {
		guess = max(guess, m)
	}
	return max(size, guess)
}

// measureReplica records what replica name of layer takes on its pool.
func (b *Backend) measureReplica(ctx context.Context, layer, name string) {
	st, err := b.c.InstanceState(ctx, name)
	if err != nil {
		b.log.Warn("incus cluster: a replica's size", "instance", name, "err", err)
		return
	}
	if u := st.Disk["root"].Usage; u > 0 {
		c := b.cluster
		c.mu.Lock()
		c.layerSizes[layer] = max(c.layerSizes[layer], uint64(u))
		c.mu.Unlock()
	}
}

// replicaToGiveUp picks the largest replica (of those found) on a member
// whose pool is short of its reserve; "" if there is none.
func (b *Backend) replicaToGiveUp(found map[string]map[string]string) (member, name string) {
	c := b.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	var best uint64
	for layer, on := range found {
		size := c.layerSizes[layer]
		for m, n := range on {
			if cm := c.members[m]; cm != nil && c.poolLow(cm) && (name == "" || size > best || size == best && n < name) {
				member, name, best = m, n, size
			}
		}
	}
	return member, name
}

// definedLayers are the top layers of the templates defined now.
func (b *Backend) definedLayers() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, d := range b.defined {
		if d.source != nil && d.source.layer != "" && !slices.Contains(out, d.source.layer) {
			out = append(out, d.source.layer)
		}
	}
	slices.Sort(out)
	return out
}

// replicaTargets are the usable members, other than home and those given
// by --incus-member when set, that hold no replica of layer and whose
// pool has room for one of size bytes above its reserve. A member left
// out for room is logged once, until it has room.
func (b *Backend) replicaTargets(layer, home string, size uint64) []string {
	c := b.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name, m := range c.members {
		if name == home || !m.usable() || m.lost || c.replicas[layer][name] != "" ||
			len(c.opts.Members) > 0 && !slices.Contains(c.opts.Members, name) {
			continue
		}
		key := [2]string{layer, name}
		if !c.poolRoom(m, size) {
			if !c.noRoom[key] {
				c.noRoom[key] = true
				msg := "incus cluster: no room for a layer replica"
				if m.poolTotal == 0 {
					msg = "incus cluster: no layer replica on a member whose pool's space is unknown"
				}
				b.log.Warn(msg, "layer", layer, "member", name,
					"size_bytes", size, "free_bytes", m.poolFree, "reserve_bytes", c.poolReserve(m))
			}
			continue
		}
		delete(c.noRoom, key)
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// makeReplica copies layer instance in (of size bytes) to member
// (makeStopped: under a temporary name, then renamed) and records it.
func (b *Backend) makeReplica(ctx context.Context, in *Instance, member string, size uint64) error {
	layer := in.Name
	name := replicaName(layer, member)
	cfg := map[string]string{keyReplicaOf: layer, keyStack: in.Config[keyStack], keyLayerSize: in.Config[keyLayerSize], keyOwner: b.owner}
	t0 := time.Now()
	err := b.makeStopped(ctx, InstanceSource{Type: "copy", Source: layer, InstanceOnly: true}, in.Architecture, targetOf(member), cfg, name, false,
		"sandboxd replica of layer "+layer, func() bool { return true })
	if err != nil {
		return fmt.Errorf("replica of %s on %s: %w", layer, member, err)
	}
	c := b.cluster
	c.mu.Lock()
	if c.replicas[layer] == nil {
		c.replicas[layer] = map[string]string{}
	}
	c.replicas[layer][member] = name
	if m := c.members[member]; m != nil {
		// Until the next refresh reads the pool again.
		m.poolFree -= min(size, m.poolFree)
	}
	c.mu.Unlock()
	b.measureReplica(ctx, layer, name)
	b.log.Info("incus cluster: layer replicated", "layer", layer, "member", member, "instance", name, "took_ms", time.Since(t0).Milliseconds())
	return nil
}

// removeReplicas deletes layer's replicas (RemoveLayer).
func (b *Backend) removeReplicas(ctx context.Context, layer string) error {
	c := b.cluster
	if c == nil {
		return nil
	}
	ins, err := b.c.Instances(ctx, keyReplicaOf)
	if err != nil {
		return fmt.Errorf("list replicas: %w", err)
	}
	var errs []error
	for _, in := range ins {
		if in.Config[keyReplicaOf] == layer && in.Config[keyNamespace] == b.opts.Namespace {
			errs = append(errs, b.deleteReplica(ctx, in.Name, "its layer is removed"))
		}
	}
	c.mu.Lock()
	delete(c.replicas, layer)
	c.mu.Unlock()
	return errors.Join(errs...)
}

func (b *Backend) deleteReplica(ctx context.Context, name, why string) error {
	if err := b.c.DeleteInstance(ctx, name); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return fmt.Errorf("delete replica %s: %w", name, err)
	}
	b.log.Info("incus cluster: deleted a layer replica", "instance", name, "why", why)
	return nil
}
