package template

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/tenant"
)

var hashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

func validHash(h string) bool { return hashRE.MatchString(h) }

// uploadTTL is how long an upload link works.
const uploadTTL = time.Hour

// MaxUpload bounds one COPY step's archive.
const MaxUpload = 4 << 30

// UploadLink is the answer to an SDK asking where a COPY step's files go.
type UploadLink struct {
	Present bool
	URL     string
}

// filesPath is where tenant t's files of hash live.
func (s *Service) filesPath(t tenant.ID, hash string) string {
	return filepath.Join(s.cfg.Dir, "files", string(t), hash)
}

func (s *Service) openFiles(t tenant.ID, hash string) (*os.File, error) {
	if !validHash(hash) {
		return nil, os.ErrNotExist
	}
	return os.Open(s.filesPath(t, hash))
}

// Upload answers GET /templates/{id}/files/{hash}: whether the tenant's
// files of hash are here, and a signed link to PUT them to (on apiBase,
// the API's URL as the client reached it), which the SDK uses when they
// are not or when it forces the upload.
func (s *Service) Upload(ctx context.Context, t tenant.ID, ref, hash, apiBase string) (UploadLink, error) {
	if !validHash(hash) {
		return UploadLink{}, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("files hash %q is not a SHA-256 in lowercase hex", hash))
	}
	tpl, err := s.own(ctx, t, ref)
	if err != nil {
		return UploadLink{}, err
	}
	_, statErr := os.Stat(s.filesPath(t, hash))
	exp := strconv.FormatInt(s.cfg.Now().Add(uploadTTL).Unix(), 10)
	q := url.Values{"tenant": {string(t)}, "expires": {exp}, "signature": {s.sign(t, tpl.ID, hash, exp)}}
	u := strings.TrimRight(apiBase, "/") + "/templates/" + url.PathEscape(tpl.ID) + "/files/" + hash + "/upload?" + q.Encode()
	return UploadLink{Present: statErr == nil, URL: u}, nil
}

func (s *Service) sign(t tenant.ID, templateID, hash, exp string) string {
	m := hmac.New(sha256.New, s.cfg.UploadSecret)
	fmt.Fprintf(m, "upload\x00%s\x00%s\x00%s\x00%s", t, templateID, hash, exp)
	return hex.EncodeToString(m.Sum(nil))
}

// Receive stores the body of a PUT to an upload link: the link must be
// signed by this server and unexpired, and the body a tar archive
// (gzip-compressed or not) of at most MaxUpload bytes whose entries stay
// inside it. It is kept under its hash for the tenant's builds.
func (s *Service) Receive(ctx context.Context, templateID, hash string, q url.Values, body io.Reader) error {
	t := tenant.ID(q.Get("tenant"))
	exp := q.Get("expires")
	want := s.sign(t, templateID, hash, exp)
	if !validHash(hash) || !hmac.Equal([]byte(want), []byte(q.Get("signature"))) {
		return errdefs.New(errdefs.ErrPermissionDenied, "upload link is not valid")
	}
	if sec, err := strconv.ParseInt(exp, 10, 64); err != nil || s.cfg.Now().Unix() > sec {
		return errdefs.New(errdefs.ErrPermissionDenied, "upload link has expired")
	}
	if _, err := s.cfg.Store.GetTemplate(ctx, templateID); err != nil {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("template %q not found", templateID))
	}
	dir := filepath.Dir(s.filesPath(t, hash))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".upload-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	defer f.Close()
	n, err := io.Copy(f, io.LimitReader(body, MaxUpload+1))
	if err != nil {
		return fmt.Errorf("receive upload: %w", err)
	}
	if n > MaxUpload {
		return errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("upload exceeds %d bytes", int64(MaxUpload)))
	}
	if err := checkArchive(f); err != nil {
		return errdefs.New(errdefs.ErrInvalidArgument, "upload: "+err.Error())
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), s.filesPath(t, hash)); err != nil {
		return err
	}
	s.log.Info("template files uploaded", "tenant", t, "template_id", templateID, "hash", hash, "bytes", n)
	return nil
}

// checkArchive reads f through as a tar (gzip-compressed or not) and
// refuses entries that would land outside the directory it is unpacked in.
func checkArchive(f *os.File) error {
	gz, err := isGzip(f)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	var r io.Reader = f
	if gz {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return fmt.Errorf("not a gzip archive: %w", err)
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("not a tar archive: %w", err)
		}
		name := path.Clean(hdr.Name)
		if path.IsAbs(hdr.Name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("entry %q is outside the archive", hdr.Name)
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			return fmt.Errorf("not a tar archive: %w", err)
		}
	}
}
