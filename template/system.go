package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/tenant"
)

// SystemTenant owns the templates sandboxd builds itself (EnsureSystem).
// They are public, so that every tenant resolves them by name; a tenant's
// own template of the same name still wins.
const SystemTenant = "sandboxd"

// SystemTemplate is a template sandboxd builds through its own builder and
// keeps current: a change of its spec or files is a new build.
type SystemTemplate struct {
	Name string
	Spec BuildSpec
	// Files are the archives (tar, gzip-compressed or not) COPY steps
	// name by FilesHash, the SHA-256 of the archive.
	Files              map[string][]byte
	CPUCount, MemoryMB int
}

// FilesHash is the hash a COPY step names archive by.
func FilesHash(archive []byte) string {
	sum := sha256.Sum256(archive)
	return hex.EncodeToString(sum[:])
}

// version is a tag naming exactly this spec and these files.
func (t SystemTemplate) version() string {
	raw, _ := json.Marshal(struct {
		Spec     BuildSpec
		Files    []string
		CPU, Mem int
	}{t.Spec, slices.Sorted(maps.Keys(t.Files)), t.CPUCount, t.MemoryMB})
	return "sbx-" + hashKey(string(raw))[:16]
}

// EnsureSystem makes sure system template t has a ready build of its
// current version, building it if not, and returns once that build is
// over. progress is called with a build's log lines as they come.
func (s *Service) EnsureSystem(ctx context.Context, t SystemTemplate, progress func(LogEntry)) (built bool, err error) {
	if _, err := s.cfg.Store.EnsureTenant(ctx, SystemTenant); err != nil {
		return false, fmt.Errorf("system tenant: %w", err)
	}
	owner := tenant.ID(SystemTenant)
	version := t.version()
	if tpl, err := s.cfg.Store.FindTemplate(ctx, owner, t.Name); err == nil && tpl.Tenant == owner {
		if build, err := s.taggedBuild(ctx, tpl, version); err == nil {
			if _, ok := s.Config(build); ok {
				return false, s.ensurePublic(ctx, tpl)
			}
		}
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	for hash, archive := range t.Files {
		if err := s.putFiles(owner, hash, archive); err != nil {
			return false, err
		}
	}
	req, err := s.Request(ctx, owner, t.Name, []string{DefaultTag, version}, t.CPUCount, t.MemoryMB)
	if err != nil {
		return false, err
	}
	if err := s.ensurePublic(ctx, req.Template); err != nil {
		return false, err
	}
	if err := s.StartBuild(ctx, owner, t.Name, req.BuildID, t.Spec); err != nil {
		return false, err
	}
	seen := 0
	for {
		b, ents, err := s.BuildInfo(ctx, owner, t.Name, req.BuildID)
		if err != nil {
			return false, err
		}
		if progress != nil {
			for _, e := range ents[min(seen, len(ents)):] {
				progress(e)
			}
		}
		seen = len(ents)
		switch b.Status {
		case store.BuildReady:
			return true, nil
		case store.BuildError:
			return false, fmt.Errorf("template %s: build %s failed at step %s: %s", t.Name, req.BuildID, b.ReasonStep, b.Reason)
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func (s *Service) ensurePublic(ctx context.Context, tpl store.Template) error {
	if tpl.Public {
		return nil
	}
	return s.cfg.Store.SetTemplatePublic(ctx, tpl.Tenant, tpl.ID, true, s.cfg.Now())
}

// putFiles stores archive as tenant t's files of hash, as an upload would.
func (s *Service) putFiles(t tenant.ID, hash string, archive []byte) error {
	if !validHash(hash) || FilesHash(archive) != hash {
		return fmt.Errorf("files %s: not the archive's SHA-256", hash)
	}
	p := s.filesPath(t, hash)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".upload-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(archive); err != nil {
		tmp.Close()
		return fmt.Errorf("files %s: %w", hash, err)
	}
	if err := checkArchive(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("files %s: %w", hash, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}
