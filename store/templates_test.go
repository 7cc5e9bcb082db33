package store

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

// forEachTemplateStore runs fn per dialect on a store with tenants a and b,
// at a fixed now.
func forEachTemplateStore(t *testing.T, fn func(t *testing.T, s *Store, now time.Time)) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		mustTenant(t, s, "a")
		mustTenant(t, s, "b")
		fn(t, s, time.Unix(1700000000, 0).UTC())
	})
}

func TestTemplates(t *testing.T) {
	forEachTemplateStore(t, func(t *testing.T, s *Store, now time.Time) {
		ctx := t.Context()

		if _, err := s.RequestBuild(ctx, Template{ID: "t1", Tenant: "a", Name: "app", CPUCount: 2}, "b1", now); err != nil {
			t.Fatal(err)
		}
		// The same name again is the same template, with the new resources.
		again, err := s.RequestBuild(ctx, Template{ID: "t2", Tenant: "a", Name: "app", MemoryMB: 1024}, "b2", now.Add(time.Second))
		if err != nil || again.ID != "t1" || again.MemoryMB != 1024 || again.CPUCount != 0 {
			t.Fatalf("second request: %+v, %v", again, err)
		}
		// Another tenant's same name is another template; a build id is unique.
		if other, err := s.RequestBuild(ctx, Template{ID: "t3", Tenant: "b", Name: "app"}, "b3", now); err != nil || other.ID != "t3" {
			t.Fatalf("tenant b: %+v, %v", other, err)
		}
		if _, err := s.RequestBuild(ctx, Template{ID: "t4", Tenant: "a", Name: "x"}, "b1", now); !errors.Is(err, ErrConflict) {
			t.Errorf("reused build id: %v", err)
		}
		if _, err := s.RequestBuild(ctx, Template{ID: "t5", Tenant: "nobody", Name: "x"}, "b5", now); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown tenant: %v", err)
		}

		// Visibility: by id or name, own first; private ones of others are missing.
		for _, tc := range []struct {
			tenant, ref, want string
		}{
			{"a", "app", "t1"}, {"a", "t1", "t1"}, {"b", "app", "t3"}, {"b", "t1", ""},
		} {
			got, err := s.FindTemplate(ctx, tenant.ID(tc.tenant), tc.ref)
			if tc.want == "" {
				if !errors.Is(err, ErrNotFound) {
					t.Errorf("%s finds %s: %+v, %v", tc.tenant, tc.ref, got, err)
				}
			} else if err != nil || got.ID != tc.want {
				t.Errorf("%s finds %s: %+v, %v; want %s", tc.tenant, tc.ref, got, err, tc.want)
			}
		}
		if err := s.SetTemplatePublic(ctx, "b", "t1", true, now); !errors.Is(err, ErrNotFound) {
			t.Errorf("b publishes a's template: %v", err)
		}
		if err := s.SetTemplatePublic(ctx, "a", "t1", true, now); err != nil {
			t.Fatal(err)
		}
		if got, err := s.FindTemplate(ctx, "b", "t1"); err != nil || got.ID != "t1" {
			t.Errorf("public template by id: %+v, %v", got, err)
		}
		if got, _ := s.FindTemplate(ctx, "b", "app"); got.ID != "t3" {
			t.Errorf("b's own name must win over a public one: %+v", got)
		}
		if list, _ := s.ListTemplates(ctx, "b"); len(list) != 2 {
			t.Errorf("b lists %d templates, want its own and the public one", len(list))
		}

		// Builds: waiting → ready is final.
		b, err := s.GetBuild(ctx, "t1", "b1")
		if err != nil || b.Status != BuildWaiting {
			t.Fatalf("build: %+v, %v", b, err)
		}
		b.Status, b.Result, b.Logs = BuildReady, []byte(`{"layers":["x"]}`), []byte(`[{"message":"ok"}]`)
		if err := s.UpdateBuild(ctx, b, now); err != nil {
			t.Fatal(err)
		}
		b.Status = BuildError
		if err := s.UpdateBuild(ctx, b, now); !errors.Is(err, ErrConflict) {
			t.Errorf("updating a finished build: %v", err)
		}
		if ready, _ := s.ListBuilds(ctx, "", BuildReady); len(ready) != 1 || string(ready[0].Result) != `{"layers":["x"]}` {
			t.Errorf("ready builds: %+v", ready)
		}

		// Tags move; deleting the template takes builds and tags with it.
		if err := s.SetTags(ctx, "t1", "b1", []string{"default", "v1"}, now); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTags(ctx, "t1", "b2", []string{"v1"}, now); err != nil {
			t.Fatal(err)
		}
		tags, _ := s.ListTags(ctx, "t1")
		if len(tags) != 2 || tags[1].Tag != "v1" || tags[1].BuildID != "b2" {
			t.Errorf("tags: %+v", tags)
		}
		if err := s.SetTags(ctx, "t1", "nope", []string{"x"}, now); !errors.Is(err, ErrNotFound) {
			t.Errorf("tag of a missing build: %v", err)
		}
		// A build's layers, as the caller reads them from its result.
		layersOf := func(b Build) []string { return []string{"shared", "of-" + b.ID} }
		if _, err := s.DeleteTemplate(ctx, "b", "t1", layersOf, now); !errors.Is(err, ErrNotFound) {
			t.Errorf("b deletes a's template: %v", err)
		}
		if q, err := s.LayerRemovals(ctx); err != nil || len(q) != 0 {
			t.Errorf("a refused delete queued layers: %v, %v", q, err)
		}
		builds, err := s.DeleteTemplate(ctx, "a", "t1", layersOf, now)
		if err != nil || len(builds) != 2 {
			t.Fatalf("delete: %d builds, %v", len(builds), err)
		}
		if q, err := s.LayerRemovals(ctx); err != nil || !slices.Equal(q, []string{"of-b1", "of-b2", "shared"}) {
			t.Errorf("layers queued by the delete: %v, %v; want of-b1, of-b2, shared", q, err)
		}
		if tags, _ := s.ListTags(ctx, "t1"); len(tags) != 0 {
			t.Errorf("tags outlive their template: %+v", tags)
		}
		if _, err := s.GetBuild(ctx, "t1", "b1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("builds outlive their template: %v", err)
		}
	})
}

// Snapshots are templates with the sandbox they were taken from: a new
// name makes one, the same name adds a build to it (and a built template
// becomes a snapshot); a snapshot build is ready and tagged at once when
// finished, and only once; the list is the tenant's, newest first, by
// sandbox when asked.
func TestSnapshotTemplates(t *testing.T) {
	forEachTemplateStore(t, func(t *testing.T, s *Store, now time.Time) {
		ctx := t.Context()
		steps := []struct {
			tpl       Template
			build     string
			wantID    string
			wantOfSbx string
		}{
			{Template{ID: "s1", Tenant: "a", Name: "s1", SnapshotOf: "sbx1"}, "b1", "s1", "sbx1"},
			{Template{ID: "s2", Tenant: "a", Name: "named", SnapshotOf: "sbx1"}, "b2", "s2", "sbx1"},
			{Template{ID: "s3", Tenant: "a", Name: "named", SnapshotOf: "sbx2"}, "b3", "s2", "sbx2"},
			{Template{ID: "s4", Tenant: "b", Name: "named", SnapshotOf: "sbx3"}, "b4", "s4", "sbx3"},
		}
		for i, st := range steps {
			at := now.Add(time.Duration(i) * time.Second)
			tpl, err := s.StartCommit(ctx, st.tpl, st.build, []byte(`{}`), at)
			if err != nil || tpl.ID != st.wantID || tpl.SnapshotOf != st.wantOfSbx {
				t.Fatalf("StartCommit(%+v) = %+v, %v; want id %s of %s", st.tpl, tpl, err, st.wantID, st.wantOfSbx)
			}
			if b, err := s.GetBuild(ctx, tpl.ID, st.build); err != nil || b.Status != BuildBuilding {
				t.Fatalf("build %s: %+v, %v; want building", st.build, b, err)
			}
			if err := s.FinishCommit(ctx, Build{ID: st.build, TemplateID: tpl.ID, Result: []byte(`{}`)}, "default", "", at); err != nil {
				t.Fatal(err)
			}
			if err := s.FinishCommit(ctx, Build{ID: st.build, TemplateID: tpl.ID, Result: []byte(`{}`)}, "default", "", at); !errors.Is(err, ErrConflict) {
				t.Errorf("finishing %s twice: %v, want ErrConflict", st.build, err)
			}
			tags, err := s.ListTags(ctx, tpl.ID)
			if err != nil || len(tags) != 1 || tags[0].BuildID != st.build {
				t.Errorf("tags of %s after %s: %+v, %v", tpl.ID, st.build, tags, err)
			}
		}
		if _, err := s.RequestBuild(ctx, Template{ID: "built", Tenant: "a", Name: "built"}, "bb", now); err != nil {
			t.Fatal(err)
		}
		// A publish: a commit build of a template that is no snapshot, ready
		// only while the tag still points where the publish began.
		for _, tc := range []struct {
			build, expect string
			want          error
		}{
			{"p1", "b3", nil},
			{"p2", "b3", ErrConflict}, // p1 moved the tag
			{"p3", "p1", nil},
		} {
			tpl, err := s.StartCommit(ctx, Template{ID: "unused", Tenant: "a", Name: "named"}, tc.build, []byte(`{}`), now)
			if err != nil || tpl.SnapshotOf != "sbx2" {
				t.Fatalf("StartCommit(%s) = %+v, %v; want the snapshot template kept as it was", tc.build, tpl, err)
			}
			err = s.FinishCommit(ctx, Build{ID: tc.build, TemplateID: tpl.ID, Result: []byte(`{}`)}, "default", tc.expect, now)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("FinishCommit(%s, expect %s) = %v, want %v", tc.build, tc.expect, err, tc.want)
			}
		}
		for _, tc := range []struct {
			tenant  tenant.ID
			sandbox string
			want    []string
		}{
			{"a", "", []string{"s2", "s1"}},
			{"a", "sbx2", []string{"s2"}},
			{"a", "sbx1", []string{"s1"}},
			{"a", "sbx3", nil},
			{"b", "", []string{"s4"}},
		} {
			got, err := s.ListSnapshotTemplates(ctx, tc.tenant, tc.sandbox)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, g := range got {
				ids = append(ids, g.ID)
			}
			if !slices.Equal(ids, tc.want) {
				t.Errorf("ListSnapshotTemplates(%s, %q) = %v, want %v", tc.tenant, tc.sandbox, ids, tc.want)
			}
		}
	})
}

// TestLayerRemovals: the queue of layers to remove keeps each layer once,
// at its first time, lists the longest queued first, and forgets one
// removed (twice is no error).
func TestLayerRemovals(t *testing.T) {
	forEachTemplateStore(t, func(t *testing.T, s *Store, now time.Time) {
		ctx := t.Context()
		for i, step := range []struct {
			queue []string
			at    time.Duration
		}{
			{[]string{"b", "c"}, time.Second},
			{[]string{"a"}, 2 * time.Second},
			{[]string{"c", "a", "d"}, 0}, // c and a keep their time
		} {
			if err := s.QueueLayerRemovals(ctx, step.queue, now.Add(step.at)); err != nil {
				t.Fatalf("queue #%d: %v", i, err)
			}
		}
		want := []string{"d", "b", "c", "a"}
		if q, err := s.LayerRemovals(ctx); err != nil || !slices.Equal(q, want) {
			t.Fatalf("LayerRemovals = %v, %v; want %v", q, err, want)
		}
		for _, l := range []string{"b", "b", "x"} {
			if err := s.LayerRemoved(ctx, l); err != nil {
				t.Fatalf("LayerRemoved(%s): %v", l, err)
			}
		}
		want = []string{"d", "c", "a"}
		if q, err := s.LayerRemovals(ctx); err != nil || !slices.Equal(q, want) {
			t.Fatalf("after removals: %v, %v; want %v", q, err, want)
		}
	})
}

// TestRecordBuildResult: a building build's result can be written while it
// runs, and is kept when it fails; a build not building refuses it.
func TestRecordBuildResult(t *testing.T) {
	forEachTemplateStore(t, func(t *testing.T, s *Store, now time.Time) {
		ctx := t.Context()
		if _, err := s.RequestBuild(ctx, Template{ID: "t1", Tenant: "a", Name: "app"}, "b1", now); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordBuildResult(ctx, "t1", "b1", []byte(`{"layers":["x"]}`), now); !errors.Is(err, ErrConflict) {
			t.Errorf("a waiting build: %v; want ErrConflict", err)
		}
		if err := s.UpdateBuild(ctx, Build{ID: "b1", TemplateID: "t1", Status: BuildBuilding}, now); err != nil {
			t.Fatal(err)
		}
		for _, r := range []string{`{"layers":["x"]}`, `{"layers":["x","y"]}`} {
			if err := s.RecordBuildResult(ctx, "t1", "b1", []byte(r), now); err != nil {
				t.Fatalf("record %s: %v", r, err)
			}
		}
		b, err := s.GetBuild(ctx, "t1", "b1")
		if err != nil || string(b.Result) != `{"layers":["x","y"]}` || b.Status != BuildBuilding {
			t.Fatalf("after the records: %s %q, %v", b.Status, b.Result, err)
		}
		for _, c := range []struct{ tpl, id string }{{"t1", "nope"}, {"t2", "b1"}} {
			if err := s.RecordBuildResult(ctx, c.tpl, c.id, []byte(`{}`), now); !errors.Is(err, ErrConflict) {
				t.Errorf("build %s of %s: %v; want ErrConflict", c.id, c.tpl, err)
			}
		}
		b.Status = BuildError
		if err := s.UpdateBuild(ctx, b, now); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordBuildResult(ctx, "t1", "b1", []byte(`{}`), now); !errors.Is(err, ErrConflict) {
			t.Errorf("a failed build: %v; want ErrConflict", err)
		}
		if b, _ := s.GetBuild(ctx, "t1", "b1"); string(b.Result) != `{"layers":["x","y"]}` {
			t.Errorf("the failed build's result: %q", b.Result)
		}
	})
}
