package files

import (
	"encoding/json"
	"errors"
	"fmt"
	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path/filepath"
	"strings"

	"github.com/sandboxd/sandboxd/envd/internal/metadata"
	"github.com/sandboxd/sandboxd/envd/internal/permissions"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// metadataHeaderPrefix marks upload headers that carry file metadata:
// `X-Metadata-<key>: <value>`, key lower-cased, as E2B's envd reads them.
const metadataHeaderPrefix = "X-Metadata-"

// entry is one written file in the upload response, E2B's EntryInfo subset
// the SDKs read from POST /files.
type entry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// upload serves POST /files?path=...&username=...
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	q, err := query(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := h.authorize(r, q, envdapi.OpWrite); err != nil {
		h.unauthorized(w, r, err)
		return
	}
	u, err := permissions.NamedUser(q.Get("username"), h.defaults)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	meta, err := metadataFromHeaders(r.Header)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
		mediaType = ""
	}
	body, err := decodedBody(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer body.Close()

	wr := newWriter(h.log, u, meta)
	var entries []entry
	// Files and directories are created with the user's rights, as a shell
	// of theirs would: no writing into /root or /etc as user.
	err = permissions.AsUser(u, func() (err error) {
		switch {
		case mediaType == "application/octet-stream":
			entries, err = h.uploadRaw(wr, q.Get("path"), body)
		case mediaType == "multipart/form-data" || mediaType == "multipart/mixed":
			entries, err = h.uploadMultipart(wr, q.Get("path"), params["boundary"], body)
		default:
			err = fmt.Errorf("%w: unsupported Content-Type %q, expected multipart/form-data or application/octet-stream",
				rpcerr.ErrInvalidArgument, r.Header.Get("Content-Type"))
		}
		return err
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(entries)
}

// uploadRaw stores an application/octet-stream body at path.
func (h *Handler) uploadRaw(wr *writer, path string, body io.Reader) ([]entry, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: path query parameter is required for an application/octet-stream upload",
			rpcerr.ErrInvalidArgument)
	}
	resolved, err := permissions.ResolvePath(path, wr.user, h.defaults.Workdir())
	if err != nil {
		return nil, err
	}
	src := &counter{r: body}
	written, err := wr.write(resolved, src)
	if err != nil {
		return nil, err
	}
	h.uploaded(resolved, wr.user, src.n)
	return []entry{h.entryFor(resolved, written)}, nil
}

// uploadMultipart stores every part named "file", one at a time straight
// from the body. Its target is the `path` query when given, else the part's
// filename verbatim: the SDKs put whole destination paths there.
func (h *Handler) uploadMultipart(wr *writer, path, boundary string, body io.Reader) ([]entry, error) {
	if boundary == "" {
		return nil, fmt.Errorf("%w: multipart Content-Type has no boundary", rpcerr.ErrInvalidArgument)
	}
	mr := multipart.NewReader(body, boundary)
	var entries []entry
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading multipart body: %v", rpcerr.ErrInvalidArgument, err)
		}
		resolved, isFile, err := h.partTarget(part, path, wr.user)
		if err == nil && isFile && seen[resolved] {
			err = fmt.Errorf("%w: cannot upload multiple files to the same path %q in one request; "+
				"the files before it were written", rpcerr.ErrInvalidArgument, resolved)
		}
		var written string
		src := &counter{r: part}
		if err == nil && isFile {
			seen[resolved] = true
			written, err = wr.write(resolved, src)
		}
		part.Close()
		if err != nil {
			return nil, err
		}
		if isFile {
			h.uploaded(resolved, wr.user, src.n)
			entries = append(entries, h.entryFor(resolved, written))
		}
	}
	if len(entries) == 0 {
		// The SDKs treat an empty result as an error; say why here.
		return nil, fmt.Errorf("%w: multipart body has no part named \"file\"", rpcerr.ErrInvalidArgument)
	}
	return entries, nil
}

// partTarget returns where a part goes, or isFile false for a part to skip.
// It parses Content-Disposition itself because Part.FileName strips
// directories from the filename.
func (h *Handler) partTarget(part *multipart.Part, path string, u *permissions.User) (resolved string, isFile bool, err error) {
	cd := part.Header.Get("Content-Disposition")
	if cd == "" {
		return "", false, nil
	}
	disposition, params, err := mime.ParseMediaType(cd)
	if err != nil {
		return "", false, fmt.Errorf("%w: part Content-Disposition %q: %v", rpcerr.ErrInvalidArgument, cd, err)
	}
	if disposition != "form-data" || params["name"] != "file" {
		return "", false, nil
	}
	if path == "" {
		path = params["filename"]
		if path == "" {
			return "", true, fmt.Errorf("%w: file part has no filename and no path query parameter was given",
				rpcerr.ErrInvalidArgument)
		}
	}
	resolved, err = permissions.ResolvePath(path, u, h.defaults.Workdir())
	return resolved, true, err
}

// entryFor describes the file written for path (at written, which differs
// when path is a symlink), with the metadata read back from disk so the
// response never claims more than was stored.
func (h *Handler) entryFor(path, written string) entry {
	e := entry{Path: path, Name: filepath.Base(path), Type: "file"}
	m, err := metadata.Read(written)
	if err != nil {
		h.log.Warn("reading back metadata of uploaded file", "path", written, "err", err)
	}
	if len(m) > 0 {
		e.Metadata = m
	}
	return e
}

// metadataFromHeaders collects `X-Metadata-<key>` headers (key lower-cased,
// first value wins) and validates them. nil means none.
func metadataFromHeaders(h http.Header) (map[string]string, error) {
	var m map[string]string
	for name, values := range h {
		if len(name) <= len(metadataHeaderPrefix) || len(values) == 0 ||
			!strings.EqualFold(name[:len(metadataHeaderPrefix)], metadataHeaderPrefix) {
			continue
		}
		if m == nil {
			m = map[string]string{}
		}
		m[strings.ToLower(name[len(metadataHeaderPrefix):])] = values[0]
	}
	if err := metadata.Validate(m); err != nil {
		return nil, err
	}
	return m, nil
}

// uploaded logs a file written by an upload; its contents never are.
func (h *Handler) uploaded(path string, u *permissions.User, size int64) {
	h.log.Info("file uploaded", "path", path, "user", u.Name, "size", size)
}

// counter counts the bytes read through it.
type counter struct {
	r io.Reader
	n int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
