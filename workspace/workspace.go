// Package workspace owns what a sandbox made of its filesystem as work to
// review and keep rather than throw away: its changes against its
// template (from the backend's writable layer), their diff and export,
// and their publication as the next version of a template (package
// template keeps versions; this package checks the caller and the
// sandbox, and finalizes).
package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/internal/udiff"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/template"
	"github.com/sandboxd/sandboxd/tenant"
)

// MaxDiffFile is the largest file whose lines a diff shows.
const MaxDiffFile = 1 << 20

// Config configures a Service.
type Config struct {
	Manager *sandbox.Manager
	// Differ is the backend's; nil answers every call with 501.
	Differ runtime.Differ
	// Templates keeps versions; nil answers Publish and Versions with 501.
	Templates *template.Service
	Log       *slog.Logger
}

// Service serves workspaces for the tenant in each call's context.
type Service struct {
	cfg Config
}

// New returns a Service.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Service{cfg: cfg}
}

// differ checks that sandbox id is the caller's and that the backend can
// tell its changes.
func (s *Service) differ(ctx context.Context, id string) (runtime.Differ, error) {
	if _, err := s.cfg.Manager.Get(ctx, id); err != nil {
		return nil, err
	}
	if s.cfg.Differ == nil {
		return nil, errdefs.New(errdefs.ErrNotImplemented, "this backend cannot tell a sandbox's changes")
	}
	return s.cfg.Differ, nil
}

// backendErr maps what the Differ says of a sandbox that went meanwhile.
func backendErr(id string, err error) error {
	if errors.Is(err, runtime.ErrNotFound) || errors.Is(err, runtime.ErrNotRunning) {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("sandbox %q not found", id))
	}
	return err
}

// ChangeList is what Changes reports.
type ChangeList struct {
	Changes []runtime.Change
	// WritersTruncated: the backend's record of which process wrote what
	// is incomplete (runtime.WriterTracker), so a change without a
	// Writer may have had one.
	WritersTruncated bool
}

// Changes lists what sandbox id changed, with their writers where the
// backend records them.
func (s *Service) Changes(ctx context.Context, id string) (ChangeList, error) {
	d, err := s.differ(ctx, id)
	if err != nil {
		return ChangeList{}, err
	}
	ch, err := d.Changes(ctx, id)
	if err != nil {
		return ChangeList{}, backendErr(id, err)
	}
	out := ChangeList{Changes: ch}
	if wt, ok := d.(runtime.WriterTracker); ok {
		// Asked after the changes: a record that filled up meanwhile
		// says so, erring on the side of "incomplete".
		if out.WritersTruncated, err = wt.WritersTruncated(ctx, id); err != nil {
			return ChangeList{}, backendErr(id, err)
		}
	}
	return out, nil
}

// Diff writes the changes to regular files as a git-style unified patch.
func (s *Service) Diff(ctx context.Context, id string, w io.Writer) error {
	d, err := s.differ(ctx, id)
	if err != nil {
		return err
	}
	changes, err := d.Changes(ctx, id)
	if err != nil {
		return backendErr(id, err)
	}
	for _, c := range changes {
		if c.Kind != runtime.ChangeDeleted && !c.Mode.IsRegular() {
			continue
		}
		old, cur, err := d.ReadChanged(ctx, id, c.Path)
		if err != nil {
			return backendErr(id, err)
		}
		if old == nil && cur == nil {
			continue // a deleted directory or special file
		}
		err = writeFileDiff(w, c.Path, c.Mode, old, cur)
		for _, r := range []io.ReadCloser{old, cur} {
			if r != nil {
				r.Close()
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readSmall reads r unless it holds more than MaxDiffFile bytes (big).
func readSmall(r io.Reader) (data []byte, big bool, err error) {
	if r == nil {
		return nil, false, nil
	}
	data, err = io.ReadAll(io.LimitReader(r, MaxDiffFile+1))
	return data, len(data) > MaxDiffFile, err
}

func isText(b []byte) bool {
	return !bytes.Contains(b[:min(len(b), 8000)], []byte{0}) && utf8.Valid(b)
}

// writeFileDiff writes one file's section: git's header, then its hunks,
// or a line saying why there are none.
func writeFileDiff(w io.Writer, path string, mode fs.FileMode, old, cur io.Reader) error {
	a, aBig, err := readSmall(old)
	if err != nil {
		return err
	}
	b, bBig, err := readSmall(cur)
	if err != nil {
		return err
	}
	rel := path[1:]
	aName, bName := "a/"+rel, "b/"+rel
	hdr := fmt.Sprintf("diff --git a/%s b/%s\n", rel, rel)
	switch {
	case old == nil:
		gitMode := "100644" // git records only whether a file is executable
		if mode&0o111 != 0 {
			gitMode = "100755"
		}
		hdr += "new file mode " + gitMode + "\n"
		aName = "/dev/null"
	case cur == nil:
		hdr += "deleted file mode 100644\n"
		bName = "/dev/null"
	}
	var body string
	switch {
	case aBig || bBig:
		body = fmt.Sprintf("# %s: larger than %d bytes, lines not shown\n", rel, MaxDiffFile)
	case !isText(a) || !isText(b):
		body = fmt.Sprintf("Binary files %s and %s differ\n", aName, bName)
	default:
		u, err := udiff.Unified(aName, bName, a, b)
		if errors.Is(err, udiff.ErrTooManyEdits) {
			body = fmt.Sprintf("# %s: more than %d lines changed, lines not shown\n", rel, udiff.MaxEdits)
		} else if err != nil {
			return err
		} else if u == "" {
			return nil // same bytes: a metadata change only
		} else {
			body = u
		}
	}
	_, err = io.WriteString(w, hdr+body)
	return err
}

// Export writes the changes as an OCI layer tar (runtime.Differ); with
// finalize, the sandbox is killed once all of it was written.
func (s *Service) Export(ctx context.Context, id string, w io.Writer, finalize bool) error {
	d, err := s.differ(ctx, id)
	if err != nil {
		return err
	}
	if err := d.ExportChanges(ctx, id, w); err != nil {
		return backendErr(id, err)
	}
	return s.finalize(ctx, id, finalize, "export")
}

// ExportPatch writes the changes as Diff does; with finalize, the sandbox
// is killed once all of it was written.
func (s *Service) ExportPatch(ctx context.Context, id string, w io.Writer, finalize bool) error {
	if err := s.Diff(ctx, id, w); err != nil {
		return err
	}
	return s.finalize(ctx, id, finalize, "export")
}

func (s *Service) finalize(ctx context.Context, id string, yes bool, after string) error {
	if !yes {
		return nil
	}
	if err := s.cfg.Manager.Kill(context.WithoutCancel(ctx), id); err != nil {
		return fmt.Errorf("finalize after %s: %w", after, err)
	}
	return nil
}

// Publish makes sandbox id's changes the next version of template target
// ("" for its own); see template.Service.Publish. With finalize, the
// sandbox is killed once the version is made.
func (s *Service) Publish(ctx context.Context, id, target string, finalize bool) (template.Version, error) {
	d, err := s.differ(ctx, id)
	if err != nil {
		return template.Version{}, err
	}
	if s.cfg.Templates == nil {
		return template.Version{}, errdefs.New(errdefs.ErrNotImplemented, "this server keeps no templates")
	}
	changes, err := d.Changes(ctx, id)
	if err != nil {
		return template.Version{}, backendErr(id, err)
	}
	t, _ := tenant.FromContext(ctx)
	v, err := s.cfg.Templates.Publish(ctx, s.cfg.Manager, t, id, target, changes)
	if err != nil {
		return template.Version{}, err
	}
	return v, s.finalize(ctx, id, finalize, "publish")
}

// Versions lists the versions of the template sandbox id runs, newest
// first, and the build it started from.
func (s *Service) Versions(ctx context.Context, id string) ([]template.Version, string, error) {
	sb, err := s.cfg.Manager.Get(ctx, id)
	if err != nil {
		return nil, "", err
	}
	if s.cfg.Templates == nil {
		return nil, "", errdefs.New(errdefs.ErrNotImplemented, "this server keeps no templates")
	}
	c, ok := s.cfg.Templates.Config(sb.Template)
	if !ok {
		return []template.Version{}, sb.Template, nil // a built-in template: no versions
	}
	t, _ := tenant.FromContext(ctx)
	vs, err := s.cfg.Templates.Versions(ctx, t, c.TemplateID)
	return vs, sb.Template, err
}
