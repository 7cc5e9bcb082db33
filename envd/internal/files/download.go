package files

import (
	"compress/gzip"
	"errors"
	"fmt"
	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// download serves GET (and HEAD) /files?path=...&username=...
func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	q, err := query(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := h.authorize(r, q, envdapi.OpRead); err != nil {
		h.unauthorized(w, r, err)
		return
	}
	path := q.Get("path")
	if path == "" {
		// An empty path would resolve to the default workdir, a directory;
		// say what is actually wrong.
		h.fail(w, r, fmt.Errorf("%w: path query parameter is required", rpcerr.ErrInvalidArgument))
		return
	}
	u, err := permissions.NamedUser(q.Get("username"), h.defaults)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	resolved, err := permissions.ResolvePath(path, u, h.defaults.Workdir())
	if err != nil {
		h.fail(w, r, err)
		return
	}

	// The file is looked up and opened with the user's rights (a shell of
	// theirs could not read /etc/shadow either); the open file is then
	// served from any thread.
	var fi fs.FileInfo
	var f *os.File
	err = permissions.AsUser(u, func() error {
		// Stat before opening: opening a FIFO would block until a writer shows up.
		var err error
		if fi, err = os.Stat(resolved); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				err = rpcerr.Kindf(rpcerr.ErrNotFound, "path '%s' does not exist", resolved)
			}
			return err
		}
		switch mode := fi.Mode(); {
		case mode.IsDir():
			return rpcerr.Kindf(rpcerr.ErrInvalidArgument, "path '%s' is a directory", resolved)
		case mode&(fs.ModeNamedPipe|fs.ModeSocket|fs.ModeIrregular) != 0:
			return fmt.Errorf("%w: path %q is not a regular file", rpcerr.ErrInvalidArgument, resolved)
		}
		f, err = os.Open(resolved)
		return err
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer f.Close()
	if r.Method == http.MethodGet {
		// The size on disk: a Range request or an early end sends less.
		h.log.Info("file downloaded", "path", resolved, "user", u.Name, "size", fi.Size())
	}

	coding, err := negotiateEncoding(r.Header)
	if err != nil {
		h.notAcceptable(w, r, err)
		return
	}
	// Range and conditional requests are answered by http.ServeContent on
	// the raw bytes (206, 304, 412); a gzip stream has no stable offsets.
	if r.Header.Get("Range") != "" || r.Header.Get("If-Range") != "" ||
		r.Header.Get("If-Modified-Since") != "" || r.Header.Get("If-None-Match") != "" ||
		r.Header.Get("If-Match") != "" || r.Header.Get("If-Unmodified-Since") != "" {
		if !identityAcceptable(r.Header) {
			h.notAcceptable(w, r, errors.New("identity encoding, required for Range and conditional requests, is not acceptable"))
			return
		}
		coding = codingIdentity
	}

	// An empty file goes out unencoded with Content-Length: 0, which
	// openapi-fetch (JS SDK) reads as "empty" without parsing a body. procfs
	// files also stat as empty; their gzip savings are not worth a rule.
	if fi.Mode().IsRegular() && fi.Size() == 0 && identityAcceptable(r.Header) {
		coding = codingIdentity
	}

	hdr := w.Header()
	// Caches must keep the gzip and identity variants apart.
	hdr.Set("Vary", "Accept-Encoding")
	name := filepath.Base(resolved)
	disposition := mime.FormatMediaType("inline", map[string]string{"filename": name})
	if disposition == "" {
		disposition = "inline"
	}
	hdr.Set("Content-Disposition", disposition)

	// Files that stat as empty may still have content (procfs, sysfs, and
	// character devices cannot report or seek to their size), so stream
	// them instead of letting ServeContent answer a 0-byte body or fail its
	// size probe. A truly empty file still ends up with Content-Length: 0.
	seekable := fi.Mode().IsRegular() && fi.Size() > 0
	if coding == codingIdentity && seekable {
		http.ServeContent(w, r, name, fi.ModTime(), f)
		return
	}

	if ct := contentType(name, f, seekable); ct != "" {
		hdr.Set("Content-Type", ct)
	}
	if !fi.ModTime().IsZero() {
		hdr.Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
	}
	if coding == codingGzip {
		hdr.Set("Content-Encoding", codingGzip)
	}
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	var dst io.Writer = w
	if coding == codingGzip {
		// BestSpeed: files are large and the link is fast, so compression
		// must not be what bounds a download.
		zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		defer func() {
			if err := zw.Close(); err != nil {
				h.log.Debug("gzip download ended early", "path", resolved, "err", err)
			}
		}()
		dst = zw
	}
	// Headers are out once the first byte is written; a failure now can only
	// cut the body short, which the client sees as a truncated transfer.
	if _, err := io.Copy(dst, f); err != nil {
		h.log.Debug("download ended early", "path", resolved, "err", err)
	}
}

// notAcceptable answers 406, which has no error kind of its own: it is a
// content-negotiation outcome, not a failure of the file operation.
func (h *Handler) notAcceptable(w http.ResponseWriter, r *http.Request, err error) {
	h.log.Debug("/files request not acceptable", "method", r.Method, "err", err)
	rpcerr.WriteJSON(w, http.StatusNotAcceptable, err.Error())
}

// contentType guesses a type the way http.ServeContent does (extension,
// then sniffing the first 512 bytes), for the responses it does not serve.
func contentType(name string, f *os.File, seekable bool) string {
	if ct := mime.TypeByExtension(filepath.Ext(name)); ct != "" {
		return ct
	}
	if !seekable {
		// Reading ahead would consume bytes a stream cannot give back.
		return "application/octet-stream"
	}
	var buf [512]byte
	n, _ := f.ReadAt(buf[:], 0)
	return http.DetectContentType(buf[:n])
}
