// Package volume is the control plane of E2B's volumes: per-tenant records
// in the store, quotas, tokens, the validation of sandbox mounts, and the
// content API's file operations. The files live in the backend
// (runtime.VolumeStore); the server's handlers call this package only.
package volume

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/internal/faultinject"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// Defaults of the per-tenant volume settings (sandboxd serve flags
// --max-volumes, --max-volumes-mb, --volume-size-mb).
const (
	DefaultMax    = 20
	DefaultMaxMB  = 20 << 10
	DefaultSizeMB = 1 << 10
	// MaxMounts bounds the volumes of one sandbox.
	MaxMounts = 16
)

// Service manages volumes for the tenant in each call's context.
type Service struct {
	store   *store.Store
	backend runtime.VolumeStore // nil: the backend keeps no volumes (501)
	budget  func(tenant.ID) tenant.VolumeBudget
	log     *slog.Logger
}

// New returns a Service. backend may be nil; budget gives a tenant's
// settings in effect.
func New(st *store.Store, backend runtime.VolumeStore, budget func(tenant.ID) tenant.VolumeBudget, log *slog.Logger) *Service {
	return &Service{store: st, backend: backend, budget: budget, log: log}
}

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9_-]{1,63}$`) })

// ValidName reports whether name can name a volume: E2B's pattern
// `^[a-zA-Z0-9_-]+$`, at most 63 characters.
func ValidName(name string) bool { return nameRE().MatchString(name) }

func (s *Service) ready(ctx context.Context) (tenant.ID, error) {
	t, ok := tenant.FromContext(ctx)
	if !ok {
		return "", errdefs.New(errdefs.ErrUnauthenticated, "no tenant")
	}
	if s == nil || s.backend == nil {
		return "", errdefs.New(errdefs.ErrNotImplemented, "volumes are not supported by this backend")
	}
	return t, nil
}

// newID returns a volume id in E2B's format, a random UUID.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func newToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "e2bv_" + hex.EncodeToString(b[:])
}

// Create makes a volume called name: the backend's files, then the record
// (in the tenant's quota). A failed record removes the files again.
func (s *Service) Create(ctx context.Context, name string) (store.Volume, error) {
	t, err := s.ready(ctx)
	if err != nil {
		return store.Volume{}, err
	}
	if !ValidName(name) {
		return store.Volume{}, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("invalid volume name %q: want 1 to 63 of a-z, A-Z, 0-9, '_' and '-'", name))
	}
	b := s.budget(t)
	v := store.Volume{ID: newID(), Tenant: t, Name: name, Token: newToken(), SizeMB: b.SizeMB, CreatedAt: time.Now().UTC()}
	if v.SizeMB <= 0 {
		v.SizeMB = DefaultSizeMB
	}
	q := store.VolumeQuota{Max: b.Max, MaxMB: b.MaxMB}
	// Check the quota and the name before the (slower) backend work; the
	// insert checks both again in its transaction.
	if err := s.precheck(ctx, v, q); err != nil {
		return store.Volume{}, err
	}
	if err := s.backend.CreateVolume(ctx, v.ID, v.SizeMB); err != nil {
		return store.Volume{}, fmt.Errorf("create volume %s: %w", name, backendErr(err))
	}
	faultinject.Pause("volume-create-unrecorded", v.ID)
	if err := s.store.InsertVolume(ctx, v, q); err != nil {
		if derr := s.backend.DeleteVolume(context.WithoutCancel(ctx), v.ID); derr != nil {
			s.log.Error("revert create volume", "tenant", t, "volume_id", v.ID, "err", derr)
		}
		return store.Volume{}, clientErr(err, name)
	}
	faultinject.Pause("volume-create-recorded", v.ID)
	s.log.Info("volume created", "audit", true, "tenant", t, "volume_id", v.ID, "volume_name", name, "size_mb", v.SizeMB)
	return v, nil
}

func (s *Service) precheck(ctx context.Context, v store.Volume, q store.VolumeQuota) error {
	vs, err := s.store.ListVolumes(ctx, v.Tenant)
	if err != nil {
		return err
	}
	total := 0
	for _, o := range vs {
		if o.Name == v.Name {
			return clientErr(store.ErrConflict, v.Name)
		}
		total += o.SizeMB
	}
	if q.Max > 0 && len(vs)+1 > q.Max {
		return clientErr(fmt.Errorf("%w: the tenant has %d of %d volumes", store.ErrQuota, len(vs), q.Max), v.Name)
	}
	if q.MaxMB > 0 && total+v.SizeMB > q.MaxMB {
		return clientErr(fmt.Errorf("%w: the tenant's volumes would total %d MiB, above its limit of %d MiB", store.ErrQuota, total+v.SizeMB, q.MaxMB), v.Name)
	}
	return nil
}

// clientErr turns the store's refusals into E2B's answers: a taken name is
// 400 as on E2B, and so is a quota (E2B has none; 429 would make the
// Python SDK retry).
func clientErr(err error, name string) error {
	switch {
	case errors.Is(err, store.ErrConflict):
		return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("Volume with name '%s' already exists", name))
	case errors.Is(err, store.ErrQuota):
		return errdefs.New(errdefs.ErrInvalidArgument, "volume quota exceeded: "+strings.TrimPrefix(err.Error(), store.ErrQuota.Error()+": "))
	}
	return err
}

// backendErr gives a backend failure its kind.
func backendErr(err error) error {
	switch {
	case errors.Is(err, runtime.ErrNotFound):
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case errors.Is(err, runtime.ErrInUse):
		return errdefs.New(errdefs.ErrConflict, err.Error())
	case errors.Is(err, runtime.ErrInvalidSpec):
		return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	case errors.Is(err, runtime.ErrAlreadyExists):
		return fmt.Errorf("%w: %w", errdefs.ErrConflict, err)
	case errors.Is(err, runtime.ErrUnsupported):
		return errdefs.New(errdefs.ErrNotImplemented, err.Error())
	}
	return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
}

// List returns the tenant's volumes.
func (s *Service) List(ctx context.Context) ([]store.Volume, error) {
	t, err := s.ready(ctx)
	if err != nil {
		return nil, err
	}
	return s.store.ListVolumes(ctx, t)
}

// Get returns the tenant's volume id; another tenant's is not found.
func (s *Service) Get(ctx context.Context, id string) (store.Volume, error) {
	t, err := s.ready(ctx)
	if err != nil {
		return store.Volume{}, err
	}
	v, err := s.store.GetVolume(ctx, t, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Volume{}, errdefs.New(errdefs.ErrNotFound, "Volume not found")
	}
	return v, err
}

// Delete removes the tenant's volume id and its files. A volume mounted by
// a live sandbox (running or paused) is refused with 409: its sandboxes
// would lose their files under them, and a paused one could not resume.
//
// Three steps, so that a crash between any two leaves what Prune finishes
// at the next start: the record is marked (hidden from now on), the files
// go, then the record. The files never go before the mark, so no listed
// volume is left without files.
func (s *Service) Delete(ctx context.Context, id string) error {
	v, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	if err := s.store.MarkVolumeDeleting(ctx, v.Tenant, v.ID); err != nil {
		if errors.Is(err, store.ErrNotFound) { // a concurrent delete has it
			return errdefs.New(errdefs.ErrNotFound, "Volume not found")
		}
		return err
	}
	// Not the caller's ctx from here: a client that goes away must not
	// leave the record hidden with its files still there.
	cctx := context.WithoutCancel(ctx)
	faultinject.Pause("volume-delete-marked", v.ID)
	if err := s.backend.DeleteVolume(cctx, v.ID); err != nil {
		if uerr := s.store.UnmarkVolumeDeleting(cctx, v.Tenant, v.ID); uerr != nil {
			// Still hidden: the next start's Prune retries the delete,
			// and lists it again if the backend still refuses.
			err = fmt.Errorf("%w (and listing it again: %w)", err, uerr)
		}
		return fmt.Errorf("delete volume %s: %w", v.Name, backendErr(err))
	}
	if err := s.store.DeleteVolume(cctx, v.Tenant, v.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		// The files are gone and the record hidden; Prune removes it.
		return err
	}
	s.log.Info("volume deleted", "audit", true, "tenant", v.Tenant, "volume_id", v.ID, "volume_name", v.Name)
	return nil
}

// MountRequest is one entry of E2B's volumeMounts.
type MountRequest struct{ Name, Path string }

// systemPaths may not be mounted over, nor anything under them: the
// sandbox's system and kernel interfaces, and envd's own.
var systemPaths = []string{"/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/run"}

// CheckMountPath says why p cannot be a mount point ("" if it can).
func CheckMountPath(p string) string {
	switch {
	case p == "":
		return "path cannot be empty"
	case !strings.HasPrefix(p, "/"):
		return "path must be absolute"
	case path.Clean(p) != p:
		return "path must not contain any '.' or '..' components"
	case p == "/":
		return "path must not be the root directory"
	case strings.ContainsRune(p, 0) || len(p) > 1024:
		return "path is not valid"
	}
	for _, sp := range systemPaths {
		if p == sp || strings.HasPrefix(p, sp+"/") {
			return fmt.Sprintf("path '%s' is a system path (%s)", p, sp)
		}
	}
	return ""
}

// Mounts resolves E2B's volumeMounts for the tenant in ctx, checking every
// entry; all failures are reported at once, in E2B's words.
func (s *Service) Mounts(ctx context.Context, reqs []MountRequest) ([]store.SandboxVolume, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	t, err := s.ready(ctx)
	if err != nil {
		return nil, err
	}
	if len(reqs) > MaxMounts {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("invalid mounts: at most %d volume mounts per sandbox", MaxMounts))
	}
	var bad []string
	used := map[string]bool{}
	var out []store.SandboxVolume
	for i, r := range reqs {
		if reason := CheckMountPath(r.Path); reason != "" {
			bad = append(bad, fmt.Sprintf("\t- volume mount #%d: %s", i, reason))
			continue
		}
		if used[r.Path] {
			bad = append(bad, fmt.Sprintf("\t- volume mount #%d: path '%s' is already used", i, r.Path))
			continue
		}
		used[r.Path] = true
		v, err := s.store.VolumeByName(ctx, t, r.Name)
		if errors.Is(err, store.ErrNotFound) {
			bad = append(bad, fmt.Sprintf("\t- volume mount #%d: volume '%s' not found", i, r.Name))
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, store.SandboxVolume{VolumeID: v.ID, Name: v.Name, Path: r.Path})
	}
	if len(bad) > 0 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid mounts:\n"+strings.Join(bad, "\n"))
	}
	return out, nil
}

// Authenticate checks token against volume id's and returns the volume. A
// wrong token and an unknown volume are the same 401, so that a token says
// nothing of other volumes.
func (s *Service) Authenticate(ctx context.Context, id, token string) (store.Volume, error) {
	if s == nil || s.backend == nil {
		return store.Volume{}, errdefs.New(errdefs.ErrNotImplemented, "volumes are not supported by this backend")
	}
	if token == "" {
		return store.Volume{}, errdefs.New(errdefs.ErrUnauthenticated, "missing volume token: Authorization: Bearer <token>")
	}
	unauth := errdefs.New(errdefs.ErrUnauthenticated, "invalid volume token")
	v, err := s.store.VolumeByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Volume{}, unauth
	}
	if err != nil {
		return store.Volume{}, err
	}
	// Compared as hashes so that the time taken says nothing about the
	// token, its length included.
	got, want := sha256.Sum256([]byte(token)), sha256.Sum256([]byte(v.Token))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return store.Volume{}, unauth
	}
	return v, nil
}

type authorizedKey struct{}

// WithAuthorized records in ctx that the request's token opened volume id.
func WithAuthorized(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, authorizedKey{}, id)
}

// Open returns the root of volume id's files, if ctx's token opened it
// (WithAuthorized); the caller closes it.
func (s *Service) Open(ctx context.Context, id string) (*os.Root, error) {
	if s == nil || s.backend == nil {
		return nil, errdefs.New(errdefs.ErrNotImplemented, "volumes are not supported by this backend")
	}
	if got, _ := ctx.Value(authorizedKey{}).(string); got == "" || got != id {
		return nil, errdefs.New(errdefs.ErrUnauthenticated, "invalid volume token")
	}
	root, err := s.backend.OpenVolume(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("open volume %s: %w", id, backendErr(err))
	}
	return root, nil
}

// Prune makes the records and the backend's volumes agree after a crash.
// It finishes the deletes a crash interrupted (records marked deleting:
// their files, if left, then the record; one the backend refuses as in use
// is listed again), and removes the backend's volumes that have no record
// (a crash between the backend's create and the record). sandboxd calls
// Prune once at start, after re-adopting its sandboxes (so the backend
// knows which volumes are mounted) and before serving.
func (s *Service) Prune(ctx context.Context) error {
	if s == nil || s.backend == nil {
		return nil
	}
	have, err := s.backend.Volumes(ctx)
	if err != nil {
		return fmt.Errorf("prune volumes: %w", err)
	}
	recs, err := s.store.ListVolumes(ctx, "")
	if err != nil {
		return fmt.Errorf("prune volumes: %w", err)
	}
	known := map[string]bool{}
	var errs []error
	for _, v := range recs {
		known[v.ID] = true
		if v.Deleting {
			errs = append(errs, s.finishDelete(ctx, v))
		}
	}
	for _, id := range have {
		if known[id] {
			continue
		}
		if err := s.backend.DeleteVolume(ctx, id); err != nil {
			errs = append(errs, err)
			continue
		}
		s.log.Info("volume pruned", "audit", true, "volume_id", id, "reason", "no record")
	}
	return errors.Join(errs...)
}

// finishDelete completes the delete of v, which a crash interrupted after
// its mark: its files (gone already if the crash came after them), then
// its record.
func (s *Service) finishDelete(ctx context.Context, v store.Volume) error {
	if err := s.backend.DeleteVolume(ctx, v.ID); err != nil {
		if !errors.Is(err, runtime.ErrInUse) {
			return fmt.Errorf("prune volume %s: %w", v.ID, err)
		}
		// A sandbox mounts it: the delete would have been refused, so it
		// is listed again, as after a refused delete.
		if err := s.store.UnmarkVolumeDeleting(ctx, v.Tenant, v.ID); err != nil {
			return fmt.Errorf("prune volume %s: %w", v.ID, err)
		}
		s.log.Info("volume delete undone", "audit", true, "tenant", v.Tenant, "volume_id", v.ID, "reason", "in use")
		return nil
	}
	if err := s.store.DeleteVolume(ctx, v.Tenant, v.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("prune volume %s: %w", v.ID, err)
	}
	s.log.Info("volume pruned", "audit", true, "tenant", v.Tenant, "volume_id", v.ID, "reason", "interrupted delete")
	return nil
}
