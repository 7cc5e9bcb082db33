package incus

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
)

func TestPoolReserve(t *testing.T) {
	c, err := newCluster(ClusterOptions{Relay: nopRelay{}})
	if err != nil {
		t.Fatal(err)
	}
	const gib = 1 << 30
	for _, tc := range []struct {
		total, want uint64
	}{
		{0, 0},                     // unknown
		{100 * gib, 10 * gib},      // the share
		{20 * gib, 2 * gib},        // the share
		{4 * gib, 1 * gib},         // the floor
		{2 * gib, gib / 2},         // a small pool: a quarter
		{1000 * gib, 100 * gib},    // the share
		{8 * gib, 1 * gib},         // the floor over the share
		{12 * gib, 12 * gib / 10},  // the share over the floor
		{3 * gib / 2, 3 * gib / 8}, // a quarter
	} {
		if got := c.poolReserve(&clusterMember{poolTotal: tc.total}); got != tc.want {
			t.Errorf("poolReserve(total %d) = %d, want %d", tc.total, got, tc.want)
		}
	}
}

// TestReplicaRoom: replicas go only where the pool keeps its reserve free
// after the copy, and a member short of its reserve gives up its largest.
func TestReplicaRoom(t *testing.T) {
	const gib = 1 << 30
	b := clusterBackend(t, map[string]int{"home": 4, "roomy": 4, "tight": 4, "unknown": 4, "full": 4, "has": 4})
	pools := map[string]uint64{"home": 50, "roomy": 50, "tight": 12, "full": 3, "has": 50} // GiB free of 100
	for name, free := range pools {
		b.cluster.members[name].poolTotal, b.cluster.members[name].poolFree = 100*gib, free*gib
	}
	b.cluster.replicas["L"] = map[string]string{"has": "sbr-has"}
	got := b.replicaTargets("L", "home", 3*gib)
	if want := []string{"roomy"}; !slices.Equal(got, want) {
		t.Errorf("replicaTargets(3 GiB) = %v, want %v (tight: 12-3 < 10 reserve; unknown pool; full; has one; home)", got, want)
	}
	if got := b.replicaTargets("L", "home", 2*gib); !slices.Equal(got, []string{"roomy", "tight"}) {
		t.Errorf("replicaTargets(2 GiB) = %v, want [roomy tight]", got)
	}

	// Nobody short: nothing given up.
	found := map[string]map[string]string{
		"L": {"has": "sbr-L-has", "full": "sbr-L-full"},
		"M": {"full": "sbr-M-full", "roomy": "sbr-M-roomy"},
		"N": {"full": "sbr-N-full"},
	}
	b.cluster.layerSizes = map[string]uint64{"L": 2 * gib, "M": 5 * gib, "N": 1 * gib}
	b.cluster.members["full"].poolFree = 20 * gib
	if m, name := b.replicaToGiveUp(found); name != "" {
		t.Errorf("replicaToGiveUp with room everywhere = %s on %s, want none", name, m)
	}
	b.cluster.members["full"].poolFree = 3 * gib
	if m, name := b.replicaToGiveUp(found); m != "full" || name != "sbr-M-full" {
		t.Errorf("replicaToGiveUp = %s on %s, want the largest on the short member: sbr-M-full on full", name, m)
	}
}

func TestReplicaSize(t *testing.T) {
	const gib = 1 << 30
	b := clusterBackend(t, map[string]int{"m1": 4})
	in := func(recorded string) *Instance {
		return &Instance{Config: map[string]string{keyLayerSize: recorded}}
	}
	if got := b.replicaSize("L", in("")); got != replicaSizeGuess {
		t.Errorf("nothing known: %d, want the guess %d", got, replicaSizeGuess)
	}
	if got := b.replicaSize("L", in("3221225472")); got != 3*gib {
		t.Errorf("recorded 3 GiB: %d", got)
	}
	b.cluster.layerSizes["M"] = 2 * gib
	if got := b.replicaSize("L", in("")); got != 2*gib {
		t.Errorf("another layer's replica took 2 GiB: %d, want that as the guess", got)
	}
	b.cluster.layerSizes["L"] = gib / 2
	if got := b.replicaSize("L", in("")); got != gib/2 {
		t.Errorf("its own replica took 512 MiB: %d", got)
	}
	if got := b.replicaSize("L", in("1073741824")); got != gib {
		t.Errorf("recorded 1 GiB, measured 512 MiB: %d, want the larger", got)
	}
}

// TestReplicateMissingOff: without Replicas a pass makes no copy, but
// still gives up a replica on a member short of its pool's reserve (the
// replicas an earlier sandboxd made are used, so kept in bounds).
func TestReplicateMissingOff(t *testing.T) {
	const gib = 1 << 30
	for _, replicas := range []bool{false, true} {
		t.Run(fmt.Sprintf("replicas=%v", replicas), func(t *testing.T) {
			f, client := newRecordingIncus(t, func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.Method == http.MethodGet && r.URL.Path == "/1.0/instances/sbl-L":
					_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{"name":"sbl-L","location":"home","architecture":"x86_64","config":{}}}`)
				case r.Method == http.MethodDelete && r.URL.Path == "/1.0/instances/sbr-L-full":
					_, _ = io.WriteString(w, `{"type":"sync","status_code":200,"metadata":{}}`)
				default: // a copy: refused, so that the pass ends
					w.WriteHeader(http.StatusInternalServerError)
					_, _ = io.WriteString(w, `{"type":"error","error":"unexpected","error_code":500}`)
				}
			})
			b := clusterBackend(t, map[string]int{"home": 4, "roomy": 4, "full": 4})
			b.c = client
			b.cluster.opts.Replicas = replicas
			for name, free := range map[string]uint64{"home": 50, "roomy": 50, "full": 3} {
				b.cluster.members[name].poolTotal, b.cluster.members[name].poolFree = 100*gib, free*gib
			}
			b.cluster.layers["sbl-L"] = "home"
			b.defined = map[string]*definedTemplate{"t": {source: &rootSource{layer: "sbl-L"}}}
			found := map[string]map[string]string{"sbl-L": {"full": "sbr-L-full"}}
			b.cluster.replicas = found
			_ = b.replicateMissing(context.Background(), found)
			if gaveUp, calls := f.called("DELETE /1.0/instances/sbr-L-full"); !gaveUp {
				t.Errorf("the replica on the short member was not given up: %v", calls)
			}
			if copied, calls := f.called("POST /1.0/instances"); copied != replicas {
				t.Errorf("a copy was asked for: %v, want %v (%v)", copied, replicas, calls)
			}
		})
	}
}
