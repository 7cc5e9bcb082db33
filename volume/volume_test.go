package volume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/store/storetest"
	"github.com/sandboxd/sandboxd/tenant"
)

func TestCheckMountPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/mnt/data", true},
		{"/home/user/data", true},
		{"/data", true},
		{"/var/lib/x", true},
		{"/etcetera", true},
		{"", false},
		{"mnt", false},
		{"/", false},
		{"/mnt/../etc", false},
		{"/mnt/", false},
		{"/etc", false},
		{"/etc/ssl", false},
		{"/proc", false},
		{"/proc/self", false},
		{"/sys/fs", false},
		{"/dev", false},
		{"/usr", false},
		{"/usr/local/bin", false},
		{"/bin", false},
		{"/lib64", false},
		{"/run", false},
	} {
		if got := CheckMountPath(tc.path) == ""; got != tc.ok {
			t.Errorf("CheckMountPath(%q) = %q; want ok %v", tc.path, CheckMountPath(tc.path), tc.ok)
		}
	}
}

func TestValidName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"data", true}, {"My_Vol-1", true}, {strings.Repeat("a", 63), true},
		{"", false}, {strings.Repeat("a", 64), false}, {"a b", false}, {"a/b", false}, {"é", false}, {"a.b", false},
	} {
		if got := ValidName(tc.name); got != tc.ok {
			t.Errorf("ValidName(%q) = %v; want %v", tc.name, got, tc.ok)
		}
	}
}

// fakeVolumes keeps volumes as directories, and a set of those in use.
type fakeVolumes struct {
	dir   string
	mu    sync.Mutex
	inUse map[string]bool
	fail  error // CreateVolume's error
	// crashAt, when set, panics in DeleteVolume before the files go
	// ("before") or after ("after"), as if sandboxd died there.
	crashAt string
}

// errCrash is the panic of fakeVolumes.crashAt.
var errCrash = errors.New("crash")

func (f *fakeVolumes) CreateVolume(_ context.Context, id string, _ int) error {
	if f.fail != nil {
		return f.fail
	}
	return os.Mkdir(filepath.Join(f.dir, id), 0o755)
}

func (f *fakeVolumes) DeleteVolume(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inUse[id] {
		return fmt.Errorf("delete volume %s: %w", id, runtime.ErrInUse)
	}
	if f.crashAt == "before" {
		panic(errCrash)
	}
	err := os.RemoveAll(filepath.Join(f.dir, id))
	if f.crashAt == "after" {
		panic(errCrash)
	}
	return err
}

func (f *fakeVolumes) OpenVolume(_ context.Context, id string) (*os.Root, error) {
	return os.OpenRoot(filepath.Join(f.dir, id))
}

func (f *fakeVolumes) Volumes(context.Context) ([]string, error) {
	ents, err := os.ReadDir(f.dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, err
}

func (f *fakeVolumes) has(id string) bool {
	_, err := os.Stat(filepath.Join(f.dir, id))
	return err == nil
}

func newService(t *testing.T, budget tenant.VolumeBudget) (*Service, *fakeVolumes, *store.Store) {
	t.Helper()
	st, _ := storetest.Open(t)
	for _, name := range []string{"a", "b"} {
		if _, err := st.EnsureTenant(t.Context(), name); err != nil {
			t.Fatal(err)
		}
	}
	fv := &fakeVolumes{dir: t.TempDir(), inUse: map[string]bool{}}
	return New(st, fv, func(tenant.ID) tenant.VolumeBudget { return budget }, slog.New(slog.DiscardHandler)), fv, st
}

func as(t tenant.ID) context.Context { return tenant.WithContext(context.Background(), t) }

func TestCreateQuotaAndNames(t *testing.T) {
	s, fv, _ := newService(t, tenant.VolumeBudget{Max: 2, MaxMB: 3000, SizeMB: 1024})
	v, err := s.Create(as("a"), "one")
	if err != nil {
		t.Fatal(err)
	}
	if !fv.has(v.ID) || v.SizeMB != 1024 || !strings.HasPrefix(v.Token, "e2bv_") || len(v.ID) != 36 {
		t.Errorf("Create = %+v; want a backend volume, 1024 MiB, a token, a UUID", v)
	}
	for _, tc := range []struct {
		name, tenant, vol string
		kind              error
	}{
		{"taken name", "a", "one", errdefs.ErrInvalidArgument},
		{"same name, other tenant", "b", "one", nil},
		{"bad name", "a", "no/slash", errdefs.ErrInvalidArgument},
		{"second", "a", "two", nil},
		{"count quota", "a", "three", errdefs.ErrInvalidArgument},
	} {
		_, err := s.Create(as(tenant.ID(tc.tenant)), tc.vol)
		if (tc.kind == nil) != (err == nil) || (tc.kind != nil && !errors.Is(err, tc.kind)) {
			t.Errorf("%s: Create(%s, %q) = %v; want %v", tc.name, tc.tenant, tc.vol, err, tc.kind)
		}
	}
	if n, _ := fv.Volumes(t.Context()); len(n) != 3 {
		t.Errorf("backend holds %d volumes; want 3 (refused creates leave nothing)", len(n))
	}
	// The size quota: 1024 + 1024 + 1024 > 3000.
	s2, _, _ := newService(t, tenant.VolumeBudget{MaxMB: 3000, SizeMB: 1024})
	for i := range 3 {
		_, err := s2.Create(as("a"), fmt.Sprint("v", i))
		if want := i < 2; (err == nil) != want {
			t.Errorf("Create #%d under a 3000 MiB quota = %v; want ok %v", i, err, want)
		}
	}
	// A failing backend leaves no record.
	fv.fail = fmt.Errorf("mkfs: %w", runtime.ErrUnavailable)
	if _, err := s.Create(as("b"), "broken"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Create(failing backend) = %v; want unavailable", err)
	}
	if vs, _ := s.List(as("b")); len(vs) != 1 {
		t.Errorf("tenant b has %d volumes; want 1", len(vs))
	}
}

func TestTenantIsolationAndDelete(t *testing.T) {
	s, fv, _ := newService(t, tenant.VolumeBudget{SizeMB: 64})
	v, err := s.Create(as("a"), "mine")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(as("b"), v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(other tenant) = %v; want not found", err)
	}
	if err := s.Delete(as("b"), v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Delete(other tenant) = %v; want not found", err)
	}
	if vs, _ := s.List(as("b")); len(vs) != 0 {
		t.Errorf("List(other tenant) = %v; want none", vs)
	}
	if _, err := s.Mounts(as("b"), []MountRequest{{Name: "mine", Path: "/mnt"}}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "not found") {
		t.Errorf("Mounts(other tenant's volume) = %v; want 400 not found", err)
	}
	fv.inUse[v.ID] = true
	if err := s.Delete(as("a"), v.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Delete(mounted) = %v; want conflict", err)
	}
	fv.inUse[v.ID] = false
	if err := s.Delete(as("a"), v.ID); err != nil {
		t.Fatal(err)
	}
	if fv.has(v.ID) {
		t.Error("Delete left the backend's volume")
	}
	if _, err := s.Get(as("a"), v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(deleted) = %v; want not found", err)
	}
}

func TestMounts(t *testing.T) {
	s, _, _ := newService(t, tenant.VolumeBudget{SizeMB: 64})
	v, err := s.Create(as("a"), "data")
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Mounts(as("a"), []MountRequest{{Name: "data", Path: "/mnt/a"}, {Name: "data", Path: "/mnt/b"}})
	want := []store.SandboxVolume{{VolumeID: v.ID, Name: "data", Path: "/mnt/a"}, {VolumeID: v.ID, Name: "data", Path: "/mnt/b"}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Mounts = %v, %v; want %v", got, err, want)
	}
	_, err = s.Mounts(as("a"), []MountRequest{{Name: "data", Path: "/etc"}, {Name: "data", Path: "/x"}, {Name: "data", Path: "/x"}, {Name: "nope", Path: "/y"}})
	for _, part := range []string{"#0: path '/etc' is a system path", "#2: path '/x' is already used", "#3: volume 'nope' not found"} {
		if err == nil || !strings.Contains(err.Error(), part) {
			t.Errorf("Mounts(bad) = %v; want it to say %q", err, part)
		}
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Mounts(bad) kind = %v; want invalid argument", err)
	}
}

func TestAuthenticateAndOpen(t *testing.T) {
	s, _, _ := newService(t, tenant.VolumeBudget{SizeMB: 64})
	v, err := s.Create(as("a"), "data")
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(as("a"), "other")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, id, token string
		ok              bool
	}{
		{"right", v.ID, v.Token, true},
		{"empty", v.ID, "", false},
		{"wrong", v.ID, v.Token + "x", false},
		{"another volume's", v.ID, w.Token, false},
		{"unknown volume", "nope", v.Token, false},
	} {
		_, err := s.Authenticate(t.Context(), tc.id, tc.token)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errdefs.ErrUnauthenticated)) {
			t.Errorf("%s: Authenticate = %v; want ok %v (else unauthenticated)", tc.name, err, tc.ok)
		}
	}
	// Open needs the context of an authenticated request for that volume.
	if _, err := s.Open(t.Context(), v.ID); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Open(unauthenticated) = %v; want unauthenticated", err)
	}
	if _, err := s.Open(WithAuthorized(t.Context(), w.ID), v.ID); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Open(another volume's token) = %v; want unauthenticated", err)
	}
	root, err := s.Open(WithAuthorized(t.Context(), v.ID), v.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := WriteFile(root, "/f", strings.NewReader("x"), Owner{}, false); err != nil {
		t.Fatal(err)
	}
	f, _, err := OpenFile(root, "/f")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "x" {
		t.Errorf("read back %q; want x", b)
	}
}

func TestPrune(t *testing.T) {
	s, fv, _ := newService(t, tenant.VolumeBudget{SizeMB: 64})
	v, err := s.Create(as("a"), "kept")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(fv.dir, "orphan"), 0o755); err != nil { // a crash between backend and record
		t.Fatal(err)
	}
	if err := s.Prune(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !fv.has(v.ID) || fv.has("orphan") {
		t.Errorf("after Prune: kept %v, orphan %v; want true, false", fv.has(v.ID), fv.has("orphan"))
	}
}

func TestNoBackend(t *testing.T) {
	s := New(nil, nil, nil, slog.New(slog.DiscardHandler))
	if _, err := s.Create(as("a"), "x"); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("Create without a VolumeStore = %v; want not implemented", err)
	}
	if _, err := s.Authenticate(t.Context(), "x", "y"); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("Authenticate without a VolumeStore = %v; want not implemented", err)
	}
}

// TestDeleteCrash: sandboxd dies inside a volume delete, before or after the
// backend removed the files. The next start (a new Service on the same
// store and backend, then Prune) converges: no listed volume without files,
// no files without a record, and the interrupted delete is finished. A
// volume hidden by the crash but mounted by then is listed again.
func TestDeleteCrash(t *testing.T) {
	for _, tc := range []struct {
		crashAt   string
		inUse     bool // a sandbox mounts it when sandboxd starts again
		wantGone  bool
		wantFiles bool
	}{
		{crashAt: "before", wantGone: true},
		{crashAt: "after", wantGone: true},
		{crashAt: "before", inUse: true, wantFiles: true},
	} {
		t.Run(fmt.Sprintf("%s/in use %v", tc.crashAt, tc.inUse), func(t *testing.T) {
			s, fv, st := newService(t, tenant.VolumeBudget{SizeMB: 64})
			v, err := s.Create(as("a"), "doomed")
			if err != nil {
				t.Fatal(err)
			}
			other, err := s.Create(as("a"), "other")
			if err != nil {
				t.Fatal(err)
			}
			fv.crashAt = tc.crashAt
			func() {
				defer func() {
					if r := recover(); r != errCrash {
						t.Fatalf("Delete did not reach the crash point: %v", r)
					}
				}()
				_ = s.Delete(as("a"), v.ID)
			}()
			fv.crashAt = ""
			if _, err := s.Get(as("a"), v.ID); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("Get after the crash = %v; want not found (the delete had begun)", err)
			}

			fv.inUse[v.ID] = tc.inUse
			s = New(st, fv, s.budget, slog.New(slog.DiscardHandler)) // the next start
			if err := s.Prune(t.Context()); err != nil {
				t.Fatal(err)
			}
			checkConverged(t, st, fv)
			_, err = s.Get(as("a"), v.ID)
			if gone := errors.Is(err, errdefs.ErrNotFound); gone != tc.wantGone {
				t.Errorf("Get after Prune = %v; want gone %v", err, tc.wantGone)
			}
			if fv.has(v.ID) != tc.wantFiles {
				t.Errorf("files after Prune: %v; want %v", fv.has(v.ID), tc.wantFiles)
			}
			if _, err := s.Get(as("a"), other.ID); err != nil || !fv.has(other.ID) {
				t.Errorf("the other volume after Prune: %v, files %v; want kept", err, fv.has(other.ID))
			}
		})
	}
}

// TestDeleteRefusedStaysListed: a delete the backend refuses (mounted)
// leaves the volume listed and usable, not hidden by its mark.
func TestDeleteRefusedStaysListed(t *testing.T) {
	s, fv, st := newService(t, tenant.VolumeBudget{SizeMB: 64})
	v, err := s.Create(as("a"), "mounted")
	if err != nil {
		t.Fatal(err)
	}
	fv.inUse[v.ID] = true
	if err := s.Delete(as("a"), v.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Delete(mounted) = %v; want conflict", err)
	}
	if vs, err := s.List(as("a")); err != nil || len(vs) != 1 {
		t.Errorf("List after a refused delete = %v, %v; want the volume", vs, err)
	}
	if _, err := s.Mounts(as("a"), []MountRequest{{Name: "mounted", Path: "/mnt"}}); err != nil {
		t.Errorf("Mounts after a refused delete = %v", err)
	}
	checkConverged(t, st, fv)
}

// checkConverged fails unless every record has its files and every
// backend volume its record, with no delete left half done.
func checkConverged(t *testing.T, st *store.Store, fv *fakeVolumes) {
	t.Helper()
	recs, err := st.ListVolumes(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, r := range recs {
		known[r.ID] = true
		if r.Deleting {
			t.Errorf("volume %s is still marked deleting", r.ID)
		}
		if !fv.has(r.ID) {
			t.Errorf("volume %s (%s) has a record but no files", r.ID, r.Name)
		}
	}
	have, err := fv.Volumes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range have {
		if !known[id] {
			t.Errorf("volume %s has files but no record", id)
		}
	}
}
