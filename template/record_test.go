package template

import (
	"encoding/json"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/store/storetest"
)

// A build writes its layers into its row when it has new ones, and only
// then: the row is written once per layer, not once per call.
func TestRecordLayersWritesNewOnly(t *testing.T) {
	ctx := t.Context()
	st, _ := storetest.Open(t, "a")
	now := time.Unix(1_800_000_000, 0)
	tpl, err := st.RequestBuild(ctx, store.Template{ID: "t1", Tenant: "a", Name: "app"}, "b1", now)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.UpdateBuild(ctx, store.Build{ID: "b1", TemplateID: "t1", Status: store.BuildBuilding}, now); err != nil {
		t.Fatal(err)
	}
	writes := 0
	s := &Service{cfg: Config{Store: st, Now: func() time.Time { writes++; return now }}, log: slog.New(slog.DiscardHandler)}
	bd := &builder{s: s, tpl: tpl, id: "b1"}
	for _, tc := range []struct {
		name   string
		layers []string
		writes int
	}{
		{"no layers", nil, 0},
		{"an image's layer, before its import", []string{"img"}, 1},
		{"the same layer, after the base", []string{"img"}, 1},
		{"a step's layer", []string{"img", "s1"}, 2},
		{"a cached step, nothing new", []string{"img", "s1"}, 2},
	} {
		bd.st.layers = tc.layers
		bd.recordLayers(ctx)
		if writes != tc.writes {
			t.Fatalf("%s: %d writes, want %d", tc.name, writes, tc.writes)
		}
		b, err := st.GetBuild(ctx, "t1", "b1")
		if err != nil {
			t.Fatal(err)
		}
		var res Result
		if len(b.Result) > 0 {
			if err := json.Unmarshal(b.Result, &res); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(res.Layers, tc.layers) || (len(tc.layers) > 0 && !res.Partial) {
			t.Fatalf("%s: the row holds %v (partial %v), want %v", tc.name, res.Layers, res.Partial, tc.layers)
		}
	}
}
