package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/tenant"
)

// openStore opens a store in dir (a fresh temp dir if empty) and closes it
// when the test ends.
func openStore(t testing.TB, dir string) *Store {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s, err := Open(t.Context(), dir)
	if err != nil {
		t.Fatalf("Open(%s) = %v", dir, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	return s
}

// mustTenant creates tenant name in s.
func mustTenant(t testing.TB, s *Store, name string) tenant.ID {
	t.Helper()
	tn, err := s.CreateTenant(t.Context(), name)
	if err != nil {
		t.Fatalf("CreateTenant(%q) = %v", name, err)
	}
	return tn.ID
}

// base is a fixed start time for test sandboxes.
var base = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// newSandbox returns a valid running sandbox of tenant tn started at base+i s.
func newSandbox(id string, tn tenant.ID, i int) *Sandbox {
	started := base.Add(time.Duration(i) * time.Second)
	return &Sandbox{
		ID:        id,
		Tenant:    tn,
		Template:  "base",
		State:     StateRunning,
		StartedAt: started,
		EndAt:     started.Add(5 * time.Minute),
		CPUCount:  2,
		MemoryMB:  512,
		DiskMB:    1024,
		Backend:   "local",
		Handle:    "h-" + id,
	}
}

func TestOpenTwiceIsIdempotent(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ms, err := migrations(db.dialect)
		if err != nil {
			t.Fatalf("migrations() = %v", err)
		}
		for i := range 3 {
			s, err := db.open(t.Context())
			if err != nil {
				t.Fatalf("Open #%d = %v", i+1, err)
			}
			v, err := s.SchemaVersion(t.Context())
			if err != nil || v != lastVersion(ms) {
				t.Errorf("Open #%d: SchemaVersion() = %d, %v; want %d, nil", i+1, v, err, lastVersion(ms))
			}
			var applied int
			if err := s.r.QueryRow(`SELECT COUNT(*) FROM schema_migrations`).Scan(&applied); err != nil || applied != len(ms) {
				t.Errorf("Open #%d: %d migration rows, %v; want %d", i+1, applied, err, len(ms))
			}
			var mode string
			if db.dialect != sqliteDialect {
				// no journal mode to check
			} else if err := s.r.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
				t.Errorf("Open #%d: journal_mode = %q, %v; want wal", i+1, mode, err)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close #%d = %v", i+1, err)
			}
		}
	})
}

func TestOpenConcurrentFirstOpen(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		// Several processes (here: handles) opening a new database at once must
		// each see the schema applied exactly once.
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				s, err := db.open(context.Background())
				if err == nil {
					err = s.Close()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Open #%d = %v", i, err)
			}
		}
	})
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		if _, err := s.w.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'future', 0)`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.open(t.Context()); err == nil {
			t.Errorf("Open() of a database from a newer sandboxd = nil; want an error")
		}
	})
}

func TestOpenFileMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "data?#dir")
	s := openStore(t, dir)
	want := filepath.Join(dir, FileName)
	if s.Path() != want {
		t.Errorf("Path() = %q; want %q", s.Path(), want)
	}
	fi, err := os.Stat(want)
	if err != nil {
		t.Fatalf("database file: %v", err)
	}
	if m := fi.Mode().Perm(); m != 0o600 {
		t.Errorf("database mode = %o; want 600", m)
	}
}

func TestOpenEmptyDir(t *testing.T) {
	if _, err := Open(t.Context(), ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("Open(\"\") = %v; want ErrInvalid", err)
	}
}

func TestReopenKeepsData(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := t.Context()
		s, err := db.open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tn := mustTenant(t, s, "acme")
		key, _, err := s.CreateKey(ctx, tn)
		if err != nil {
			t.Fatal(err)
		}
		sb := newSandbox("sbx1", tn, 0)
		sb.Metadata = map[string]string{"k": "v"}
		if err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}

		s = db.store(t)
		if got, err := s.LookupKey(ctx, key); err != nil || got != tn {
			t.Errorf("after reopen: LookupKey() = %q, %v; want %q, nil", got, err, tn)
		}
		got, err := s.GetSandbox(ctx, tn, "sbx1")
		if err != nil {
			t.Fatalf("after reopen: GetSandbox() = %v", err)
		}
		if got.Metadata["k"] != "v" || got.Generation != 1 || !got.StartedAt.Equal(sb.StartedAt) {
			t.Errorf("after reopen: GetSandbox() = %+v; want %+v", got, sb)
		}
	})
}

// TestTwoHandlesConcurrentWrites simulates a server and CLI commands on the
// same data dir: two Stores write and read at once and none may fail with
// "database is locked".
func TestTwoHandlesConcurrentWrites(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		server, cli := db.store(t), db.store(t)
		ctx := t.Context()
		tn := mustTenant(t, server, "acme")

		const workers, perWorker = 4, 40
		var wg sync.WaitGroup
		errc := make(chan error, 2*workers*perWorker)
		for h, s := range []*Store{server, cli} {
			for w := range workers {
				wg.Go(func() {
					for i := range perWorker {
						id := fmt.Sprintf("h%dw%di%d", h, w, i)
						sb := newSandbox(id, tn, i)
						if err := s.InsertSandbox(ctx, sb); err != nil {
							errc <- err
							continue
						}
						sb.State = StatePaused
						if err := s.UpdateSandbox(ctx, sb); err != nil {
							errc <- err
						}
						if _, err := s.UpdateTenantSettings(ctx, tn, func(st *tenant.Settings) {
							st.MinWarm = tenant.Of(i)
						}); err != nil {
							errc <- err
						}
						if _, err := s.CountLive(ctx, tn); err != nil {
							errc <- err
						}
					}
				})
			}
			// The CLI side also mints keys meanwhile.
			wg.Go(func() {
				for range perWorker {
					if _, _, err := s.CreateKey(ctx, tn); err != nil {
						errc <- err
					}
				}
			})
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Errorf("concurrent write: %v", err)
		}
		if n, err := cli.CountLive(ctx, tn); err != nil || n != 2*workers*perWorker {
			t.Errorf("CountLive() = %d, %v; want %d", n, err, 2*workers*perWorker)
		}
	})
}

// childEnv names the data dir a child process writes to in
// TestCrossProcessWrites; the helper test does nothing without it.
const childEnv = "SANDBOXD_STORE_TEST_CHILD_DIR"

// TestCrossProcessWrites runs writers in separate processes (the test binary
// re-executed) against one database, while this process writes too.
func TestCrossProcessWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	s := openStore(t, dir)
	tn := mustTenant(t, s, "acme")

	const children, perProc = 3, 30
	var (
		cmds []*exec.Cmd
		outs []*bytes.Buffer
	)
	for c := range children {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperChildWriter$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+dir, "CHILD_INDEX="+strconv.Itoa(c))
		out := new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = out, out
		outs = append(outs, out)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i := range perProc {
		if err := s.InsertSandbox(t.Context(), newSandbox(fmt.Sprintf("parent%d", i), tn, i)); err != nil {
			t.Errorf("parent insert: %v", err)
		}
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child %d: %v\n%s", i, err, outs[i])
		}
	}
	if n, err := s.CountLive(t.Context(), tn); err != nil || n != (children+1)*perProc {
		t.Errorf("CountLive() = %d, %v; want %d", n, err, (children+1)*perProc)
	}
}

// TestHelperChildWriter is the child of TestCrossProcessWrites.
func TestHelperChildWriter(t *testing.T) {
	dir := os.Getenv(childEnv)
	if dir == "" {
		t.Skip("only run as a child of TestCrossProcessWrites")
	}
	s := openStore(t, dir)
	for i := range 30 {
		sb := newSandbox(fmt.Sprintf("c%sn%d", os.Getenv("CHILD_INDEX"), i), "acme", i)
		if err := s.InsertSandbox(t.Context(), sb); err != nil {
			t.Fatalf("child insert: %v", err)
		}
		sb.State = StatePaused
		if err := s.UpdateSandbox(t.Context(), sb); err != nil {
			t.Fatalf("child update: %v", err)
		}
	}
}

func TestErrorsAreErrdefsKinds(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s := db.store(t)
		mustTenant(t, s, "acme")
		_, errNotFound := s.GetSandboxAny(t.Context(), "nope")
		_, errConflict := s.CreateTenant(t.Context(), "acme")
		_, errInvalid := s.CreateTenant(t.Context(), "-")
		for _, tt := range []struct {
			err  error
			kind error
		}{
			{errNotFound, errdefs.ErrNotFound},
			{errConflict, errdefs.ErrConflict},
			{errInvalid, errdefs.ErrInvalidArgument},
		} {
			if !errors.Is(tt.err, tt.kind) {
				t.Errorf("errors.Is(%v, %v) = false; want true", tt.err, tt.kind)
			}
		}
	})
}

func TestVolumesRecord(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s, err := db.open(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		for _, n := range []string{"a", "b"} {
			if _, err := s.EnsureTenant(t.Context(), n); err != nil {
				t.Fatal(err)
			}
		}
		v := Volume{ID: "v1", Tenant: "a", Name: "data", Token: "tok", SizeMB: 100, CreatedAt: time.Now().UTC()}
		if err := s.InsertVolume(t.Context(), v, VolumeQuota{Max: 1}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			v    Volume
			q    VolumeQuota
			want error
		}{
			{"count", Volume{ID: "v2", Tenant: "a", Name: "x", SizeMB: 1}, VolumeQuota{Max: 1}, ErrQuota},
			{"size", Volume{ID: "v2", Tenant: "a", Name: "x", SizeMB: 101}, VolumeQuota{MaxMB: 200}, ErrQuota},
			{"name", Volume{ID: "v2", Tenant: "a", Name: "data", SizeMB: 1}, VolumeQuota{}, ErrConflict},
			{"unknown tenant", Volume{ID: "v2", Tenant: "zz", Name: "x", SizeMB: 1}, VolumeQuota{}, ErrNotFound},
			{"other tenant, same name", Volume{ID: "v3", Tenant: "b", Name: "data", SizeMB: 1}, VolumeQuota{Max: 1}, nil},
		} {
			err := s.InsertVolume(t.Context(), tc.v, tc.q)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("%s: InsertVolume = %v; want %v", tc.name, err, tc.want)
			}
		}
		if got, err := s.GetVolume(t.Context(), "a", "v1"); err != nil || got.Token != "tok" || got.SizeMB != 100 {
			t.Errorf("GetVolume = %+v, %v", got, err)
		}
		if _, err := s.GetVolume(t.Context(), "b", "v1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("GetVolume(other tenant) = %v; want not found", err)
		}
		if err := s.DeleteVolume(t.Context(), "b", "v1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("DeleteVolume(other tenant) = %v; want not found", err)
		}
		if err := s.DeleteVolume(t.Context(), "a", "v1"); err != nil {
			t.Fatal(err)
		}
		if vs, err := s.ListVolumes(t.Context(), ""); err != nil || len(vs) != 1 || vs[0].ID != "v3" {
			t.Errorf("ListVolumes(all) = %v, %v; want v3 only", vs, err)
		}
	})
}

func TestSandboxVolumes(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		s, err := db.open(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if _, err := s.EnsureTenant(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
		if err := s.InsertSandbox(t.Context(), newSandbox("sb1", "a", 0)); err != nil {
			t.Fatal(err)
		}
		want := []SandboxVolume{{VolumeID: "v1", Name: "data", Path: "/a"}, {VolumeID: "v1", Name: "data", Path: "/b"}}
		if err := s.SetSandboxVolumes(t.Context(), "sb1", want); err != nil {
			t.Fatal(err)
		}
		if got, err := s.SandboxVolumes(t.Context(), "sb1"); err != nil || !slices.Equal(got, want) {
			t.Errorf("SandboxVolumes = %v, %v; want %v", got, err, want)
		}
		if err := s.SetSandboxVolumes(t.Context(), "nope", want); err == nil {
			t.Error("SetSandboxVolumes(unknown sandbox) = nil; want a foreign key error")
		}
		if err := s.DeleteSandbox(t.Context(), "sb1"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.SandboxVolumes(t.Context(), "sb1"); err != nil || len(got) != 0 {
			t.Errorf("after the sandbox's delete: %v, %v; want none", got, err)
		}
	})
}

// TestTwoStoresConflictingWrites: two Stores on one database (two sandboxd
// sharing state) see each other's writes, and their concurrent
// read-then-write transactions stay atomic: no lost update of a tenant's
// settings, one winner per sandbox generation, a volume quota never
// exceeded. On PostgreSQL, under READ COMMITTED, that is the advisory
// lock's doing.
func TestTwoStoresConflictingWrites(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db testDB) {
		ctx := t.Context()
		a, b := db.store(t), db.store(t)
		stores := []*Store{a, b}

		tn := mustTenant(t, a, "acme")
		if got, err := b.GetTenant(ctx, tn); err != nil || got.ID != tn {
			t.Fatalf("the other store's GetTenant() = %+v, %v", got, err)
		}
		if err := b.InsertSandbox(ctx, newSandbox("sb1", tn, 0)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.GetSandbox(ctx, tn, "sb1"); err != nil {
			t.Fatalf("the other store's GetSandbox() = %v", err)
		}

		const workers, perWorker = 4, 10
		var wg sync.WaitGroup
		// Increments of one setting, each a read and a write.
		for _, s := range stores {
			for range workers {
				wg.Go(func() {
					for range perWorker {
						if _, err := s.UpdateTenantSettings(ctx, tn, func(st *tenant.Settings) {
							n, _ := st.MinWarm.Get()
							st.MinWarm = tenant.Of(n + 1)
						}); err != nil {
							t.Errorf("UpdateTenantSettings: %v", err)
						}
					}
				})
			}
		}
		wg.Wait()
		if got, err := b.GetTenant(ctx, tn); err != nil || got.Settings.MinWarm != tenant.Of(2*workers*perWorker) {
			t.Errorf("after concurrent increments: MinWarm = %v, %v; want %d", got.Settings.MinWarm, err, 2*workers*perWorker)
		}

		// Both stores update the sandbox from the generation they read:
		// one wins each round, the other is ErrConflict.
		for round := range 20 {
			cur, err := a.GetSandbox(ctx, tn, "sb1")
			if err != nil {
				t.Fatal(err)
			}
			errs := make([]error, len(stores))
			for i, s := range stores {
				wg.Go(func() {
					sb := cur
					sb.Handle = fmt.Sprintf("h%d-%d", round, i)
					errs[i] = s.UpdateSandbox(ctx, &sb)
				})
			}
			wg.Wait()
			won := 0
			for _, err := range errs {
				switch {
				case err == nil:
					won++
				case !errors.Is(err, ErrConflict):
					t.Errorf("round %d: UpdateSandbox() = %v; want nil or ErrConflict", round, err)
				}
			}
			got, err := b.GetSandbox(ctx, tn, "sb1")
			if won != 1 || err != nil || got.Generation != cur.Generation+1 {
				t.Fatalf("round %d: %d winners, generation %d, %v; want 1, %d", round, won, got.Generation, err, cur.Generation+1)
			}
		}

		// Concurrent creates against a quota of 5 volumes.
		const quota = 5
		var (
			mu      sync.Mutex
			created int
		)
		for h, s := range stores {
			for w := range workers {
				wg.Go(func() {
					id := fmt.Sprintf("v%d%d", h, w)
					err := s.InsertVolume(ctx, Volume{ID: id, Tenant: tn, Name: id, SizeMB: 1, CreatedAt: time.Now()}, VolumeQuota{Max: quota})
					switch {
					case err == nil:
						mu.Lock()
						created++
						mu.Unlock()
					case !errors.Is(err, ErrQuota):
						t.Errorf("InsertVolume(%s) = %v; want nil or ErrQuota", id, err)
					}
				})
			}
		}
		wg.Wait()
		if vs, err := a.ListVolumes(ctx, tn); created != quota || err != nil || len(vs) != quota {
			t.Errorf("%d creates succeeded, %d volumes listed (%v); want %d", created, len(vs), err, quota)
		}
	})
}
