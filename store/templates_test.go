package store

import (
	"errors"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

func TestTemplates(t *testing.T) {
	s := openStore(t, "")
	ctx := t.Context()
	mustTenant(t, s, "a")
	mustTenant(t, s, "b")
	now := time.Unix(1700000000, 0).UTC()

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
	if _, err := s.DeleteTemplate(ctx, "b", "t1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("b deletes a's template: %v", err)
	}
	builds, err := s.DeleteTemplate(ctx, "a", "t1")
	if err != nil || len(builds) != 2 {
		t.Fatalf("delete: %d builds, %v", len(builds), err)
	}
	if tags, _ := s.ListTags(ctx, "t1"); len(tags) != 0 {
		t.Errorf("tags outlive their template: %+v", tags)
	}
	if _, err := s.GetBuild(ctx, "t1", "b1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("builds outlive their template: %v", err)
	}
}
