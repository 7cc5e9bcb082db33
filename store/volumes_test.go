package store

import (
	"errors"
	"testing"
	"time"
)

// TestVolumeDeletingMark: a volume marked deleting is hidden from every
// read but the all-tenants list (Prune's), cannot be marked twice, and is
// found again once unmarked.
func TestVolumeDeletingMark(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, s, "acme")
		v := Volume{ID: "v1", Tenant: tn, Name: "data", Token: "tok", SizeMB: 64, CreatedAt: time.Now()}
		if err := s.InsertVolume(ctx, v, VolumeQuota{}); err != nil {
			t.Fatal(err)
		}
		if err := s.MarkVolumeDeleting(ctx, tn, v.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.MarkVolumeDeleting(ctx, tn, v.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("second mark = %v; want ErrNotFound", err)
		}
		reads := map[string]func() error{
			"GetVolume":    func() error { _, err := s.GetVolume(ctx, tn, v.ID); return err },
			"VolumeByID":   func() error { _, err := s.VolumeByID(ctx, v.ID); return err },
			"VolumeByName": func() error { _, err := s.VolumeByName(ctx, tn, v.Name); return err },
		}
		for name, read := range reads {
			if err := read(); !errors.Is(err, ErrNotFound) {
				t.Errorf("%s of a marked volume = %v; want ErrNotFound", name, err)
			}
		}
		if vs, err := s.ListVolumes(ctx, tn); err != nil || len(vs) != 0 {
			t.Errorf("ListVolumes(tenant) = %v, %v; want none", vs, err)
		}
		if vs, err := s.ListVolumes(ctx, ""); err != nil || len(vs) != 1 || !vs[0].Deleting {
			t.Errorf("ListVolumes(all) = %v, %v; want the volume, marked", vs, err)
		}
		if err := s.UnmarkVolumeDeleting(ctx, tn, v.ID); err != nil {
			t.Fatal(err)
		}
		for name, read := range reads {
			if err := read(); err != nil {
				t.Errorf("%s of an unmarked volume = %v", name, err)
			}
		}
		if err := s.DeleteVolume(ctx, tn, v.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.UnmarkVolumeDeleting(ctx, tn, v.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("unmark of a deleted volume = %v; want ErrNotFound", err)
		}
	})
}
